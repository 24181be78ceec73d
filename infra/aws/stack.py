"""Wire the AWS components of one stack and return its outputs.

A Slurm cluster: the controller (slurmctld, the bridge, power saving) and, per partition, a launch template its
GPU nodes start from when slurmctld powers them up; the shared file system, the munge key's secret, the queue,
the bucket and the monitoring around them.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra import metrics, slurm
from infra.aws import controller as ctl
from infra.aws import efa, partition, policies, registry
from infra.aws.controller import Controller, ControllerArgs
from infra.aws.dns_firewall import DnsFirewall, DnsFirewallArgs
from infra.aws.flowlogs import FlowLogs, FlowLogsArgs
from infra.aws.identity import Identity, IdentityArgs
from infra.aws.monitoring import LOG_RETENTION_DAYS, Monitoring, MonitoringArgs
from infra.aws.network import Network, NetworkArgs
from infra.aws.partition import PartitionArgs, PartitionNodes
from infra.aws.queue import JobQueue, QueueArgs
from infra.aws.registry import Registry, RegistryArgs
from infra.aws.shared_fs import SharedFs, SharedFsArgs
from infra.aws.storage import ACCESS_LOGGED, Storage, StorageArgs
from infra.config import Partition, StackConfig
from infra.userdata import SLURM_CONF_PATH, controller_json, node_json, render_controller_user_data
from trainer.slurm.conf import IMAGE_PROGRAMS, render_gres_conf, render_slurm_conf



@dataclass(frozen=True)
class Names:
    """Names fixed before anything exists, so that nodes, policies and alarms can refer to them."""
    prefix: str
    node_group: str          # the metric dimension of the nodes' series (metrics.ASG)
    log_group: str
    flow_log_group: str
    dns_log_group: str       # the DNS firewall's query log (a VPC of the stack's own)
    chat_log_group: str
    metric_namespace: str
    parameters: str          # the SSM path of the job secrets nodes may read

    @classmethod
    def of(cls, stack: str) -> "Names":
        prefix = f"gpufleet-{stack}"
        return cls(prefix=prefix, node_group=f"{prefix}-nodes", log_group=f"/gpufleet/{stack}",
                   flow_log_group=f"/gpufleet/{stack}/vpc-flow-logs",
                   dns_log_group=f"/gpufleet/{stack}/dns-queries",
                   chat_log_group=f"/gpufleet/{stack}/chat-alerts",
                   metric_namespace=metrics.namespace(stack), parameters=f"/gpufleet/{stack}/")


def slurm_settings(controller_addr: str, munge_secret_arn: str) -> dict:
    """node.json's and controller.json's "slurm": where slurmctld listens, and the munge key's secret."""
    return {"controller_addr": controller_addr, "controller_port": slurm.SLURMCTLD_PORT, "munge": munge_secret_arn}


def node_settings(cfg: StackConfig, part: Partition, names: Names, bucket: str,
                  registry_url: str | None, slurm_: dict, mounts: list[dict], job_role_arn: str) -> dict:
    """A partition's /etc/gpufleet/node.json; `registry` is the stack's repository URL, `aws` what the node's
    credentials daemon needs to hand each job its own credentials (the job role, and the bucket its session
    policy narrows to the job's prefix)."""
    return node_json(cfg, part, bucket=bucket, asg_name=names.node_group, log_group=names.log_group,
                     own={"job_role_arn": job_role_arn, "bucket": bucket}, slurm_=slurm_, mounts=mounts,
                     registry=registry_url)


def nodes_config(cfg: StackConfig, templates: dict[str, str], subnet_ids: dict[str, list[str]],
                 placement_groups: dict[str, str | None]) -> dict:
    """The controller's /etc/gpufleet/nodes.json: what the node provider launches for each partition. No tags:
    the launch templates tag what they launch (the provider adds the stack's tag, which its rights require, and
    the node's name), so a tag change updates the templates and leaves the controller as it is."""
    return {"provider": "aws", "cloud": "aws", "stack": cfg.stack, "region": cfg.region,
            "slurm_conf": SLURM_CONF_PATH,
            "partitions": {p.name: {"instance_types": list(p.instance_types), "spot": p.spot,
                                    "on_demand_base": p.on_demand_base, "gang": p.gang,
                                    "launch_template_id": templates[p.name],
                                    "subnet_ids": list(subnet_ids[p.name]),
                                    "placement_group": placement_groups[p.name]}
                           for p in cfg.partitions}}


def controller_settings(cfg: StackConfig, names: Names, bucket: str, team_queues: dict[str, str], slurm_: dict,
                        mounts: list[dict]) -> dict:
    """The controller's /etc/gpufleet/controller.json: the bridge's queues (each team's) and bucket, the default
    partition."""
    return controller_json(cfg, bucket=bucket, queue_url=team_queues[cfg.teams[0].name], log_group=names.log_group,
                           slurm_=slurm_, mounts=mounts, team_queues=team_queues)


def controller_user_data(cfg: StackConfig, controller_addr: str, settings: dict, nodes: dict) -> str:
    cluster = slurm.cluster(cfg, ctl.HOSTNAME, IMAGE_PROGRAMS, controller_addr=controller_addr)
    return render_controller_user_data(settings, render_slurm_conf(cluster), render_gres_conf(cluster), nodes)


def build_aws(cfg: StackConfig) -> dict[str, pulumi.Input]:
    names = Names.of(cfg.stack)
    tags = cfg.all_tags
    account_id = aws.get_caller_identity_output().account_id

    storage = Storage("storage", StorageArgs(
        prefix=names.prefix, region=cfg.region, account_id=account_id,
        log_group_names=(names.log_group, names.flow_log_group)
        + ((names.dns_log_group,) if cfg.network is None else ())
        + ((names.chat_log_group,) if any(a.kind == "chat" for a in cfg.alert_targets) else ()),
        access_logging=cfg.data_classification in ACCESS_LOGGED, tags=tags))
    # each team its queue and submit role; the first team's keeps the names the stack had before teams had queues
    inlets = {team.name: JobQueue("queue" if i == 0 else f"queue-{team.name}", QueueArgs(
        prefix=names.prefix, team=team.name, name="jobs" if i == 0 else f"jobs-{team.name}", region=cfg.region,
        account_id=account_id, bucket_arn=storage.bucket.arn, key_arn=storage.key.arn, tags=tags))
        for i, team in enumerate(cfg.teams)}
    queue = inlets[cfg.teams[0].name]
    images = Registry("registry", RegistryArgs(
        prefix=names.prefix, region=cfg.region, account_id=account_id, key_arn=storage.key.arn,
        pull_through=cfg.pull_through, tags=tags))
    network = Network("network", NetworkArgs(
        prefix=names.prefix, region=cfg.region, single_subnet=cfg.all_gang, node_to_node=cfg.multi_node,
        existing=cfg.network, account_id=account_id,
        bucket_arns=(storage.bucket.arn,), aws_owned_reads=(registry.layer_bucket_arn(cfg.region),), tags=tags))
    monitoring = Monitoring("monitoring", MonitoringArgs(
        prefix=names.prefix, stack=cfg.stack, region=cfg.region, account_id=account_id, key_arn=storage.key.arn,
        log_group_name=names.log_group, chat_log_group_name=names.chat_log_group,
        metric_namespace=names.metric_namespace,
        classification=cfg.data_classification, queue_names={t: q.queue.name for t, q in inlets.items()},
        dlq_names={t: q.dlq.name for t, q in inlets.items()},
        node_group=names.node_group, budget_monthly_usd=cfg.budget_monthly_usd, alerts=cfg.alert_targets, tags=tags))
    identity = Identity("identity", IdentityArgs(
        prefix=names.prefix, region=cfg.region, bucket_arn=storage.bucket.arn, key_arn=storage.key.arn,
        log_group_arn=monitoring.log_group.arn,
        parameters_arn=account_id.apply(lambda acct: policies.parameters_arn(cfg.region, acct, names.parameters)),
        vpc_id=network.vpc_id,
        metric_namespace=names.metric_namespace,
        pull_statements=account_id.apply(lambda acct: registry.pull_statements(
            cfg.region, acct, names.prefix, images.prefixes)),
        tags=tags))
    flow_logs = FlowLogs("flow-logs", FlowLogsArgs(
        prefix=names.prefix, region=cfg.region, account_id=account_id, vpc_id=network.vpc_id,
        key_arn=storage.key.arn, log_group_name=names.flow_log_group,
        retention_days=LOG_RETENTION_DAYS[cfg.data_classification], tags=tags))
    dns = None
    if cfg.network is None:  # an existing VPC's DNS is its owner's (infra.aws.dns_firewall)
        dns = DnsFirewall("dns-firewall", DnsFirewallArgs(
            prefix=names.prefix, region=cfg.region, vpc_id=network.vpc_id, key_arn=storage.key.arn,
            log_group_name=names.dns_log_group, retention_days=LOG_RETENTION_DAYS[cfg.data_classification],
            tags=tags))
    shared = SharedFs("shared-fs", SharedFsArgs(
        prefix=names.prefix, key_arn=storage.key.arn, subnet_ids=network.subnet_ids,
        security_group_id=network.shared_fs_sg.id, node_role_arn=identity.role.arn,
        controller_role_arn=identity.controller_role.arn, tags=tags))

    slurm_ = pulumi.Output.all(network.controller_eni.private_ip, identity.munge_secret.arn).apply(
        lambda v: slurm_settings(*v))
    ami = partition.image(cfg.image)
    image_id = cfg.image.id or ami.id
    parts: dict[str, PartitionNodes] = {}
    for part in cfg.partitions:
        settings = pulumi.Output.all(storage.bucket.bucket, images.repository_url, slurm_,
                                     shared.node_mounts, identity.job_role.arn).apply(
            lambda v, part=part: node_settings(cfg, part, names, *v))
        parts[part.name] = PartitionNodes(f"partition-{part.name}", PartitionArgs(
            prefix=names.prefix, partition=part, image=cfg.image,
            interfaces=efa.layout(part.primary, part.multi_node), security_group_id=network.node_sg.id,
            subnet_ids=network.subnet_ids,
            instance_profile_arn=identity.instance_profile.arn, key_arn=storage.key.arn, node_settings=settings,
            tags=tags), ami)

    templates = pulumi.Output.all(**{name: p.launch_template.id for name, p in parts.items()})
    template_arns = pulumi.Output.all(*[p.launch_template.arn for p in parts.values()])
    groups = pulumi.Output.all(**{name: (p.placement_group.name if p.placement_group else None)
                                  for name, p in parts.items()})
    subnet_ids = pulumi.Output.all(*network.subnet_ids)
    part_subnets = pulumi.Output.all(**{name: pulumi.Output.all(*p.subnet_ids) for name, p in parts.items()})
    nodes = pulumi.Output.all(templates, part_subnets, groups).apply(lambda v: nodes_config(cfg, *v))
    team_urls = pulumi.Output.all(**{t: q.queue.url for t, q in inlets.items()})
    settings = pulumi.Output.all(storage.bucket.bucket, team_urls, slurm_, shared.controller_mounts).apply(
        lambda v: controller_settings(cfg, names, *v))
    user_data = pulumi.Output.all(network.controller_eni.private_ip, settings, nodes).apply(
        lambda v: controller_user_data(cfg, *v))
    policy = pulumi.Output.all(
        account_id, storage.bucket.arn, storage.key.arn, pulumi.Output.all(*[q.queue.arn for q in inlets.values()]),
        pulumi.Output.all(*[q.dlq.arn for q in inlets.values()]), monitoring.log_group.arn,
        identity.munge_secret.arn, identity.role.arn, template_arns, subnet_ids, network.node_sg.id, image_id,
        groups, network.vpc_id).apply(lambda v: policies.controller_policy(
            cfg.region, v[0], cfg.stack, v[1], v[2], list(v[3]), list(v[4]), *v[5:8], launch_template_arns=list(v[8]),
            metric_namespace=names.metric_namespace, vpc_id=v[13],
            **ctl.policy_args(cfg.region, v[0], list(v[9]), [v[10]], v[11], [g for g in v[12].values() if g])))
    controller = Controller("controller", ControllerArgs(
        prefix=names.prefix, instance_type=cfg.controller.instance_type, image_id=image_id,
        root_device_name=ami.root_device_name, network_interface_id=network.controller_eni.id,
        role_name=identity.controller_role.name, instance_profile_name=identity.controller_profile.name,
        policy=policy, key_arn=storage.key.arn, user_data=user_data, tags=tags))
    monitoring.watch_controller(controller.instance.id)

    console = f"https://{cfg.region}.console.aws.amazon.com/cloudwatch/home?region={cfg.region}"
    return {
        "region": cfg.region,
        "bucket": storage.bucket.bucket,
        "accessLogBucket": storage.log_bucket.bucket if storage.log_bucket else None,
        "kmsKey": storage.key.arn,
        "queueUrl": queue.queue.url,
        "dlqUrl": queue.dlq.url,
        "teamQueues": {t: q.queue.url for t, q in inlets.items()},
        "teamDeadLetterQueues": {t: q.dlq.url for t, q in inlets.items()},
        "submitRoles": {t: q.submit_role.arn for t, q in inlets.items()},
        "controller": controller.instance.id,
        "controllerAddress": network.controller_eni.private_ip,
        "partitions": [p.name for p in cfg.partitions],
        "launchTemplates": templates,
        "ami": image_id,
        "nodeRole": identity.role.arn,
        "jobRole": identity.job_role.arn,
        "controllerRole": identity.controller_role.arn,
        "instanceProfile": identity.instance_profile.arn,
        "mungeKeySecret": identity.munge_secret.arn,
        "sharedFileSystem": shared.fs.id,
        "vpcId": network.vpc_id,
        "subnetIds": network.subnet_ids,
        "nodeSecurityGroup": network.node_sg.id,
        "controllerSecurityGroup": network.controller_sg.id,
        "placementGroups": groups,
        "logGroup": monitoring.log_group.name,
        "flowLogGroup": flow_logs.log_group.name,
        "dnsQueryLogGroup": dns.log_group.name if dns else None,
        "metricNamespace": names.metric_namespace,
        "alertTopic": monitoring.topic.arn,
        "dashboard": monitoring.dashboard.dashboard_name,
        "dashboardUrl": monitoring.dashboard.dashboard_name.apply(lambda n: f"{console}#dashboards:name={n}"),
        "budget": monitoring.budget.name,
        "efaInterfacesPerNode": {p.name: efa.efa_count(efa.layout(p.primary, p.multi_node)) for p in cfg.partitions},
        "checkpointUriTemplate": storage.bucket.bucket.apply(lambda b: f"s3://{b}/teams/<team>/jobs/<job_id>/"),
        "teams": [t.name for t in cfg.teams],
        "registry": images.repository_url,
    }
