"""Wire the AWS components of one stack and return its outputs."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra import catalog, metrics, scaling
from infra.aws import efa, policies, registry
from infra.aws.compute import Compute, ComputeArgs
from infra.aws.flowlogs import FlowLogs, FlowLogsArgs
from infra.aws.identity import Identity, IdentityArgs
from infra.aws.monitoring import LOG_RETENTION_DAYS, Monitoring, MonitoringArgs
from infra.aws.network import Network, NetworkArgs
from infra.aws.queue import JobQueue, QueueArgs
from infra.aws.registry import Registry, RegistryArgs
from infra.aws.storage import ACCESS_LOGGED, Storage, StorageArgs
from infra.config import StackConfig

AUTOSCALING_ROLE_PREFIX = "AWSServiceRoleForAutoScaling_"   # the service's part of the role name
IAM_ROLE_NAME_MAX = 64


def role_suffix(prefix: str) -> str:
    """Custom suffix of the stack's Auto Scaling service-linked role: the stack prefix with characters
    IAM names reject replaced by '-', cut and made unique with a hash where the role name would pass
    IAM's 64 characters."""
    suffix = re.sub(r"[^\w+=,.@-]", "-", prefix, flags=re.ASCII)
    room = IAM_ROLE_NAME_MAX - len(AUTOSCALING_ROLE_PREFIX)
    if len(suffix) <= room:
        return suffix
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:8]
    return f"{suffix[:room - len(digest) - 1]}-{digest}"


@dataclass(frozen=True)
class Names:
    """Names fixed before anything exists, so that nodes, policies and alarms can refer to them."""
    prefix: str
    asg: str
    log_group: str
    flow_log_group: str
    chat_log_group: str
    metric_namespace: str
    parameters: str          # the SSM path of the job secrets nodes may read
    launch_hook: str
    terminate_hook: str
    autoscaling_role_suffix: str

    @classmethod
    def of(cls, stack: str) -> "Names":
        prefix = f"gpufleet-{stack}"
        return cls(prefix=prefix, asg=f"{prefix}-nodes", log_group=f"/gpufleet/{stack}",
                   flow_log_group=f"/gpufleet/{stack}/vpc-flow-logs",
                   chat_log_group=f"/gpufleet/{stack}/chat-alerts",
                   metric_namespace=metrics.namespace(stack), parameters=f"/gpufleet/{stack}/",
                   launch_hook=f"{prefix}-preflight",
                   terminate_hook=f"{prefix}-checkpoint", autoscaling_role_suffix=role_suffix(prefix))


def node_settings(cfg: StackConfig, names: Names, use_efa: bool, bucket: str, queue_url: str,
                  registry_url: str | None = None) -> dict:
    """The node's /etc/gpufleet/node.json; `registry` is the stack's repository URL."""
    types = {}
    for name in cfg.instance_types:
        row = catalog.CATALOG[name]
        types[name] = {"gpus": row.gpus, "efa": efa.efa_count(efa.layout(row, use_efa)),
                       "nvswitch": row.nvswitch, "infiniband_gbps": row.infiniband_gbps}
    return {"cloud": "aws", "stack": cfg.stack, "region": cfg.region, "mode": cfg.mode,
            "node_count": cfg.nodes.max if cfg.mode == "gang" else 1, "bucket": bucket, "queue_url": queue_url,
            "asg_name": names.asg, "log_group": names.log_group, "metric_namespace": names.metric_namespace,
            "instance_types": types, "launch_hook": names.launch_hook, "terminate_hook": names.terminate_hook,
            "registry": registry_url}


def build_aws(cfg: StackConfig) -> dict[str, pulumi.Input]:
    names = Names.of(cfg.stack)
    tags = cfg.all_tags
    gang = cfg.mode == "gang"
    use_efa = cfg.multi_node          # EFA only where nodes talk to each other
    account_id = aws.get_caller_identity_output().account_id

    storage = Storage("storage", StorageArgs(
        prefix=names.prefix, region=cfg.region, account_id=account_id,
        log_group_names=(names.log_group, names.flow_log_group) + (
            (names.chat_log_group,) if any(a.kind == "chat" for a in cfg.alert_targets) else ()),
        autoscaling_role_suffix=names.autoscaling_role_suffix,
        access_logging=cfg.data_classification in ACCESS_LOGGED, tags=tags))
    queue = JobQueue("queue", QueueArgs(prefix=names.prefix, key_arn=storage.key.arn, tags=tags))
    monitoring = Monitoring("monitoring", MonitoringArgs(
        prefix=names.prefix, stack=cfg.stack, region=cfg.region, account_id=account_id, key_arn=storage.key.arn,
        log_group_name=names.log_group, chat_log_group_name=names.chat_log_group,
        metric_namespace=names.metric_namespace,
        classification=cfg.data_classification, queue_name=queue.queue.name, dlq_name=queue.dlq.name,
        asg_name=names.asg, budget_monthly_usd=cfg.budget_monthly_usd, alerts=cfg.alert_targets, tags=tags))
    images = Registry("registry", RegistryArgs(
        prefix=names.prefix, region=cfg.region, account_id=account_id, key_arn=storage.key.arn,
        pull_through=cfg.pull_through, tags=tags))
    identity = Identity("identity", IdentityArgs(
        prefix=names.prefix, region=cfg.region, bucket_arn=storage.bucket.arn, key_arn=storage.key.arn,
        queue_arn=queue.queue.arn, dlq_arn=queue.dlq.arn,
        asg_arn=account_id.apply(lambda acct: policies.asg_arn(cfg.region, acct, names.asg)),
        log_group_arn=monitoring.log_group.arn,
        parameters_arn=account_id.apply(lambda acct: policies.parameters_arn(cfg.region, acct, names.parameters)),
        metric_namespace=names.metric_namespace,
        pull_statements=account_id.apply(lambda acct: registry.pull_statements(
            cfg.region, acct, names.prefix, images.prefixes)),
        tags=tags))
    network = Network("network", NetworkArgs(
        prefix=names.prefix, region=cfg.region, single_subnet=gang,
        node_to_node=gang, placement_group=gang, existing=cfg.network, account_id=account_id,
        bucket_arns=(storage.bucket.arn,), aws_owned_reads=(registry.layer_bucket_arn(cfg.region),), tags=tags))
    flow_logs = FlowLogs("flow-logs", FlowLogsArgs(
        prefix=names.prefix, region=cfg.region, account_id=account_id, vpc_id=network.vpc_id,
        key_arn=storage.key.arn, log_group_name=names.flow_log_group,
        retention_days=LOG_RETENTION_DAYS[cfg.data_classification], tags=tags))
    settings = pulumi.Output.all(storage.bucket.bucket, queue.queue.url, images.repository_url).apply(
        lambda v: node_settings(cfg, names, use_efa, *v))
    compute = Compute("compute", ComputeArgs(
        prefix=names.prefix, asg_name=names.asg, mode=cfg.mode,
        capacity=scaling.capacity(cfg.mode, cfg.nodes.min, cfg.nodes.max, cfg.nodes.desired),
        instance_types=cfg.instance_types, spot=cfg.spot, on_demand_base=cfg.on_demand_base, image=cfg.image,
        interfaces=efa.layout(cfg.primary, use_efa), subnet_ids=network.subnet_ids,
        security_group_id=network.node_sg.id,
        placement_group=network.placement_group.name if network.placement_group else None,
        instance_profile_arn=identity.instance_profile.arn, key_arn=storage.key.arn,
        autoscaling_role_arn=storage.autoscaling_role.arn, node_settings=settings,
        launch_hook=names.launch_hook, terminate_hook=names.terminate_hook, queue_name=queue.queue.name,
        tags=tags))

    console = f"https://{cfg.region}.console.aws.amazon.com/cloudwatch/home?region={cfg.region}"
    return {
        "region": cfg.region,
        "bucket": storage.bucket.bucket,
        "accessLogBucket": storage.log_bucket.bucket if storage.log_bucket else None,
        "kmsKey": storage.key.arn,
        "autoscalingServiceRole": storage.autoscaling_role.arn,
        "queueUrl": queue.queue.url,
        "dlqUrl": queue.dlq.url,
        "autoscalingGroup": compute.group.name,
        "launchTemplate": compute.launch_template.id,
        "ami": compute.ami_id,
        "nodeRole": identity.role.arn,
        "instanceProfile": identity.instance_profile.arn,
        "vpcId": network.vpc_id,
        "subnetIds": network.subnet_ids,
        "nodeSecurityGroup": network.node_sg.id,
        "placementGroup": network.placement_group.name if network.placement_group else None,
        "logGroup": monitoring.log_group.name,
        "flowLogGroup": flow_logs.log_group.name,
        "metricNamespace": names.metric_namespace,
        "alertTopic": monitoring.topic.arn,
        "dashboard": monitoring.dashboard.dashboard_name,
        "dashboardUrl": monitoring.dashboard.dashboard_name.apply(lambda n: f"{console}#dashboards:name={n}"),
        "budget": monitoring.budget.name,
        "efaInterfacesPerNode": efa.efa_count(efa.layout(cfg.primary, use_efa)),
        "checkpointUriTemplate": storage.bucket.bucket.apply(lambda b: f"s3://{b}/jobs/<job_id>/"),
        "registry": images.repository_url,
    }
