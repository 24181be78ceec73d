"""IAM, KMS, S3, SQS and SNS policy documents of the AWS stack: pure functions of ARNs and names.

The node and controller policies are least privilege: every action is named (no `*`, no `service:*`), scoped to
this stack's bucket, key, queue, secret, launch templates and log group; `Resource: "*"` is used only for Describe
calls that IAM cannot scope and for PutMetricData, which is held to the stack's metric namespace by a
`cloudwatch:namespace` condition. Instances the controller may launch, name and terminate carry the stack's tag. The flow log role can only write into the flow
log group, and only VPC Flow Logs of this account can assume it. The VPC endpoints pass only this
account's principals acting on this account's resources, and the S3 gateway endpoint only the
buckets the nodes use.

Node and controller credentials work only on their instance: each role carries AWS's data-perimeter Deny for
EC2 role credentials (`stay_on_instance`), which refuses a request signed with them unless it comes from the
instance's own VPC and private address through a VPC endpoint, or from an AWS service acting for them. Every
service the two roles call directly therefore has an endpoint in the stack's VPC (infra.aws.network).
"""
from __future__ import annotations

from trainer.jobs.layout import TEAMS, team_prefix

MIN_TLS_VERSION = "1.2"


def partition(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def dns_suffix(region: str) -> str:
    """The domain of a region's service endpoints and service principals (kms:ViaService names them)."""
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def _doc(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def _deny_insecure_transport(action: str, resources: list[str]) -> dict:
    return {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": action,
            "Resource": resources, "Condition": {"Bool": {"aws:SecureTransport": "false"}}}


def assume_role_ec2() -> dict:
    return _doc({"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"})


def assume_role_lambda() -> dict:
    return _doc({"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"})


# A job role session's name: the node's credentials daemon names each session after its job
# (trainer.clouds.aws_credentials.SESSION_PREFIX); the job role's trust admits no other.
JOB_SESSION_PATTERN = "gpufleet-*"


def assume_role_job(node_role_arn: str) -> dict:
    """The job role: only the stack's node role may assume it (its root credentials daemon, for one job at a
    time), and only under a session name of the daemon's."""
    return _doc({"Effect": "Allow", "Principal": {"AWS": node_role_arn}, "Action": "sts:AssumeRole",
                 "Condition": {"StringLike": {"sts:RoleSessionName": JOB_SESSION_PATTERN}}})


def chat_forwarder_policy(log_group_arn: str) -> dict:
    """The chat forwarder writes its own log group and nothing else (it calls no AWS API)."""
    return _doc({"Sid": "WriteOwnLogs", "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                 "Resource": [log_group_arn, f"{log_group_arn}:*"]})


def log_group_arn(region: str, account_id: str, name: str) -> str:
    return f"arn:{partition(region)}:logs:{region}:{account_id}:log-group:{name}"


# What a principal that launches instances with EBS volumes encrypted by a customer managed key needs of that
# key (EC2 user guide, "Amazon EBS encryption": the caller's permissions are used), `kms:ReEncrypt*` and
# `kms:GenerateDataKey*` spelled out as the symmetric-key actions they stand for; held to calls EC2 makes.
EBS_KEY_ACTIONS = ("kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKeyWithoutPlaintext",
                   "kms:DescribeKey")


def key_policy(account_id: str, region: str, log_group_names: list[str]) -> dict:
    """The stack's KMS key: account administration (which lets the stack's IAM roles use it as their own
    policies say), CloudWatch Logs for the stack's log groups only, and CloudWatch alarms and AWS Budgets
    publishing to the encrypted alert topic."""
    part = partition(region)
    log_group_arns = [log_group_arn(region, account_id, name) for name in log_group_names]
    return _doc(
        {"Sid": "AccountAdministration", "Effect": "Allow",
         "Principal": {"AWS": f"arn:{part}:iam::{account_id}:root"}, "Action": "kms:*", "Resource": "*"},
        {"Sid": "CloudWatchLogsForStackLogGroups", "Effect": "Allow",
         "Principal": {"Service": f"logs.{region}.amazonaws.com"},
         "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo",
                    "kms:GenerateDataKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:DescribeKey"],
         "Resource": "*",
         "Condition": {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": log_group_arns}}},
        {"Sid": "AlertTopicPublishers", "Effect": "Allow",
         "Principal": {"Service": ["cloudwatch.amazonaws.com", "budgets.amazonaws.com"]},
         "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": "*",
         "Condition": {"StringEquals": {"aws:SourceAccount": account_id}}},
    )


def bucket_policy(bucket_arn: str) -> dict:
    """Deny any request without TLS, and any over TLS below 1.2."""
    resources = [bucket_arn, f"{bucket_arn}/*"]
    return _doc(
        _deny_insecure_transport("s3:*", resources),
        {"Sid": "DenyTlsBelow12", "Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": resources,
         "Condition": {"NumericLessThan": {"s3:TlsVersion": MIN_TLS_VERSION}}},
    )


def log_bucket_policy(log_bucket_arn: str, source_bucket_arn: str, account_id: str) -> dict:
    """The access-log bucket: S3 log delivery for the data bucket only, plus the TLS denies."""
    doc = bucket_policy(log_bucket_arn)
    doc["Statement"].append(
        {"Sid": "S3ServerAccessLogDelivery", "Effect": "Allow", "Principal": {"Service": "logging.s3.amazonaws.com"},
         "Action": "s3:PutObject", "Resource": f"{log_bucket_arn}/*",
         "Condition": {"ArnLike": {"aws:SourceArn": source_bucket_arn},
                       "StringEquals": {"aws:SourceAccount": account_id}}})
    return doc


def queue_policy(queue_arn: str, sender_role_arn: str | None = None) -> dict:
    """TLS only; a team's job queue (``sender_role_arn``: the team's submit role) takes messages from that role
    alone, whatever rights any other principal of the account holds: the queue a message came through is its
    team (trainer.slurm.bridge). ``aws:PrincipalArn`` of a role's session is the role's ARN."""
    doc = _doc(_deny_insecure_transport("sqs:*", [queue_arn]))
    if sender_role_arn is not None:
        doc["Statement"].append(
            {"Sid": "OnlyTheTeamSends", "Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage",
             "Resource": queue_arn, "Condition": {"ArnNotEquals": {"aws:PrincipalArn": sender_role_arn}}})
    return doc


def assume_role_account(account_id: str, region: str) -> dict:
    """A team's submit role: principals of this account whose own policies let them assume it (the account's
    administrators decide who is in the team), with MFA where they sign in with it."""
    return _doc({"Effect": "Allow", "Principal": {"AWS": f"arn:{partition(region)}:iam::{account_id}:root"},
                 "Action": "sts:AssumeRole"})


# The bucket holds each team's things under its own prefix (trainer.jobs.layout): teams/<team>/jobs/<job_id>/
# (record, checkpoints, log chunks), teams/<team>/jobs-index/ (the records' index), teams/<team>/code/
# (content-addressed code bundles) and teams/<team>/data/ (the team's data sets).
ANY_TEAM = f"{TEAMS}*/"  # every team's prefix, as an IAM resource pattern

# What a team's submit role writes under its team's prefix: records and cancels (trainer.jobs.records) and
# content-addressed code bundles (trainer.jobs.bundle.PREFIX); it reads the records' index and the jobs' logs.
SUBMIT_WRITES = ("jobs/", "code/")
SUBMIT_READS = ("jobs/", "jobs-index/", "code/")


def submit_policy(bucket_arn: str, key_arn: str, queue_arn: str, dlq_arn: str, region: str, team: str) -> dict:
    """A team's submit role (`gpufleet jobs`): send to the team's queue only (its queue's policy lets no one
    else), take its own dead letters back (`jobs retry`), keep records and bundles under its team's prefix and
    list only there. No other team's queue or objects, no node, no instance, no role to pass."""
    own = f"{bucket_arn}/{team_prefix(team)}"
    return _doc(
        {"Sid": "SendToTeamQueue", "Effect": "Allow",
         "Action": ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"], "Resource": queue_arn},
        {"Sid": "TeamDeadLetters", "Effect": "Allow",
         "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueUrl",
                    "sqs:GetQueueAttributes"], "Resource": dlq_arn},
        {"Sid": "ListTeamPrefix", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn,
         "Condition": {"StringLike": {"s3:prefix": f"{team_prefix(team)}*"}}},
        {"Sid": "BucketLocation", "Effect": "Allow", "Action": "s3:GetBucketLocation", "Resource": bucket_arn},
        {"Sid": "ReadRecordsAndLogs", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [f"{own}{prefix}*" for prefix in SUBMIT_READS]},
        {"Sid": "WriteRecordsAndBundles", "Effect": "Allow", "Action": "s3:PutObject",
         "Resource": [f"{own}{prefix}*" for prefix in SUBMIT_WRITES]},
        {"Sid": "UseStackKeyThroughS3AndSqs", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
         "Resource": key_arn, "Condition": {"StringEquals": {"kms:ViaService": [
             f"{name}.{region}.{dns_suffix(region)}" for name in ("s3", "sqs")]}}},
    )


def topic_policy(topic_arn: str, account_id: str) -> dict:
    """The alert topic: CloudWatch alarms and AWS Budgets of this account publish; TLS only."""
    return _doc(
        {"Sid": "AlarmAndBudgetPublish", "Effect": "Allow",
         "Principal": {"Service": ["cloudwatch.amazonaws.com", "budgets.amazonaws.com"]},
         "Action": "sns:Publish", "Resource": topic_arn,
         "Condition": {"StringEquals": {"aws:SourceAccount": account_id}}},
        _deny_insecure_transport("sns:Publish", [topic_arn]),
    )


def assume_role_flow_logs(region: str, account_id: str) -> dict:
    """Only VPC Flow Logs, acting for flow logs of this account, may assume the delivery role."""
    return _doc(
        {"Effect": "Allow", "Principal": {"Service": "vpc-flow-logs.amazonaws.com"}, "Action": "sts:AssumeRole",
         "Condition": {"StringEquals": {"aws:SourceAccount": account_id},
                       "ArnLike": {"aws:SourceArn": f"arn:{partition(region)}:ec2:{region}:{account_id}:vpc-flow-log/*"}}})


def flow_log_delivery_policy(log_group_arn: str) -> dict:
    """Write flow log records into one log group (its streams are `<log group ARN>:log-stream:<eni>`)."""
    return _doc(
        {"Sid": "DeliverFlowLogs", "Effect": "Allow",
         "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
         "Resource": [log_group_arn, f"{log_group_arn}:*"]})


def _logs_and_metrics(log_group_arn: str, metric_namespace: str) -> list[dict]:
    """Ship logs into the stack's log group; publish metrics in its namespace only."""
    return [
        {"Sid": "ShipLogs", "Effect": "Allow",
         "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
         "Resource": [log_group_arn, f"{log_group_arn}:*"]},
        {"Sid": "PublishStackMetrics", "Effect": "Allow", "Action": "cloudwatch:PutMetricData", "Resource": "*",
         "Condition": {"StringEquals": {"cloudwatch:namespace": metric_namespace}}},
    ]


# What SSM Session Manager needs of an instance (AWS's minimum for Session Manager), in place of the managed
# AmazonSSMManagedInstanceCore, which also reads every SSM parameter and document of the account. None of these
# actions has resource-level permissions; the condition holds them to instances of the stack's VPC.
SESSION_MANAGER = ("ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel",
                   "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel", "ssmmessages:OpenDataChannel")


def session_manager(vpc_id: str) -> dict:
    """Shell access through Session Manager, from instances in the stack's VPC only."""
    return {"Sid": "SessionManager", "Effect": "Allow", "Action": list(SESSION_MANAGER), "Resource": "*",
            "Condition": {"StringEquals": {"aws:ec2InstanceSourceVPC": vpc_id}}}


def stay_on_instance() -> list[dict]:
    """AWS's data-perimeter Deny for EC2 role credentials (AWS Security Blog, "How to use policies to restrict
    where EC2 instance credentials can be used from", 2023): a request signed with the credentials of an instance
    (ec2:SourceInstanceARN is set) fails unless it comes through a VPC endpoint of the instance's own VPC
    (aws:SourceVpc) from the instance's own primary private address (aws:VpcSourceIp). Calls an AWS service makes
    for the role (S3 using the key, EC2 encrypting a node's volume) are not held to it (aws:ViaAWSService)."""
    def deny(sid: str, key: str, variable: str) -> dict:
        return {"Sid": sid, "Effect": "Deny", "Action": "*", "Resource": "*",
                "Condition": {"StringNotEquals": {key: variable}, "Null": {"ec2:SourceInstanceARN": "false"},
                              "BoolIfExists": {"aws:ViaAWSService": "false"}}}

    return [deny("CredentialsOnlyFromOwnVpc", "aws:ec2InstanceSourceVPC", "${aws:SourceVpc}"),
            deny("CredentialsOnlyFromOwnAddress", "aws:ec2InstanceSourcePrivateIPv4", "${aws:VpcSourceIp}")]


# Where a node writes in the bucket (trainer/), for any team: each job's record, checkpoints and log chunks under
# teams/<team>/jobs/<job_id>/ (trainer.jobs.records.record_key, trainer.jobs.layout.job_uri,
# trainer.jobs.logs.prefix) and the team's record index (trainer.jobs.records.INDEX_PREFIX). Everything else,
# code bundles under teams/<team>/code/ (content-addressed: trainer.jobs.bundle.PREFIX) and data, a node only reads.
NODE_WRITES = (f"{ANY_TEAM}jobs/", f"{ANY_TEAM}jobs-index/")
NODE_DELETES = (f"{ANY_TEAM}jobs/",)   # checkpoint rotation; index shards are rewritten, never deleted


def node_policy(bucket_arn: str, key_arn: str, log_group_arn: str, parameters_arn: str, munge_secret_arn: str,
                vpc_id: str, metric_namespace: str, job_role_arn: str) -> dict:
    """What a GPU node (slurmd's jobs through the per-node task, its setup, preflight, log shipping) may do, and
    nothing more: no queue, no other node, no instance of its own to launch; in the bucket it reads everything
    and writes only under `NODE_WRITES`, so no job can replace a code bundle or a data set. It may assume the
    stack's job role and no other role: its credentials daemon hands each job that role, narrowed to the job."""
    return _doc(
        {"Sid": "ListCheckpointBucket", "Effect": "Allow",
         "Action": ["s3:ListBucket", "s3:GetBucketLocation"], "Resource": bucket_arn},
        {"Sid": "ReadBucket", "Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{bucket_arn}/*"},
        {"Sid": "WriteJobPrefixes", "Effect": "Allow",
         "Action": ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
         "Resource": [f"{bucket_arn}/{prefix}*" for prefix in NODE_WRITES]},
        {"Sid": "DeleteJobObjects", "Effect": "Allow", "Action": "s3:DeleteObject",
         "Resource": [f"{bucket_arn}/{prefix}*" for prefix in NODE_DELETES]},
        {"Sid": "UseStackKey", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
         "Resource": key_arn},
        # the secrets a job's env names ({"ssm": NAME}), under the stack's path only
        {"Sid": "ReadJobSecrets", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": parameters_arn},
        # the cluster's munge key, which the controller stores: read only
        {"Sid": "ReadMungeKey", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
         "Resource": munge_secret_arn},
        *_logs_and_metrics(log_group_arn, metric_namespace),
        # The node's Slurm name is its gpufleet-slurm-node tag (the controller sets it); the CloudWatch agent
        # resolves its dimensions from the tags too (as AWS's CloudWatchAgentServerPolicy allows). DescribeTags
        # has no resource-level permissions.
        {"Sid": "ReadOwnTags", "Effect": "Allow", "Action": "ec2:DescribeTags", "Resource": "*"},
        {"Sid": "AssumeJobRole", "Effect": "Allow", "Action": "sts:AssumeRole", "Resource": job_role_arn},
        session_manager(vpc_id),
        *stay_on_instance(),
    )


# What a job does in the bucket under its own prefix (teams/<team>/jobs/<job_id>/: record, checkpoints, log
# chunks, rotation), and the prefixes it only reads: content-addressed code bundles (trainer.jobs.bundle.PREFIX)
# and data sets. The role names any team's; a job's session policy narrows them to its job and its team's.
JOB_OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                      "s3:ListMultipartUploadParts")
JOB_PREFIX = f"{ANY_TEAM}jobs/"
JOB_READS = (f"{ANY_TEAM}code/", f"{ANY_TEAM}data/")


def job_role_policy(bucket_arn: str, key_arn: str, parameters_arn: str, vpc_id: str, region: str) -> dict:
    """The job role: the ceiling of every job's rights. The node's credentials daemon assumes it with a session
    policy naming one job's `teams/<team>/jobs/<id>/` and its team's code and data (trainer.clouds.aws_credentials),
    and STS grants the intersection, so a job reaches its own prefix only, never another job's or another team's;
    nothing of the node role (munge key, logs, tags) reaches a job. No write to `teams/<team>/jobs-index/`: a shard
    holds many jobs' entries, and the bridge keeps the index. It lists only under those prefixes.

    The stack key is used only through S3 and SSM (kms:ViaService): objects and SecureString secrets, no bare
    Decrypt. The Deny holds the credentials to the stack's VPC: a request that comes through one of its
    endpoints carries aws:SourceVpc; one that bypasses them (the credentials copied off the node, to a laptop or
    another VPC) carries none, and `StringNotEqualsIfExists` makes the absent key a match, so that request is
    denied too. What an AWS service does for the job (S3 asking KMS for a data key) comes from no VPC and is
    exempt (`BoolIfExists aws:ViaAWSService`), as in `stay_on_instance`."""
    services = [f"{name}.{region}.{dns_suffix(region)}" for name in ("s3", "ssm")]
    return _doc(
        {"Sid": "OwnJobObjects", "Effect": "Allow", "Action": list(JOB_OBJECT_ACTIONS),
         "Resource": f"{bucket_arn}/{JOB_PREFIX}*"},
        {"Sid": "ReadCodeAndData", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [f"{bucket_arn}/{prefix}*" for prefix in JOB_READS]},
        {"Sid": "ListJobAndTeamPrefixes", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn,
         "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*" for prefix in (JOB_PREFIX, *JOB_READS)]}}},
        {"Sid": "BucketLocation", "Effect": "Allow", "Action": "s3:GetBucketLocation", "Resource": bucket_arn},
        {"Sid": "UseStackKeyThroughS3AndSsm", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
         "Resource": key_arn, "Condition": {"StringEquals": {"kms:ViaService": services}}},
        {"Sid": "ReadJobSecrets", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": parameters_arn},
        {"Sid": "OnlyThroughStackVpc", "Effect": "Deny", "Action": "*", "Resource": "*",
         "Condition": {"StringNotEqualsIfExists": {"aws:SourceVpc": vpc_id},
                       "BoolIfExists": {"aws:ViaAWSService": "false"}}},
    )


NODE_NAME_TAG = "gpufleet-slurm-node"
STACK_TAG = "gpufleet-stack"
# What a node's launch creates from a launch template: each must come from one of the stack's templates.
LAUNCHED = ("instance", "volume", "network-interface", "spot-instances-request")


def controller_policy(region: str, account_id: str, stack: str, bucket_arn: str, key_arn: str,
                      queue_arns: list[str], dlq_arns: list[str], log_group_arn: str, munge_secret_arn: str, node_role_arn: str,
                      launch_template_arns: list[str], subnet_arns: list[str], security_group_arns: list[str],
                      image_arns: list[str], placement_group_arns: list[str], metric_namespace: str,
                      vpc_id: str) -> dict:
    """What the controller (slurmctld's power saving, the bridge) may do: launch nodes only from the stack's
    launch templates, into its subnets and security group, tagged with the stack, passing only the node role;
    name and terminate only instances carrying the stack's tag; consume the teams' job queues; keep the records and logs in
    the bucket; create and read the munge key. Nothing in another stack or account."""
    part = partition(region)
    ec2 = f"arn:{part}:ec2:{region}:{account_id}"
    from_templates = {"ArnEquals": {"ec2:LaunchTemplate": launch_template_arns}}
    this_stack = {"StringEquals": {f"aws:RequestTag/{STACK_TAG}": stack}}
    return _doc(
        {"Sid": "LaunchNodesTagged", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": f"{ec2}:instance/*", "Condition": {**from_templates, **this_stack}},
        {"Sid": "LaunchNodeParts", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": [f"{ec2}:{kind}/*" for kind in LAUNCHED[1:]], "Condition": from_templates},
        {"Sid": "LaunchFromStackResources", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": [*launch_template_arns, *subnet_arns, *security_group_arns, *image_arns,
                      *placement_group_arns]},
        {"Sid": "CreateFleetRequests", "Effect": "Allow", "Action": "ec2:CreateFleet",
         "Resource": f"{ec2}:fleet/*"},
        {"Sid": "TagOnLaunch", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": [f"{ec2}:{kind}/*" for kind in (*LAUNCHED, "fleet")],
         "Condition": {"StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateFleet"]}}},
        # a launched node gets its Slurm name (and a Name); no other tag, so the stack tag cannot be changed
        {"Sid": "NameStackNodes", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": f"{ec2}:instance/*",
         "Condition": {"StringEquals": {f"ec2:ResourceTag/{STACK_TAG}": stack},
                       "ForAllValues:StringEquals": {"aws:TagKeys": [NODE_NAME_TAG, "Name"]}}},
        {"Sid": "TerminateStackNodes", "Effect": "Allow", "Action": "ec2:TerminateInstances",
         "Resource": f"{ec2}:instance/*", "Condition": {"StringEquals": {f"ec2:ResourceTag/{STACK_TAG}": stack}}},
        {"Sid": "PassNodeRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": node_role_arn,
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
        # Spot capacity needs EC2's spot service-linked role, which EC2 makes on the first spot launch of an account
        {"Sid": "SpotServiceRole", "Effect": "Allow", "Action": "iam:CreateServiceLinkedRole",
         "Resource": f"arn:{part}:iam::{account_id}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot",
         "Condition": {"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}}},
        # The nodes' volumes are encrypted with the stack key: EC2 uses it with the launching principal's rights
        {"Sid": "EncryptNodeVolumes", "Effect": "Allow", "Action": list(EBS_KEY_ACTIONS), "Resource": key_arn,
         "Condition": {"StringEquals": {"kms:ViaService": f"ec2.{region}.amazonaws.com"}}},
        {"Sid": "EncryptNodeVolumeGrants", "Effect": "Allow", "Action": "kms:CreateGrant", "Resource": key_arn,
         "Condition": {"StringEquals": {"kms:ViaService": f"ec2.{region}.amazonaws.com"},
                       "Bool": {"kms:GrantIsForAWSResource": True}}},
        {"Sid": "DescribeNodes", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:DescribeTags"], "Resource": "*"},
        # each team's queue: taken, never sent to (only the team's submit role sends: policies.queue_policy)
        {"Sid": "ConsumeJobQueue", "Effect": "Allow",
         "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility",
                    "sqs:GetQueueAttributes", "sqs:GetQueueUrl"],
         "Resource": queue_arns},
        {"Sid": "DeadLetterJobs", "Effect": "Allow", "Action": ["sqs:GetQueueUrl", "sqs:SendMessage"],
         "Resource": dlq_arns},
        {"Sid": "ListJobRecords", "Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
         "Resource": bucket_arn},
        {"Sid": "ReadWriteJobRecords", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": f"{bucket_arn}/*"},
        {"Sid": "UseStackKey", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
         "Resource": key_arn},
        # the controller makes the cluster's munge key at its first boot and reads it after
        {"Sid": "KeepMungeKey", "Effect": "Allow",
         "Action": ["secretsmanager:GetSecretValue", "secretsmanager:PutSecretValue"],
         "Resource": munge_secret_arn},
        *_logs_and_metrics(log_group_arn, metric_namespace),
        session_manager(vpc_id),
        *stay_on_instance(),
    )


def shared_fs_policy(fs_arn: str, home_access_point_arn: str, state_access_point_arn: str, node_role_arn: str,
                     controller_role_arn: str) -> dict:
    """The shared file system: TLS only; nodes mount /home through its access point, as themselves (no root);
    the controller mounts /home as root (it makes users' directories) and slurmctld's state."""
    def through(*access_points: str) -> dict:
        return {"StringEquals": {"elasticfilesystem:AccessPointArn": list(access_points)}}

    return _doc(
        {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "*",
         "Resource": fs_arn, "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        {"Sid": "NodesMountHome", "Effect": "Allow", "Principal": {"AWS": node_role_arn},
         "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"], "Resource": fs_arn,
         "Condition": through(home_access_point_arn)},
        {"Sid": "ControllerMountsHomeAndState", "Effect": "Allow", "Principal": {"AWS": controller_role_arn},
         "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"], "Resource": fs_arn,
         "Condition": through(home_access_point_arn, state_access_point_arn)},
        {"Sid": "ControllerRootOnHome", "Effect": "Allow", "Principal": {"AWS": controller_role_arn},
         "Action": "elasticfilesystem:ClientRootAccess", "Resource": fs_arn,
         "Condition": through(home_access_point_arn)},
    )


def _this_account(account_id: str) -> dict:
    return {"StringEquals": {"aws:PrincipalAccount": account_id, "aws:ResourceAccount": account_id}}


def interface_endpoint_policy(account_id: str) -> dict:
    """An interface endpoint (SQS, SSM, Logs, CloudWatch, ...) carries only requests signed by this
    account's principals for this account's resources: no foreign credentials in, no data out to a
    foreign account's queue or log group (the pattern of AWS's data-perimeter examples)."""
    return _doc({"Sid": "ThisAccountOnly", "Effect": "Allow", "Principal": "*", "Action": "*", "Resource": "*",
                 "Condition": _this_account(account_id)})


def s3_endpoint_policy(account_id: str, bucket_arns: list[str], aws_owned_reads: list[str] = ()) -> dict:
    """The S3 gateway endpoint reaches only the named buckets of this account, for this account's principals,
    and reads (GetObject only) from the AWS-owned buckets named one by one in ``aws_owned_reads``.

    The one AWS-owned bucket the nodes need is ECR's layer bucket `prod-<region>-starport-layer-bucket`
    (image layers; infra.aws.registry.layer_bucket_arn). They boot from a baked image, and Session Manager
    uses none (SSM Agent's buckets serve patching, Distributor and agent self-updates, which the stack does
    not use)."""
    resources = [r for arn in bucket_arns for r in (arn, f"{arn}/*")]
    statements = [{"Sid": "StackBuckets", "Effect": "Allow", "Principal": "*", "Action": "s3:*",
                   "Resource": resources, "Condition": _this_account(account_id)}]
    if aws_owned_reads:
        statements.append({"Sid": "AwsOwnedReads", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                           "Resource": [f"{arn}/*" for arn in aws_owned_reads],
                           "Condition": {"StringEquals": {"aws:PrincipalAccount": account_id}}})
    return _doc(*statements)


def parameters_arn(region: str, account_id: str, path: str) -> str:
    """ARN pattern of the SSM parameters below ``path`` (``/gpufleet/<stack>/``)."""
    return f"arn:{partition(region)}:ssm:{region}:{account_id}:parameter/{path.strip('/')}/*"
