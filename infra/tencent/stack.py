"""The Tencent stack: wires the components in data-flow order and returns the outputs to export."""
from __future__ import annotations

import pulumi
from tencentcloud_iac_pulumi import images, instance, user

from infra import scaling
from infra.config import StackConfig, TencentImage
from infra.tencent import derive
from infra.tencent.compute import Compute, ComputeArgs
from infra.tencent.identity import Identity
from infra.tencent.monitoring import Monitoring, MonitoringArgs
from infra.tencent.network import Network, NetworkArgs
from infra.tencent.queue import JobQueue, JobQueueArgs
from infra.tencent.scaler import Scaler, ScalerArgs
from infra.tencent.storage import Storage, StorageArgs


def family(instance_type: str) -> str:
    """The CVM instance family of a type: GN10Xp.20XLARGE320 -> GN10Xp."""
    return instance_type.split(".", 1)[0]


def offered_zones(instance_type: str) -> pulumi.Output[list]:
    """Zones of the region that sell `instance_type` now (pay-as-you-go or spot)."""
    found = instance.get_types_output(filters=[{"name": "instance-family", "values": [family(instance_type)]}],
                                      exclude_sold_out=True)
    return found.instance_types.apply(
        lambda rows: sorted({r.availability_zone for r in rows if r.instance_type == instance_type}))


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


def build_tencent(cfg: StackConfig) -> dict[str, pulumi.Input]:
    names = derive.Names.of(cfg.stack)
    tags = cfg.all_tags
    gang = cfg.mode == "gang"
    account = user.get_info_output()
    app_id, uin = account.app_id, account.owner_uin

    network = Network("network", NetworkArgs(prefix=names.prefix, zones=offered_zones(cfg.primary.name),
                                             single_zone=gang, tags=tags))
    storage = Storage("storage", StorageArgs(prefix=names.prefix, stack=cfg.stack, region=cfg.region, app_id=app_id,
                                             access_logging=cfg.data_classification == "personal", tags=tags))
    queue = JobQueue("queue", JobQueueArgs(queue=names.queue, dlq=names.dlq, region=cfg.region))
    monitoring = Monitoring("monitoring", MonitoringArgs(
        names=names, stack=cfg.stack, classification=cfg.data_classification,
        budget_monthly_cny=cfg.budget_monthly, dlq_id=queue.dlq.id, dlq_name=queue.dlq.queue_name, tags=tags))
    identity = Identity("identity", names.role, tags)
    settings = pulumi.Output.all(storage.bucket_name, app_id, monitoring.topic_id).apply(
        lambda v: derive.node_settings(cfg, names, bucket=v[0], app_id=v[1], log_topic=v[2]))
    capacity = scaling.capacity(cfg.mode, cfg.nodes.min, cfg.nodes.max, cfg.nodes.desired)
    compute = Compute("compute", ComputeArgs(
        prefix=names.prefix, names=names, mode=cfg.mode, capacity=capacity, instance_types=cfg.instance_types,
        spot=cfg.spot, image_id=image_id(cfg.image), vpc_id=network.vpc_id, subnet_ids=network.subnet_ids,
        security_group_id=network.security_group_id, role_name=identity.role_name, node_settings=settings,
        tags=tags))
    identity.grant(names.role, pulumi.Output.all(app_id, uin, storage.bucket_name, storage.key_id,
                                                 compute.group.id, monitoring.topic_id).apply(
        lambda v: derive.node_policy(region=cfg.region, app_id=v[0], uin=v[1], bucket=v[2], key_id=v[3],
                                     queue=names.queue, dlq=names.dlq, group_id=v[4], topic_id=v[5])))
    outputs: dict[str, pulumi.Input] = {
        "region": cfg.region,
        "appId": app_id,
        "bucket": storage.bucket_name,
        "accessLogBucket": storage.log_bucket.bucket if storage.log_bucket else None,
        "cosEndpoint": derive.cos_endpoint(cfg.region),
        "kmsKey": storage.key_id,
        "queueUrl": queue.url,
        "dlqUrl": queue.dlq_url,
        "scalingGroup": compute.group.id,
        "scalingGroupName": names.group,
        "launchConfiguration": compute.config.id,
        "nodeRole": identity.role_name,
        "vpcId": network.vpc_id,
        "subnetIds": network.subnet_ids,
        "nodeSecurityGroup": network.security_group_id,
        "logTopic": monitoring.topic_id,
        "alertGroup": monitoring.group.name,
        "budget": monitoring.budget.budget_name,
        "checkpointUriTemplate": storage.bucket_name.apply(lambda b: f"cos://{b}/jobs/<job_id>/"),
    }
    if not gang:
        scaler = Scaler("scaler", ScalerArgs(names=names, region=cfg.region, uin=uin, group_id=compute.group.id,
                                             min_size=capacity.min, max_size=capacity.max, tags=tags))
        outputs["scaler"] = scaler.function.name
    return outputs
