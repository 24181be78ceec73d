"""Data at rest: KMS key rotation, SQS queue encryption, Secrets Manager secrets (the munge key) and EFS file systems
(the shared /home and slurmctld's state) under a customer managed key, EFS reachable over TLS only; a job queue
that takes messages from one role alone (a team's: the bridge reads the team from the queue)."""
from __future__ import annotations

from fnmatch import fnmatchcase

from policies.common import (UNKNOWN, Stack, as_list, aws_managed_key, flag, get, items, json_doc,
                             resource_policy, stack_policy)
from policies.tokens import EFS_FILE_SYSTEM, EFS_POLICY, KMS_KEY, SECRET, SQS_QUEUE, SQS_QUEUE_POLICY

# The client actions an EFS file system policy authorizes (mount, write, root); a TLS deny must cover all three.
EFS_CLIENT_ACTIONS = ("elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite",
                      "elasticfilesystem:ClientRootAccess")


def check_key_rotation(props: dict, ctx):
    spec = props.get("customerMasterKeySpec") or props.get("keySpec") or "SYMMETRIC_DEFAULT"
    if spec != "SYMMETRIC_DEFAULT" or props.get("enableKeyRotation") is UNKNOWN:
        return
    if flag(props.get("enableKeyRotation")) is not True:
        yield "symmetric KMS key without automatic rotation"


def check_queue_encrypted(props: dict, ctx):
    key, managed = props.get("kmsMasterKeyId"), props.get("sqsManagedSseEnabled")
    if key is UNKNOWN or managed is UNKNOWN or key:
        return
    if flag(managed) is False or managed is None:
        # SQS enables managed SSE by default only for queues created by the console; say it explicitly.
        yield "queue sets neither kmsMasterKeyId nor sqsManagedSseEnabled true"


def _key_gap(what: str, key) -> list[str]:
    if key is UNKNOWN:
        return []
    if not key:
        return [f"{what} uses the AWS managed key (kmsKeyId unset), not a customer managed key"]
    if aws_managed_key(key):
        return [f"{what} uses the AWS managed key {key}, not a customer managed key"]
    return []


def check_secret_cmk(props: dict, ctx):
    """The secret, and each replica of it, names a customer managed key (unset means aws/secretsmanager)."""
    yield from _key_gap("secret", props.get("kmsKeyId"))
    for replica in items(props.get("replicas")):
        yield from _key_gap(f"replica in {get(replica, 'region') or '?'}", get(replica, "kmsKeyId"))


def _anyone(statement: dict) -> bool:
    principal = statement.get("Principal")
    if isinstance(principal, dict):
        return "*" in as_list(principal.get("AWS"))
    return "*" in as_list(principal)


def _covers_client_actions(statement: dict) -> bool:
    actions = [a.lower() for a in as_list(statement.get("Action")) if isinstance(a, str)]
    return all(any(fnmatchcase(wanted.lower(), a) for a in actions) for wanted in EFS_CLIENT_ACTIONS)


def _insecure_transport(statement: dict) -> bool:
    condition = statement.get("Condition")
    if not isinstance(condition, dict):
        return False
    for op, pairs in condition.items():
        if not isinstance(pairs, dict) or op.lower() not in ("bool", "boolifexists"):
            continue
        for key, value in pairs.items():
            if key.lower() == "aws:securetransport" and [str(v).lower() for v in as_list(value)] == ["false"]:
                return True
    return False


def denies_insecure_transport(doc) -> bool:
    """A statement denies every principal all client actions when aws:SecureTransport is false."""
    if not isinstance(doc, dict):
        return False
    return any(isinstance(s, dict) and s.get("Effect") == "Deny" and _anyone(s) and _covers_client_actions(s)
               and _insecure_transport(s) for s in as_list(doc.get("Statement")))


_NO_TLS_DENY = ("denies no one mounting without TLS (a Deny of '*' or the elasticfilesystem client actions for "
                "Principal {AWS: '*'} when aws:SecureTransport is false)")


def check_efs(stack: Stack, ctx):
    """Every file system is encrypted under a customer managed key and has a TLS-only file system policy; every
    file system policy, whether or not its file system is in this stack, denies plain NFS."""
    for fs in stack.of(EFS_FILE_SYSTEM):
        encrypted = fs.props.get("encrypted")
        if encrypted is not UNKNOWN and flag(encrypted) is not True:
            yield f"file system '{fs.name}' is not encrypted at rest", fs.urn
        else:
            for gap in _key_gap("encryption", fs.props.get("kmsKeyId")):
                yield f"file system '{fs.name}': {gap}", fs.urn
        if not stack.referrers(fs, [EFS_POLICY], "fileSystemId"):
            yield (f"file system '{fs.name}' has no file system policy: clients may mount it without TLS"), fs.urn
    for attached in stack.of(EFS_POLICY):
        doc = json_doc(attached.props.get("policy"))
        if doc is not UNKNOWN and not denies_insecure_transport(doc):
            yield f"file system policy '{attached.name}' {_NO_TLS_DENY}", attached.urn


# The condition operators that can hold a Deny to "everyone but this principal".
_NOT_PRINCIPAL_OPERATORS = ("arnnotequals", "arnnotlike", "stringnotequals", "stringnotlike")


def _sends(statement: dict) -> bool:
    actions = [a.lower() for a in as_list(statement.get("Action")) if isinstance(a, str)]
    return any(fnmatchcase("sqs:sendmessage", a) for a in actions)


def _but_one_role(statement: dict) -> bool:
    """The statement's condition names the principals it spares by aws:PrincipalArn, each a role without a
    wildcard."""
    condition = statement.get("Condition")
    if not isinstance(condition, dict):
        return False
    for op, pairs in condition.items():
        if not isinstance(pairs, dict) or op.lower() not in _NOT_PRINCIPAL_OPERATORS:
            continue
        for key, value in pairs.items():
            arns = as_list(value)
            if key.lower() == "aws:principalarn" and arns and all(
                    isinstance(a, str) and ":role/" in a and "*" not in a and "?" not in a for a in arns):
                return True
    return False


def one_sender(doc) -> bool:
    """A statement denies sqs:SendMessage to every principal but named roles (aws:PrincipalArn)."""
    if not isinstance(doc, dict):
        return False
    return any(isinstance(s, dict) and s.get("Effect") == "Deny" and _anyone(s) and _sends(s) and _but_one_role(s)
               for s in as_list(doc.get("Statement")))


def check_job_queue_sender(stack: Stack, ctx):
    """Every job queue (an SQS queue that is no other queue's dead-letter target) has a queue policy that denies
    sqs:SendMessage to every principal but its team's submit role."""
    queues = stack.of(SQS_QUEUE)
    dead_letters = {urn for q in queues for urn in q.deps("redrivePolicy")}
    for queue in queues:
        if queue.urn in dead_letters:
            continue
        docs = [json_doc(p.props.get("policy")) for p in stack.referrers(queue, [SQS_QUEUE_POLICY], "queueUrl")]
        if UNKNOWN in docs or any(one_sender(doc) for doc in docs):
            continue
        yield (f"job queue '{queue.name}' takes messages from any principal the account lets send: a job's team "
               "(its Slurm account, its fair share and GPU limit) would be whatever a sender with sqs:SendMessage "
               "chooses"), queue.urn


POLICIES = [
    resource_policy(
        "aws-kms-key-rotation",
        "Symmetric customer-managed KMS keys rotate automatically.",
        types=[KMS_KEY], severity="medium", frameworks=["CIS", "HIPAA"], check=check_key_rotation,
        remediation="Set enableKeyRotation true (optionally rotationPeriodInDays) on the key."),
    resource_policy(
        "aws-sqs-queue-encrypted",
        "SQS queues encrypt messages at rest.",
        types=[SQS_QUEUE], severity="medium", frameworks=["HIPAA", "GDPR"], check=check_queue_encrypted,
        remediation="Set kmsMasterKeyId to the stack's KMS key (or sqsManagedSseEnabled true for non-regulated data)."),
    stack_policy(
        "aws-sqs-job-queue-one-sender",
        "Each job queue takes messages from its team's submit role alone.",
        severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_job_queue_sender,
        remediation="Give each team its queue (infra.aws.queue) and an aws.sqs.QueuePolicy with a statement Deny, "
                    "Principal '*', Action sqs:SendMessage, Condition ArnNotEquals aws:PrincipalArn the team's "
                    "submit role ARN; grant the team's members sts:AssumeRole on that role."),
    resource_policy(
        "aws-secretsmanager-secret-cmk",
        "Secrets Manager secrets (the munge key among them) are encrypted with a customer managed KMS key.",
        types=[SECRET], severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_secret_cmk,
        remediation="Set kmsKeyId to the stack's KMS key on the secret and on each of its replicas. Without it "
                    "Secrets Manager uses aws/secretsmanager, whose key policy lets any principal of the account "
                    "that may read the secret decrypt it; the stack key's policy and kms:Decrypt are a second gate."),
    stack_policy(
        "aws-efs-filesystem-cmk-tls-only",
        "EFS file systems are encrypted with a customer managed KMS key and their policy denies connections "
        "without TLS.",
        severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_efs,
        remediation="Set encrypted true and kmsKeyId to the stack's key on the file system, and give it an "
                    "aws.efs.FileSystemPolicy with a statement Deny, Principal {AWS: '*'}, Action '*', Condition "
                    "Bool aws:SecureTransport 'false' (mount with amazon-efs-utils' tls option)."),
]
