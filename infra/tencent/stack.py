"""Wire the Tencent components of one stack and return its outputs.

A Slurm cluster: the controller (slurmctld, the bridge, power saving) and, per partition, a launch template its GPU
nodes start from when slurmctld powers them up (trainer.clouds.tencent_nodes); the shared file systems (CFS), the
munge key's SSM secret, the job queue (TDMQ CMQ), the bucket (COS) and the monitoring around them.
"""
from __future__ import annotations

import pulumi
from tencentcloud_iac_pulumi import images, instance, user

from infra import slurm
from infra.config import StackConfig, TencentImage
from infra.tencent import derive
from infra.tencent.controller import Controller, ControllerArgs
from infra.tencent.identity import Identity
from infra.tencent.monitoring import Monitoring, MonitoringArgs
from infra.tencent.network import Network, NetworkArgs
from infra.tencent.partition import PartitionArgs, PartitionNodes
from infra.tencent.queue import JobQueue, JobQueueArgs
from infra.tencent.shared_fs import SharedFs, SharedFsArgs
from infra.tencent.storage import Storage, StorageArgs
from infra.userdata import render_controller_user_data
from trainer.slurm.conf import render_gres_conf, render_slurm_conf


def family(instance_type: str) -> str:
    """The CVM instance family of a type: GN10Xp.20XLARGE320 -> GN10Xp."""
    return instance_type.split(".", 1)[0]


def offered_zones(instance_types: list[str]) -> pulumi.Output[list]:
    """Zones of the region that sell every one of `instance_types` now (pay-as-you-go or spot): one lookup per
    instance family."""
    by_family: dict[str, list[str]] = {}
    for name in dict.fromkeys(instance_types):
        by_family.setdefault(family(name), []).append(name)
    found = [instance.get_types_output(filters=[{"name": "instance-family", "values": [fam]}], exclude_sold_out=True)
             .instance_types.apply(lambda rows, names=names: [
                 sorted({r.availability_zone for r in rows if r.instance_type == n}) for n in names])
             for fam, names in by_family.items()]
    return pulumi.Output.all(*found).apply(lambda groups: derive.common_zones([z for g in groups for z in g]))


def image_id(image: TencentImage) -> pulumi.Input[str]:
    """The image by id, or the newest private image whose name matches the pattern."""
    if image.id is not None:
        return image.id
    found = images.get_instance_output(image_name_regex=image.name, image_types=["PRIVATE_IMAGE"])

    def newest(rows) -> str:
        if not rows:
            raise ValueError(f"gpufleet:image: no private image matches {image.name!r}")
        return max(rows, key=lambda r: r.created_time or "").image_id

    return found.images.apply(newest)


def controller_user_data(cfg: StackConfig, settings: dict, nodes: dict) -> str:
    cluster = slurm.cluster(cfg, derive.CONTROLLER_HOSTNAME, derive.PROGRAMS, controller_addr=derive.CONTROLLER_IP)
    return render_controller_user_data(settings, render_slurm_conf(cluster), render_gres_conf(cluster), nodes)


def build_tencent(cfg: StackConfig) -> dict[str, pulumi.Input]:
    names = derive.Names.of(cfg.stack)
    tags = cfg.all_tags
    account = user.get_info_output()
    app_id, uin = account.app_id, account.owner_uin
    image = image_id(cfg.image)

    network = Network("network", NetworkArgs(
        prefix=names.prefix, zones=offered_zones([p.primary.name for p in cfg.partitions]),
        node_subnets=derive.node_subnet_count(cfg), tags=tags))
    storage = Storage("storage", StorageArgs(prefix=names.prefix, stack=cfg.stack, region=cfg.region, app_id=app_id,
                                             access_logging=cfg.data_classification == "personal", tags=tags))
    # each team its queue and submit group; the first team's keeps the names the stack had before teams had queues
    queues = derive.team_queues(names, [t.name for t in cfg.teams])
    inlets = {team: JobQueue("queue" if i == 0 else f"queue-{team}", JobQueueArgs(
        queue=q, dlq=dlq, region=cfg.region, team=team, group=derive.submit_group(names, team),
        policy=pulumi.Output.all(app_id, uin, storage.bucket_name, storage.key_id).apply(
            lambda v, q=q, dlq=dlq, team=team: derive.submit_policy(
                region=cfg.region, app_id=v[0], uin=v[1], bucket=v[2], key_id=v[3], queue=q, dlq=dlq, team=team))))
        for i, (team, (q, dlq)) in enumerate(queues.items())}
    queue = inlets[cfg.teams[0].name]
    monitoring = Monitoring("monitoring", MonitoringArgs(
        names=names, stack=cfg.stack, classification=cfg.data_classification,
        budget_monthly_cny=cfg.budget_monthly, dlqs=[(q.dlq.id, q.dlq.queue_name) for q in inlets.values()],
        tags=tags))
    identity = Identity("identity", names, storage.key_id, tags)
    identity.grant(names.role, pulumi.Output.all(app_id, uin, storage.bucket_name, storage.key_id,
                                                 monitoring.topic_id, identity.munge_secret.secret_name,
                                                 network.vpc_id).apply(
        lambda v: derive.node_policy(region=cfg.region, app_id=v[0], uin=v[1], bucket=v[2], key_id=v[3],
                                     topic_id=v[4], munge_secret=v[5], job_role=names.job_role, vpc_id=v[6])))
    identity.jobs(names, uin, pulumi.Output.all(app_id, uin, storage.bucket_name, storage.key_id,
                                                network.vpc_id).apply(
        lambda v: derive.job_role_policy(region=cfg.region, app_id=v[0], uin=v[1], bucket=v[2], key_id=v[3],
                                         vpc_id=v[4])),
        tags)
    shared = SharedFs("shared-fs", SharedFsArgs(
        prefix=names.prefix, zone=network.controller_zone, vpc_id=network.vpc_id,
        subnet_id=network.controller_subnet.id, node_cidrs=network.node_cidrs, tags=tags))

    subnets, zones, templates = {}, {}, {}
    for part in cfg.partitions:
        placed = pulumi.Output.all(network.subnet_ids, network.subnet_zones).apply(
            lambda v, part=part: derive.partition_subnets(part, v[0], v[1]))
        subnets[part.name] = placed.apply(lambda v: v[0])
        zones[part.name] = placed.apply(lambda v: v[1])
        settings = pulumi.Output.all(storage.bucket_name, app_id, monitoring.topic_id,
                                     identity.munge_secret.secret_name, shared.home.mount_ip, uin).apply(
            lambda v, part=part: derive.node_settings(cfg, part, names, bucket=v[0], app_id=v[1], log_topic=v[2],
                                                      munge_secret=v[3], home_ip=v[4], uin=v[5]))
        templates[part.name] = PartitionNodes(f"partition-{part.name}", PartitionArgs(
            prefix=names.prefix, partition=part, image_id=image, vpc_id=network.vpc_id,
            subnet_ids=subnets[part.name], zones=zones[part.name], security_group_id=network.security_group_id,
            role_name=identity.role_name, node_settings=settings, tags=tags)).launch_template.id

    template_ids = pulumi.Output.all(**templates)
    nodes = pulumi.Output.all(template_ids, network.vpc_id, pulumi.Output.all(**subnets),
                              pulumi.Output.all(**zones)).apply(
        lambda v: derive.nodes_config(cfg, names, templates=v[0], vpc_id=v[1], subnets=v[2], zones=v[3]))
    settings = pulumi.Output.all(storage.bucket_name, app_id, monitoring.topic_id, identity.munge_secret.secret_name,
                                 shared.home.mount_ip, shared.state.mount_ip).apply(
        lambda v: derive.controller_settings(cfg, names, bucket=v[0], app_id=v[1], log_topic=v[2], munge_secret=v[3],
                                             home_ip=v[4], state_ip=v[5]))
    policy = pulumi.Output.all(app_id, uin, storage.bucket_name, storage.key_id, identity.munge_secret.secret_name,
                               identity.role_name, network.vpc_id, network.subnet_ids, network.security_group_id,
                               image).apply(
        lambda v: derive.controller_policy(
            region=cfg.region, app_id=v[0], uin=v[1], stack=cfg.stack, bucket=v[2], key_id=v[3],
            queues=[q for q, _ in queues.values()], dlqs=[d for _, d in queues.values()], munge_secret=v[4],
            node_role=v[5], vpc_id=v[6], subnet_ids=list(v[7]),
            security_group_id=v[8], image_id=v[9]))
    controller = Controller("controller", ControllerArgs(
        prefix=names.prefix, policy_name=names.controller_role, instance_type=cfg.controller.instance_type,
        image_id=image, zone=network.controller_zone, vpc_id=network.vpc_id, subnet_id=network.controller_subnet.id,
        security_group_id=network.controller_sg.id, role_id=identity.controller_role.id,
        role_name=identity.controller_role.name, policy=policy,
        user_data=pulumi.Output.all(settings, nodes).apply(lambda v: controller_user_data(cfg, *v)),
        ready=[identity.munge_init, *shared.rules], tags=tags))
    monitoring.watch_controller(controller.instance.id)

    return {
        "region": cfg.region,
        "appId": app_id,
        "bucket": storage.bucket_name,
        "accessLogBucket": storage.log_bucket.bucket if storage.log_bucket else None,
        "cosEndpoint": derive.cos_endpoint(cfg.region),
        "kmsKey": storage.key_id,
        "queueUrl": queue.url,
        "dlqUrl": queue.dlq_url,
        "teamQueues": {t: q.url for t, q in inlets.items()},
        "teamDeadLetterQueues": {t: q.dlq_url for t, q in inlets.items()},
        "teamSubmitGroups": {t: q.group.name for t, q in inlets.items()},
        "controller": controller.instance.id,
        "controllerAddress": controller.instance.private_ip,
        "partitions": [p.name for p in cfg.partitions],
        "launchTemplates": template_ids,
        "image": image,
        "nodeRole": identity.role_name,
        "controllerRole": identity.controller_role.name,
        "jobRole": identity.job_role.name,
        "mungeKeySecret": identity.munge_secret.secret_name,
        "sharedFileSystem": shared.home.id,
        "slurmStateFileSystem": shared.state.id,
        "vpcId": network.vpc_id,
        "subnetIds": network.subnet_ids,
        "controllerSubnet": network.controller_subnet.id,
        "nodeSecurityGroup": network.security_group_id,
        "controllerSecurityGroup": network.controller_sg.id,
        "logTopic": monitoring.topic_id,
        "alertGroup": monitoring.group.name,
        "budget": monitoring.budget.budget_name,
        "checkpointUriTemplate": storage.bucket_name.apply(lambda b: f"cos://{b}/teams/<team>/jobs/<job_id>/"),
        "teams": [t.name for t in cfg.teams],
    }
