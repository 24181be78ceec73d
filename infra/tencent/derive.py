"""Pure derivations for the Tencent stack: names, the network's layout and addresses, CAM and bucket policy
documents, security group rules, queue settings, alarm rules, and the settings the controller and the nodes boot
with (node.json, controller.json, nodes.json). No Pulumi here; the components turn these into resources.

Policy documents use CAM's language (version 2.0, lower-case elements, six-segment ``qcs::`` resources; tag
conditions ``for_any_value:string_equal`` on the global keys ``qcs:resource_tag`` / ``qcs:request_tag`` with
``key&value`` values, Tencent's CAM "condition keys" page, tencentcloud.com/document/product/598/58421).
Resources are named one by one: the bucket, the stack key, the queues, the log topic, the munge key's secret, the
node role, the subnets, security group, VPC and image nodes launch with. Two CVM actions cannot be held to named
instances: RunInstances creates them (held instead to this stack's subnets, security group and image and to
requests that tag the machine with the stack), and DescribeInstances reads (``instance/*`` of the region).
TerminateInstances is held to instances carrying the stack's tag (``qcs:resource_tag``). CAM has no resource
type for launch templates (CVM's authorizable resources are instances, images, key pairs and security groups,
tencentcloud.com/document/product/213/10314), so "from the stack's templates" is what those launch resources say.
Custom metrics are not granted: Cloud Monitor's PutMonitorData cannot be limited to a namespace.
"""
from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass

from infra import catalog, metrics, slurm
from infra.config import Partition, StackConfig
from infra.userdata import controller_json, node_json
from infra.regions import TENCENT_REGIONS
from trainer.jobs.layout import team_prefix

VPC_CIDR = "10.72.0.0/16"
QUEUE_ZONES = 3                 # node subnets (zones) when some partition is not a gang; a gang-only stack uses one
# The controller's subnet: a /28 of its own in the first zone, where no node is ever launched, so that its fixed
# address is free whenever a replacement controller comes; the two CFS mount targets live there too.
CONTROLLER_SUBNET_CIDR = "10.72.240.0/28"
CONTROLLER_HOST, HOME_FS_HOST, STATE_FS_HOST = 10, 11, 12   # host numbers in that subnet (Tencent reserves .0, .1
                                                             # and the last address of a subnet)
SYSTEM_DISK_TYPE = "CLOUD_PREMIUM"
NODE_SYSTEM_DISK_GB = 200
CONTROLLER_SYSTEM_DISK_GB = 50
ON_DEMAND, SPOT = "POSTPAID_BY_HOUR", "SPOTPAID"   # CVM's payment modes: pay-as-you-go and spot
# slurmctld's power-saving programs on the image (ami/files): each runs `gpufleet-trainer nodes ACTION HOSTLIST`.
PROGRAMS = {"resume": "/usr/local/sbin/gpufleet-resume", "suspend": "/usr/local/sbin/gpufleet-suspend",
            "resume_fail": "/usr/local/sbin/gpufleet-resume-fail"}
CONTROLLER_HOSTNAME = "controller"  # SlurmctldHost: slurmctld starts only on the host of that short name
# CFS over NFS v4.0 as Tencent's mount guide gives it (noresvport: a new source port on reconnect); hard mounts with
# its timeouts, so a CFS failover stalls I/O instead of failing it.
NFS_OPTIONS = "vers=4.0,noresvport,hard,timeo=600,retrans=2"
# TDMQ CMQ has no per-message visibility change: a received message stays hidden for the queue's
# visibility timeout, which is therefore the consumer's in-flight window. Messages live at most 12 hours from their
# last send.
QUEUE_VISIBILITY_S = 3 * 3600
QUEUE_RETENTION_S = 12 * 3600   # CMQ's maximum
QUEUE_POLL_S = 20               # long-poll default (CMQ allows 0-30)
MAX_RECEIVES = 3                # receives before CMQ moves a message to the dead-letter queue
DEAD_SUFFIX = "-dead"           # the dead-letter queue is <queue>-dead (the trainer's CMQ client relies on it)
LOG_RETENTION_DAYS = {"public": 30, "internal": 90, "personal": 365}
# Cloud Monitor rules.
IDLE_GPU_PERCENT = 5
IDLE_GPU_PERIODS = 6            # x 5 minutes
BUSY_PERCENT = 90               # CPU / memory, as the guide's alarms
BUDGET_ALERTS = (("ACTUAL", 80), ("ACTUAL", 100), ("FORECAST", 100))
BUDGET_PERIOD = ("2025-07", "2035-12")   # Tencent budgets run between a first and a last month
CONTROLLER_DOWN_EVENT = "ping_unreachable"   # a cvm_device event (Cloud Monitor's DescribeAlarmEvents lists it)
TLS_MIN = 1.2
STACK_TAG = "gpufleet-stack"


@dataclass(frozen=True)
class Names:
    """Names fixed before anything exists, so that nodes, policies and alarms can refer to them."""
    prefix: str
    node_group: str          # the nodes' metric dimension (node.json asg_name)
    role: str                # the nodes' CAM role (and its policy)
    controller_role: str     # the controller's CAM role (and its policy)
    job_role: str            # the jobs' CAM role, which the nodes assume for each job with a narrower policy
    queue: str
    dlq: str
    munge: str               # the SSM secret holding the munge key
    logset: str
    metric_namespace: str

    @classmethod
    def of(cls, stack: str) -> "Names":
        prefix = f"gpufleet-{stack}"
        queue = _cmq_name(f"{prefix}-jobs", 64 - len(DEAD_SUFFIX))
        return cls(prefix=prefix, node_group=f"{prefix}-nodes", role=f"{prefix}-nodes",
                   controller_role=f"{prefix}-controller", job_role=f"{prefix}-jobs", queue=queue,
                   dlq=queue + DEAD_SUFFIX,
                   munge=_ssm_name(f"{prefix}-munge"), logset=prefix, metric_namespace=metrics.namespace(stack))


def _fit(name: str, limit: int) -> str:
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:limit - 9].rstrip('-_')}-{digest}"


def _cmq_name(name: str, limit: int = 64) -> str:
    """CMQ queue names: up to 64 letters, digits and '-', starting with a letter; not ending -dlq/-retry."""
    return _fit(re.sub(r"[^A-Za-z0-9-]", "-", name), limit)


def team_queues(names: Names, teams: list[str]) -> dict[str, tuple[str, str]]:
    """Each team's CMQ queue and dead-letter queue, ``{team: (queue, dlq)}``: the first team's keep the stack's
    names (as before teams had queues), another's are ``<prefix>-jobs-<team>`` and its ``-dead``."""
    out = {}
    for i, team in enumerate(teams):
        queue = names.queue if i == 0 else _cmq_name(f"{names.prefix}-jobs-{team}", 64 - len(DEAD_SUFFIX))
        out[team] = (queue, queue + DEAD_SUFFIX)
    return out


def submit_group(names: Names, team: str) -> str:
    """The CAM group whose members submit, follow and cancel a team's jobs (``gpufleet jobs``)."""
    return f"{names.prefix}-submit-{team}"


def _ssm_name(name: str) -> str:
    """SSM secret names: up to 128 letters, digits, '_' and '-', starting with a letter or digit."""
    return _fit(re.sub(r"[^A-Za-z0-9_-]", "-", name), 128)


def bucket_name(stack: str, app_id: str, kind: str = "data") -> str:
    """A COS bucket name, `<custom>-<APPID>`: the custom part lower-case letters, digits and '-'."""
    slug = re.sub(r"[^a-z0-9-]", "-", stack.lower()).strip("-") or "stack"
    return f"{_fit(f'gpufleet-{slug}-{kind}', 40)}-{app_id}"


# --- network -------------------------------------------------------------------------------------

def subnet_cidrs(count: int) -> list[str]:
    """A /20 per zone inside VPC_CIDR for the nodes."""
    return [f"10.72.{16 * i}.0/20" for i in range(count)]


def node_subnet_count(cfg: StackConfig) -> int:
    """One subnet for a stack of gang partitions only (one zone), else one per zone."""
    return 1 if cfg.all_gang else QUEUE_ZONES


def _host(cidr: str, n: int) -> str:
    return str(ipaddress.ip_network(cidr)[n])


CONTROLLER_IP = _host(CONTROLLER_SUBNET_CIDR, CONTROLLER_HOST)
HOME_FS_IP = _host(CONTROLLER_SUBNET_CIDR, HOME_FS_HOST)
STATE_FS_IP = _host(CONTROLLER_SUBNET_CIDR, STATE_FS_HOST)


def zone_at(available: list[str], i: int) -> str:
    """The zone of node subnet i: the zones offering every partition's primary type in name order, round robin
    (a region with fewer such zones gets more than one subnet in a zone)."""
    zones = sorted(set(available))
    if not zones:
        raise ValueError("no zone of the region sells every partition's primary instance type")
    return zones[i % len(zones)]


def common_zones(offered: list[list[str]]) -> list[str]:
    """Zones that sell every partition's primary type (each list: the zones of one type)."""
    sets = [set(z) for z in offered]
    return sorted(set.intersection(*sets)) if sets else []


def partition_subnets(part: Partition, subnet_ids: list, zones: list) -> tuple[list, list]:
    """(subnet ids, their zones) a partition's nodes launch into: a multi-node gang in the first only (one zone,
    NCCL over TCP between nodes that should be near), other partitions in every node subnet."""
    if part.multi_node:
        return list(subnet_ids[:1]), list(zones[:1])
    return list(subnet_ids), list(zones)


def cmq_endpoint(region: str) -> str:
    """TDMQ CMQ's private (VPC) endpoint for the data-flow API; HTTP only, as Tencent publishes it."""
    return f"http://{TENCENT_REGIONS[region]}.mqadapter.cmq.tencentyun.com"


def queue_url(region: str, queue: str) -> str:
    return f"{cmq_endpoint(region)}/{queue}"


def cos_endpoint(region: str) -> str:
    """COS's S3-compatible endpoint; from a CVM in the region it resolves to the private network."""
    return f"https://cos.{region}.myqcloud.com"


def spot_max_price(instance_types: tuple[str, ...]) -> str:
    """The highest bid: the dearest listed type's pay-as-you-go price (a spot node never costs more)."""
    return f"{max(catalog.CATALOG[t].price_hour for t in instance_types):.2f}"


# --- CAM -----------------------------------------------------------------------------------------

def _doc(*statements: dict) -> dict:
    return {"version": "2.0", "statement": list(statements)}


def _allow(actions, resources, condition: dict | None = None) -> dict:
    out = {"effect": "allow", "action": list(actions), "resource": list(resources)}
    if condition:
        out["condition"] = condition
    return out


def cos_resources(region: str, app_id: str, bucket: str) -> list[str]:
    """The bucket (bucket-level actions) and its objects, as six-segment resources."""
    base = f"qcs::cos:{region}:uid/{app_id}:{bucket}"
    return [f"{base}/", f"{base}/*"]


def kms_key_resource(region: str, uin: str, key_id: str) -> str:
    return f"qcs::kms:{region}:uin/{uin}:key/creatorUin/{uin}/{key_id}"


def cmq_queue_resource(region: str, uin: str, queue: str) -> str:
    """A TDMQ CMQ queue as its CAM documentation writes it (service tdmq)."""
    return f"qcs::tdmq:{region}:uin/{uin}:queue/{queue}"


def cls_topic_resource(region: str, uin: str, topic_id: str) -> str:
    return f"qcs::cls:{region}:uin/{uin}:topic/{topic_id}"


def ssm_secret_resource(region: str, uin: str, name: str) -> str:
    """An SSM secret: ``qcs::ssm:$region:uin/$uin:secret/creatorUin/$creatorUin/$secretName``."""
    return f"qcs::ssm:{region}:uin/{uin}:secret/creatorUin/{uin}/{name}"


def cvm_instances(region: str, uin: str) -> str:
    return f"qcs::cvm:{region}:uin/{uin}:instance/*"


def cvm_image(region: str, uin: str, image_id: str) -> str:
    return f"qcs::cvm:{region}:uin/{uin}:image/{image_id}"


def security_group_resource(region: str, uin: str, sg_id: str) -> str:
    return f"qcs::cvm:{region}:uin/{uin}:sg/{sg_id}"


def vpc_resource(region: str, uin: str, vpc_id: str) -> str:
    return f"qcs::vpc:{region}:uin/{uin}:vpc/{vpc_id}"


def subnet_resource(region: str, uin: str, subnet_id: str) -> str:
    return f"qcs::vpc:{region}:uin/{uin}:subnet/{subnet_id}"


def cam_role_resource(uin: str, role: str) -> str:
    """A CAM role for cam:PassRole (CAM is global: no region)."""
    return f"qcs::cam::uin/{uin}:roleName/{role}"


def in_vpc(vpc_id: str, condition: dict | None = None) -> dict:
    """``condition`` and "the request comes from the VPC ``vpc_id``" (COS's ``vpc:requester_vpc``, which a request
    from outside any VPC does not carry): a key of a role that holds it works on COS only from the stack's VPC."""
    return {**(condition or {}), "string_equal": {"vpc:requester_vpc": [vpc_id]}}


def tagged(stack: str, key: str = "resource") -> dict:
    """The condition "carries (resource) or is being given (request) the tag gpufleet-stack=<stack>"."""
    return {"for_any_value:string_equal": {f"qcs:{key}_tag": [f"{STACK_TAG}&{stack}"]}}


def assume_role(service: str) -> dict:
    """Trust policy: only `service` (cvm.qcloud.com) assumes the role."""
    return _doc({"action": ["name/sts:AssumeRole"], "effect": "allow", "principal": {"service": [service]}})


def job_role_trust(uin: str) -> dict:
    """The job role's trust policy: the account (``qcs::cam::uin/<uin>:root``, the principal CAM documents for a
    role its own identities assume), so who may assume it is each identity's own policy: in the stack, only the
    nodes' (``node_policy``'s sts:AssumeRole on this role)."""
    return _doc({"action": ["name/sts:AssumeRole"], "effect": "allow",
                 "principal": {"qcs": [f"qcs::cam::uin/{uin}:root"]}})


COS_OBJECT_ACTIONS = ("name/cos:GetObject", "name/cos:HeadObject", "name/cos:PutObject", "name/cos:DeleteObject",
                      "name/cos:InitiateMultipartUpload", "name/cos:UploadPart", "name/cos:CompleteMultipartUpload",
                      "name/cos:AbortMultipartUpload", "name/cos:ListParts")
COS_BUCKET_ACTIONS = ("name/cos:GetBucket", "name/cos:HeadBucket", "name/cos:ListMultipartUploads")
KEY_ACTIONS = ("name/kms:Encrypt", "name/kms:Decrypt", "name/kms:GenerateDataKey")
QUEUE_ACTIONS = ("name/tdmq:ReceiveMessage", "name/tdmq:SendMessage", "name/tdmq:DeleteMessage")
DESCRIBE_INSTANCES = "name/cvm:DescribeInstances"


JOB_WRITES = "teams/*/jobs/*"                        # each job's own prefix (trainer.jobs.layout)
JOB_READS = ("teams/*/code/*", "teams/*/data/*")    # its team's bundles and data


def job_role_policy(*, region: str, app_id: str, uin: str, bucket: str, key_id: str, vpc_id: str) -> dict:
    """The job role: the ceiling of every job's rights. The node's credentials daemon assumes it for each job with
    a policy naming that job's ``teams/<team>/jobs/<id>/`` and its team's code and data
    (trainer.clouds.tencent_credentials); STS grants the intersection, so a job's key reaches its own prefix only,
    and from the stack's VPC only (``in_vpc``). No write to ``teams/<team>/jobs-index/`` (the bridge keeps it);
    nothing of the node role (munge key, logs, instances) reaches a job."""
    base = f"qcs::cos:{region}:uid/{app_id}:{bucket}"
    return _doc(
        _allow(COS_OBJECT_ACTIONS, [f"{base}/{JOB_WRITES}"], in_vpc(vpc_id)),
        _allow(("name/cos:GetObject", "name/cos:HeadObject"), [f"{base}/{p}" for p in JOB_READS], in_vpc(vpc_id)),
        _allow(("name/cos:GetBucket",), [f"{base}/"],
               in_vpc(vpc_id, {"string_like": {"cos:prefix": [JOB_WRITES, *JOB_READS]}})),
        _allow(("name/cos:HeadBucket",), [f"{base}/"], in_vpc(vpc_id)),
        _allow(KEY_ACTIONS, [kms_key_resource(region, uin, key_id)]),
    )


def node_policy(*, region: str, app_id: str, uin: str, bucket: str, key_id: str, topic_id: str,
                munge_secret: str, job_role: str, vpc_id: str) -> dict:
    """What a GPU node (its setup, its credentials daemon, log shipping) may do, each on its one resource:
    checkpoints and data in the bucket under the stack key (from the stack's VPC only), its logs, the munge key
    (read only), its own Slurm name (its gpufleet-slurm-node tag, through DescribeInstances) and the job role, which
    it assumes for each job. No queue, no instance to launch or end. Jobs hold none of it: the metadata service
    answers only root on a node."""
    return _doc(
        _allow(["name/sts:AssumeRole"], [cam_role_resource(uin, job_role)]),
        _allow(COS_BUCKET_ACTIONS + COS_OBJECT_ACTIONS, cos_resources(region, app_id, bucket), in_vpc(vpc_id)),
        _allow(KEY_ACTIONS, [kms_key_resource(region, uin, key_id)]),
        _allow(["name/cls:pushLog"], [cls_topic_resource(region, uin, topic_id)]),
        _allow(["name/ssm:GetSecretValue"], [ssm_secret_resource(region, uin, munge_secret)]),
        _allow([DESCRIBE_INSTANCES], [cvm_instances(region, uin)]),
    )


def controller_policy(*, region: str, app_id: str, uin: str, stack: str, bucket: str, key_id: str,
                      queues: list[str], dlqs: list[str], munge_secret: str, node_role: str, vpc_id: str,
                      subnet_ids: list[str],
                      security_group_id: str, image_id: str) -> dict:
    """What the controller (slurmctld's power saving, the bridge, its setup) may do: launch nodes into the stack's
    node subnets with its node security group and image, only when the request tags them with the stack, passing
    the node role and no other; terminate only instances that carry the stack's tag; read instances (their
    addresses and tags); make and read the munge key; consume the teams' job queues and dead-letter; keep the
    records in the bucket under the stack key (from the stack's VPC only)."""
    launch = [cvm_instances(region, uin), vpc_resource(region, uin, vpc_id),
              *(subnet_resource(region, uin, s) for s in subnet_ids),
              security_group_resource(region, uin, security_group_id), cvm_image(region, uin, image_id)]
    return _doc(
        _allow(["name/cvm:RunInstances"], launch, tagged(stack, "request")),
        _allow(["name/cam:PassRole"], [cam_role_resource(uin, node_role)]),
        _allow(["name/cvm:TerminateInstances"], [cvm_instances(region, uin)], tagged(stack)),
        _allow([DESCRIBE_INSTANCES], [cvm_instances(region, uin)]),
        _allow(["name/ssm:GetSecretValue", "name/ssm:PutSecretValue"],
               [ssm_secret_resource(region, uin, munge_secret)]),
        _allow(KEY_ACTIONS, [kms_key_resource(region, uin, key_id)]),
        _allow(QUEUE_ACTIONS, [cmq_queue_resource(region, uin, q) for q in queues]),
        # The bridge dead-letters a job that keeps failing (CMQ counts only receives of one message copy).
        _allow(["name/tdmq:SendMessage"], [cmq_queue_resource(region, uin, q) for q in dlqs]),
        _allow(COS_BUCKET_ACTIONS + COS_OBJECT_ACTIONS, cos_resources(region, app_id, bucket), in_vpc(vpc_id)),
    )


SUBMIT_WRITES = ("jobs/", "code/")                 # under the team's prefix: records, log marks, code bundles
SUBMIT_READS = ("jobs/", "jobs-index/", "code/")
SUBMIT_UPLOADS = ("name/cos:PutObject", "name/cos:InitiateMultipartUpload", "name/cos:UploadPart",
                  "name/cos:CompleteMultipartUpload", "name/cos:AbortMultipartUpload", "name/cos:ListParts")


def submit_policy(*, region: str, app_id: str, uin: str, bucket: str, key_id: str, queue: str, dlq: str,
                  team: str) -> dict:
    """A team's submit group (`gpufleet jobs`): send to the team's queue only, take its own dead letters back
    (`jobs retry`), keep records and bundles under its team's prefix and list only there. No other team's queue or
    objects, no node, no instance, no role to pass. CMQ queues have no resource policy (unlike SQS): another
    identity of the account granted tdmq:SendMessage on every queue could send to a team's too."""
    base = f"qcs::cos:{region}:uid/{app_id}:{bucket}"
    own = f"{base}/{team_prefix(team)}"
    return _doc(
        _allow(["name/tdmq:SendMessage"], [cmq_queue_resource(region, uin, queue)]),
        _allow(QUEUE_ACTIONS, [cmq_queue_resource(region, uin, dlq)]),
        _allow(["name/cos:GetBucket"], [f"{base}/"], {"string_like": {"cos:prefix": [f"{team_prefix(team)}*"]}}),
        _allow(["name/cos:GetObject", "name/cos:HeadObject"], [f"{own}{p}*" for p in SUBMIT_READS]),
        _allow(SUBMIT_UPLOADS, [f"{own}{p}*" for p in SUBMIT_WRITES]),
        _allow(KEY_ACTIONS, [kms_key_resource(region, uin, key_id)]),
    )


def bucket_policy(region: str, app_id: str, bucket: str) -> dict:
    """Deny anyone any request over plain HTTP, or over TLS below 1.2 (cos:secure-transport, cos:tls-version)."""
    resources = cos_resources(region, app_id, bucket)
    anyone = {"qcs": ["qcs::cam::anyone:anyone"]}
    return _doc(
        {"principal": anyone, "effect": "deny", "action": ["name/cos:*"], "resource": resources,
         "condition": {"bool_equal": {"cos:secure-transport": "false"}}},
        {"principal": anyone, "effect": "deny", "action": ["name/cos:*"], "resource": resources,
         "condition": {"numeric_less_than": {"cos:tls-version": TLS_MIN}}},
    )


# --- security groups -----------------------------------------------------------------------------

def _drop_the_rest() -> dict:
    return {"action": "DROP", "protocol": "ALL", "port": "ALL", "cidr_block": "0.0.0.0/0",
            "description": "nothing else inbound"}


def node_ingress_rules(node_sg: str, controller_sg: str) -> list[dict]:
    """Into a node: every node of the stack (NCCL, slurmd's fan-out, srun's steps), and slurmd's port from the
    controller; nothing else, from anywhere."""
    return [
        {"action": "ACCEPT", "protocol": "ALL", "port": "ALL", "source_security_id": node_sg,
         "description": "nodes of this stack (NCCL, slurmd, srun)"},
        {"action": "ACCEPT", "protocol": "TCP", "port": str(slurm.SLURMD_PORT), "source_security_id": controller_sg,
         "description": "slurmctld to slurmd"},
        _drop_the_rest(),
    ]


def controller_ingress_rules(node_sg: str) -> list[dict]:
    """Into the controller: slurmctld's port and srun's port range from the nodes; nothing else."""
    low, high = slurm.SRUN_PORTS
    return [
        {"action": "ACCEPT", "protocol": "TCP", "port": str(slurm.SLURMCTLD_PORT), "source_security_id": node_sg,
         "description": "slurmd and jobs to slurmctld"},
        {"action": "ACCEPT", "protocol": "TCP", "port": f"{low}-{high}", "source_security_id": node_sg,
         "description": "job steps to an srun on the controller"},
        _drop_the_rest(),
    ]


def egress_rules() -> list[dict]:
    """Out: the VPC (Slurm, NFS to CFS), and HTTP(S)/DNS/NTP to Tencent's private service endpoints (metadata,
    COS, CMQ, SSM, CVM API, Cloud Monitor, TAT). The subnets have no route to the internet (no NAT gateway, no
    public IP): the rules name ports, the routes decide what those ports reach."""
    return [
        {"action": "ACCEPT", "protocol": "ALL", "port": "ALL", "cidr_block": VPC_CIDR, "description": "the VPC"},
        {"action": "ACCEPT", "protocol": "TCP", "port": "80,443", "cidr_block": "0.0.0.0/0",
         "description": "Tencent service endpoints (CMQ private endpoint is HTTP)"},
        {"action": "ACCEPT", "protocol": "UDP", "port": "53,123", "cidr_block": "0.0.0.0/0",
         "description": "DNS and NTP"},
        {"action": "DROP", "protocol": "ALL", "port": "ALL", "cidr_block": "0.0.0.0/0", "description": "nothing else"},
    ]


# --- shared file system ----------------------------------------------------------------------------

def home_access_rules(node_cidrs: list[str]) -> list[dict]:
    """The /home file system's permission group: the controller as root (it makes users' directories), the node
    subnets with root squashed; no other address of the VPC."""
    return [{"auth_client_ip": CONTROLLER_IP, "priority": 1, "rw_permission": "RW",
             "user_permission": "no_root_squash"}] + [
        {"auth_client_ip": cidr, "priority": 2 + i, "rw_permission": "RW", "user_permission": "root_squash"}
        for i, cidr in enumerate(node_cidrs)]


def state_access_rules() -> list[dict]:
    """slurmctld's state file system: the controller's address only, as root (setup hands the directory to the
    slurm user). No node can mount it."""
    return [{"auth_client_ip": CONTROLLER_IP, "priority": 1, "rw_permission": "RW",
             "user_permission": "no_root_squash"}]


def nfs_mount(mount_ip: str, target: str) -> dict:
    """One entry of node.json's / controller.json's ``mounts``: a CFS file system's root over NFS v4.0."""
    return {"source": f"{mount_ip}:/", "target": target, "type": "nfs4", "options": NFS_OPTIONS}


def node_mounts(home_ip: str) -> list[dict]:
    return [nfs_mount(home_ip, "/home")]


def controller_mounts(home_ip: str, state_ip: str) -> list[dict]:
    return [nfs_mount(home_ip, "/home"), nfs_mount(state_ip, slurm.STATE_DIR)]


# --- monitoring ----------------------------------------------------------------------------------

def _rule(metric: str, operator: str, value: float, periods: int, period_s: int = 300) -> dict:
    return {"metric_name": metric, "operator": operator, "value": f"{value:g}", "period": period_s,
            "continue_period": periods, "notice_frequency": 3600, "is_power_notice": 0, "rule_type": "STATIC"}


def node_alarm_rules() -> dict[str, dict]:
    """Rules on the stack's machines (namespace cvm_device, bound by the stack tag): idle GPUs, busy CPU and
    memory. Nodes exist only while Slurm has them powered up, so the idle-GPU rule speaks only while nodes run (the
    controller, which carries the tag too, has no GPU metric)."""
    return {
        "idle-gpus": _rule("GpuUtil", "lt", IDLE_GPU_PERCENT, IDLE_GPU_PERIODS),
        "busy-cpu": _rule("CpuUsage", "ge", BUSY_PERCENT, 1),
        "busy-memory": _rule("MemUsage", "ge", BUSY_PERCENT, 1),
    }


def dead_letter_rule() -> dict:
    """Any visible message in the dead-letter queue (QCE/CMQ VisibleMsgNum)."""
    return _rule("VisibleMsgNum", "gt", 0, 1, period_s=60)


def controller_down_event() -> dict:
    """Cloud Monitor's CVM event "ping unreachable" on the controller."""
    return {"metric_name": CONTROLLER_DOWN_EVENT}


# --- what the machines boot with -----------------------------------------------------------------

def slurm_settings(munge_secret: str) -> dict:
    """node.json's and controller.json's "slurm": where slurmctld listens, and the munge key's secret (its name)."""
    return {"controller_addr": CONTROLLER_IP, "controller_port": slurm.SLURMCTLD_PORT, "munge": munge_secret}


def tencent_settings(region: str, app_id: str, role: str) -> dict:
    return {"app_id": app_id, "role_name": role, "cos_endpoint": cos_endpoint(region)}


def job_role_arn(uin: str, role: str) -> str:
    """The job role as STS AssumeRole's RoleArn takes it."""
    return cam_role_resource(uin, role)


def node_settings(cfg: StackConfig, part: Partition, names: Names, *, bucket: str, app_id: str, uin: str,
                  log_topic: str, munge_secret: str, home_ip: str) -> dict:
    """A partition's /etc/gpufleet/node.json: under ``tencent`` also the job role and the bucket its credentials
    daemon narrows each job's key to (trainer.node.jobcreds)."""
    own = {**tencent_settings(cfg.region, app_id, names.role), "job_role_arn": job_role_arn(uin, names.job_role),
           "bucket": bucket}
    return node_json(cfg, part, bucket=f"cos://{bucket}", asg_name=names.node_group, log_group=log_topic,
                     own=own, slurm_=slurm_settings(munge_secret),
                     mounts=node_mounts(home_ip))


def controller_settings(cfg: StackConfig, names: Names, *, bucket: str, app_id: str, log_topic: str,
                        munge_secret: str, home_ip: str, state_ip: str) -> dict:
    """The controller's /etc/gpufleet/controller.json: the bridge's queues (each team's) and bucket, the default
    partition, the state directory (the state file system's mount), its own CAM role."""
    teams = team_queues(names, [t.name for t in cfg.teams])
    queues = {team: queue_url(cfg.region, q) for team, (q, _) in teams.items()}
    return controller_json(cfg, bucket=f"cos://{bucket}", queue_url=queues[cfg.teams[0].name],
                           log_group=log_topic, slurm_=slurm_settings(munge_secret),
                           mounts=controller_mounts(home_ip, state_ip),
                           own=tencent_settings(cfg.region, app_id, names.controller_role), team_queues=queues)


def nodes_config(cfg: StackConfig, names: Names, *, templates: dict[str, str], vpc_id: str,
                 subnets: dict[str, list[str]], zones: dict[str, list[str]]) -> dict:
    """The controller's /etc/gpufleet/nodes.json: what the node provider (trainer.clouds.tencent_nodes) launches
    for each partition, and the controller's role it does so with. No placement set: see infra.tencent.partition."""
    def partition(p: Partition) -> dict:
        out = {"instance_types": list(p.instance_types), "spot": p.spot, "on_demand_base": p.on_demand_base,
               "gang": p.gang, "launch_template_id": templates[p.name], "vpc_id": vpc_id,
               "subnet_ids": list(subnets[p.name]), "zones": list(zones[p.name]), "placement_set_id": None}
        if p.spot:
            out["spot_max_price"] = spot_max_price(p.instance_types)
        return out

    return {"provider": "tencent", "cloud": "tencent", "stack": cfg.stack, "region": cfg.region,
            "slurm_conf": "/etc/slurm/slurm.conf", "tags": cfg.all_tags,
            "tencent": {"role_name": names.controller_role},
            "partitions": {p.name: partition(p) for p in cfg.partitions}}
