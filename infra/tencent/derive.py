"""Pure derivations for the Tencent stack: names, network layout, CAM and bucket policy documents,
queue settings, alarm rules, node settings. No Pulumi here; the components turn these into resources.

Policy documents use CAM's language (version 2.0, lower-case elements, six-segment `qcs::` resources).
Resources the nodes touch are named one by one: the bucket, the stack key, the two queues, the scaling
group and the log topic. Custom metrics are not granted: Cloud Monitor's PutMonitorData cannot be
limited to a namespace, and the metrics the alarms read (CPU, memory, GPU) come from the monitoring agent.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from infra import catalog
from infra.config import StackConfig
from infra.regions import TENCENT_REGIONS

VPC_CIDR = "10.72.0.0/16"
QUEUE_ZONES = 3                 # subnets (zones) in queue mode; gang mode uses one
SYSTEM_DISK_TYPE = "CLOUD_PREMIUM"
SYSTEM_DISK_GB = 200
LAUNCH_HOOK_TIMEOUT_S = 1800    # preflight: drivers, fabric manager and NCCL checks
TERMINATE_HOOK_TIMEOUT_S = 600  # time to write a checkpoint before the node goes
# TDMQ CMQ has no per-message visibility change: a received message stays hidden for the queue's
# visibility timeout, which is therefore the agent's in-flight window (it hands a running job back, with
# a checkpoint, before the window ends). Messages live at most 12 hours from their last send.
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
SCALER_CRON = "0 */1 * * * * *"          # SCF timer: second 0 of every minute
SCALER_RUNTIME = "Python3.9"
SCALER_TIMEOUT_S = 30
TLS_MIN = 1.2


@dataclass(frozen=True)
class Names:
    """Names fixed before anything exists, so that nodes, policies and alarms can refer to them."""
    prefix: str
    group: str
    config: str
    role: str
    scaler_role: str
    scaler: str
    queue: str
    dlq: str
    launch_hook: str
    terminate_hook: str
    logset: str
    metric_namespace: str

    @classmethod
    def of(cls, stack: str) -> "Names":
        prefix = f"gpufleet-{stack}"
        queue = _cmq_name(f"{prefix}-jobs", 64 - len(DEAD_SUFFIX))
        return cls(prefix=prefix, group=f"{prefix}-nodes", config=f"{prefix}-node", role=f"{prefix}-nodes",
                   scaler_role=f"{prefix}-scaler", scaler=_scf_name(f"{prefix}-scaler"),
                   queue=queue, dlq=queue + DEAD_SUFFIX,
                   launch_hook=f"{prefix}-preflight", terminate_hook=f"{prefix}-checkpoint",
                   logset=prefix, metric_namespace=f"gpufleet/{stack}")


def _fit(name: str, limit: int) -> str:
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:limit - 9].rstrip('-_')}-{digest}"


def _cmq_name(name: str, limit: int = 64) -> str:
    """CMQ queue names: up to 64 letters, digits and '-', starting with a letter; not ending -dlq/-retry."""
    return _fit(re.sub(r"[^A-Za-z0-9-]", "-", name), limit)


def _scf_name(name: str) -> str:
    """SCF function names: 2-60 letters, digits, '-' and '_', starting with a letter, not ending in - or _."""
    return _fit(re.sub(r"[^A-Za-z0-9_-]", "-", name), 60).rstrip("-_")


def bucket_name(stack: str, app_id: str, kind: str = "data") -> str:
    """A COS bucket name, `<custom>-<APPID>`: the custom part lower-case letters, digits and '-'."""
    slug = re.sub(r"[^a-z0-9-]", "-", stack.lower()).strip("-") or "stack"
    return f"{_fit(f'gpufleet-{slug}-{kind}', 40)}-{app_id}"


def subnet_cidrs(count: int) -> list[str]:
    """A /20 per zone inside VPC_CIDR."""
    return [f"10.72.{16 * i}.0/20" for i in range(count)]


def zone_at(available: list[str], i: int) -> str:
    """The zone of subnet i: the zones offering the primary type in name order, round robin (a region
    with fewer such zones gets more than one subnet in a zone)."""
    zones = sorted(set(available))
    if not zones:
        raise ValueError("no zone of the region offers the primary instance type")
    return zones[i % len(zones)]


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


def cos_resources(region: str, app_id: str, bucket: str) -> list[str]:
    """The bucket (bucket-level actions) and its objects, as six-segment resources."""
    base = f"qcs::cos:{region}:uid/{app_id}:{bucket}"
    return [f"{base}/", f"{base}/*"]


def kms_key_resource(region: str, uin: str, key_id: str) -> str:
    return f"qcs::kms:{region}:uin/{uin}:key/creatorUin/{uin}/{key_id}"


def cmq_queue_resource(region: str, uin: str, queue: str) -> str:
    """A TDMQ CMQ queue as its CAM documentation writes it (service tdmq)."""
    return f"qcs::tdmq:{region}:uin/{uin}:queue/{queue}"


def as_group_resource(region: str, uin: str, group_id: str) -> str:
    return f"qcs::as:{region}:uin/{uin}:auto-scaling-group/{group_id}"


def cls_topic_resource(region: str, uin: str, topic_id: str) -> str:
    return f"qcs::cls:{region}:uin/{uin}:topic/{topic_id}"


def assume_role(service: str) -> dict:
    """Trust policy: only `service` (cvm.qcloud.com for nodes, scf.qcloud.com for the scaler) assumes the role."""
    return _doc({"action": ["name/sts:AssumeRole"], "effect": "allow", "principal": {"service": [service]}})


COS_OBJECT_ACTIONS = ("name/cos:GetObject", "name/cos:HeadObject", "name/cos:PutObject", "name/cos:DeleteObject",
                      "name/cos:InitiateMultipartUpload", "name/cos:UploadPart", "name/cos:CompleteMultipartUpload",
                      "name/cos:AbortMultipartUpload", "name/cos:ListParts")
COS_BUCKET_ACTIONS = ("name/cos:GetBucket", "name/cos:HeadBucket", "name/cos:ListMultipartUploads")
QUEUE_ACTIONS = ("name/tdmq:ReceiveMessage", "name/tdmq:SendMessage", "name/tdmq:DeleteMessage")


def node_policy(*, region: str, app_id: str, uin: str, bucket: str, key_id: str, queue: str, dlq: str,
                group_id: str, topic_id: str) -> dict:
    """What a node (agent, trainer, preflight, log shipping) may do, each on its one resource."""
    return _doc(
        {"effect": "allow", "action": list(COS_BUCKET_ACTIONS + COS_OBJECT_ACTIONS),
         "resource": cos_resources(region, app_id, bucket)},
        {"effect": "allow", "action": ["name/kms:Encrypt", "name/kms:Decrypt", "name/kms:GenerateDataKey"],
         "resource": [kms_key_resource(region, uin, key_id)]},
        {"effect": "allow", "action": list(QUEUE_ACTIONS),
         "resource": [cmq_queue_resource(region, uin, queue)]},
        # The agent dead-letters a job that keeps failing (CMQ counts only receives of one message copy).
        {"effect": "allow", "action": ["name/tdmq:SendMessage"], "resource": [cmq_queue_resource(region, uin, dlq)]},
        {"effect": "allow",
         "action": ["name/as:CompleteLifecycleAction", "name/as:SetInstancesProtection",
                    "name/as:DescribeAutoScalingInstances", "name/as:DescribeLifecycleHooks"],
         "resource": [as_group_resource(region, uin, group_id)]},
        {"effect": "allow", "action": ["name/cls:pushLog"], "resource": [cls_topic_resource(region, uin, topic_id)]},
    )


def scaler_policy(*, region: str, uin: str, queue: str, group_id: str) -> dict:
    """The scaler reads the job queue's message counts and sets the group's desired capacity."""
    return _doc(
        {"effect": "allow", "action": ["name/tdmq:DescribeCmqQueueDetail"],
         "resource": [cmq_queue_resource(region, uin, queue)]},
        {"effect": "allow", "action": ["name/as:ModifyDesiredCapacity"],
         "resource": [as_group_resource(region, uin, group_id)]},
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


# --- network -------------------------------------------------------------------------------------

def ingress_rules(sg_id: str) -> list[dict]:
    """Node to node (NCCL, rendezvous) from the group's own security group; nothing else, from anywhere."""
    return [
        {"action": "ACCEPT", "protocol": "ALL", "port": "ALL", "source_security_id": sg_id,
         "description": "nodes of this stack (NCCL, torchrun rendezvous)"},
        {"action": "DROP", "protocol": "ALL", "port": "ALL", "cidr_block": "0.0.0.0/0",
         "description": "nothing else inbound"},
    ]


def egress_rules() -> list[dict]:
    """Out: the VPC, and HTTP(S)/DNS/NTP to Tencent's private service endpoints (metadata, COS, CMQ, Cloud
    Monitor, TAT). The subnets have no route to the internet (no NAT gateway, no public IP): the rules
    name ports, the routes decide what those ports reach."""
    return [
        {"action": "ACCEPT", "protocol": "ALL", "port": "ALL", "cidr_block": VPC_CIDR, "description": "the VPC"},
        {"action": "ACCEPT", "protocol": "TCP", "port": "80,443", "cidr_block": "0.0.0.0/0",
         "description": "Tencent service endpoints (CMQ private endpoint is HTTP)"},
        {"action": "ACCEPT", "protocol": "UDP", "port": "53,123", "cidr_block": "0.0.0.0/0",
         "description": "DNS and NTP"},
        {"action": "DROP", "protocol": "ALL", "port": "ALL", "cidr_block": "0.0.0.0/0", "description": "nothing else"},
    ]


# --- monitoring ----------------------------------------------------------------------------------

def _rule(metric: str, operator: str, value: float, periods: int, period_s: int = 300) -> dict:
    return {"metric_name": metric, "operator": operator, "value": f"{value:g}", "period": period_s,
            "continue_period": periods, "notice_frequency": 3600, "is_power_notice": 0, "rule_type": "STATIC"}


def node_alarm_rules() -> dict[str, dict]:
    """Rules on the nodes (namespace cvm_device, bound by the stack tag): idle GPUs, busy CPU and memory.
    Bound to the group's instances only, the idle-GPU rule fires only while nodes run."""
    return {
        "idle-gpus": _rule("GpuUtil", "lt", IDLE_GPU_PERCENT, IDLE_GPU_PERIODS),
        "busy-cpu": _rule("CpuUsage", "ge", BUSY_PERCENT, 1),
        "busy-memory": _rule("MemUsage", "ge", BUSY_PERCENT, 1),
    }


def dead_letter_rule() -> dict:
    """Any visible message in the dead-letter queue (QCE/CMQ VisibleMsgNum)."""
    return _rule("VisibleMsgNum", "gt", 0, 1, period_s=60)


# --- nodes ---------------------------------------------------------------------------------------

def node_settings(cfg: StackConfig, names: Names, *, bucket: str, app_id: str, log_topic: str) -> dict:
    """The /etc/gpufleet/node.json of a Tencent node."""
    types = {t: {"gpus": catalog.CATALOG[t].gpus, "efa": 0, "nvswitch": catalog.CATALOG[t].nvswitch,
                 "infiniband_gbps": 0} for t in cfg.instance_types}
    return {"cloud": "tencent", "stack": cfg.stack, "region": cfg.region, "mode": cfg.mode,
            "node_count": cfg.nodes.max if cfg.mode == "gang" else 1, "bucket": f"cos://{bucket}",
            "queue_url": queue_url(cfg.region, names.queue), "asg_name": names.group, "log_group": log_topic,
            "metric_namespace": names.metric_namespace, "instance_types": types,
            "launch_hook": names.launch_hook, "terminate_hook": names.terminate_hook,
            "tencent": {"app_id": app_id, "role_name": names.role, "cos_endpoint": cos_endpoint(cfg.region)}}
