"""The Azure stack: wires the components in data-flow order and returns the outputs to export."""
from __future__ import annotations

import base64

import pulumi
from pulumi_azure_native import authorization

from infra.azure import derive
from infra.azure.compute import ScaleSet, ScaleSetArgs
from infra.azure.group import ResourceGroup
from infra.azure.identity import Identity, IdentityArgs
from infra.azure.monitoring import Autoscale, AutoscaleArgs
from infra.azure.network import Network, NetworkArgs
from infra.azure.queue import JobQueue, JobQueueArgs
from infra.azure.registry import Registry, RegistryArgs, registry_name
from infra.azure.storage import Storage, StorageArgs
from infra.azure.vault import Vault, VaultArgs, vault_name
from infra.config import StackConfig


def _custom_data(node: dict) -> str:
    from infra.userdata import render_user_data  # images area; imported when the values are known

    return base64.b64encode(render_user_data(node).encode()).decode()


def build_azure(cfg: StackConfig) -> dict[str, pulumi.Input]:
    name = derive.base_name(cfg.stack)
    tags = cfg.all_tags
    location = cfg.region
    client = authorization.get_client_config_output()

    group = ResourceGroup("group", group_name=name, location=location, tags=tags)
    net = Network("network", NetworkArgs(name=name, resource_group=group.group_name, location=location, tags=tags))
    store = Storage("storage", StorageArgs(
        account_name=derive.storage_account_name(cfg.stack, location), resource_group=group.group_name,
        location=location, subnet_id=net.subnet_id, tags=tags))
    jobs = JobQueue("queue", JobQueueArgs(account_name=store.account.name, resource_group=group.group_name))
    ident = Identity("identity", IdentityArgs(
        name=f"{name}-nodes", resource_group=group.group_name, location=location,
        subscription_id=client.subscription_id, container_id=store.container_id,
        queue_ids=(jobs.queue_id, jobs.poison_queue_id), tags=tags))

    images = Registry("registry", RegistryArgs(
        name=registry_name(cfg.stack, location), resource_group=group.group_name, location=location,
        subnet_id=net.subnet_id, vnet_id=net.vnet.id, subscription_id=client.subscription_id,
        principal_id=ident.principal_id, tags=tags))

    secrets = Vault("vault", VaultArgs(
        name=vault_name(cfg.stack, location), resource_group=group.group_name, location=location,
        tenant_id=client.tenant_id, subnet_id=net.subnet_id, vnet_id=net.vnet.id,
        subscription_id=client.subscription_id, principal_id=ident.principal_id, tags=tags))

    scale_set_name = f"{name}-nodes"
    custom_data = pulumi.Output.all(store.container_url, jobs.queue_url, ident.client_id, group.group_name,
                                    client.subscription_id, images.login_server, secrets.vault_name).apply(
        lambda v: _custom_data(derive.node_settings(
            cfg, container_url=v[0], queue_url=v[1], scale_set=scale_set_name, client_id=v[2],
            resource_group=v[3], subscription_id=v[4], registry=v[5], key_vault=v[6])))
    queue_mode = cfg.mode == "queue"
    vmss = ScaleSet("compute", ScaleSetArgs(
        name=scale_set_name, resource_group=group.group_name, location=location, size=cfg.primary.name,
        capacity=cfg.nodes.desired, spot=cfg.spot, subnet_id=net.subnet_id, identity_id=ident.id,
        ssh_public_key=cfg.ssh_public_key, image=derive.image(cfg.image), custom_data=custom_data,
        accelerated_networking=cfg.primary.name in derive.ACCELERATED_NETWORKING, tags=tags,
        autoscaled=queue_mode, wait_for=(*ident.role_assignments, images.pull_role, secrets.read_role)))
    outputs: dict[str, pulumi.Input] = {
        "resourceGroup": group.group_name,
        "location": location,
        "vnetCidr": derive.VNET_CIDR,
        "subnetId": net.subnet_id,
        "storageAccount": store.account.name,
        "containerUrl": store.container_url,
        "queueUrl": jobs.queue_url,
        "poisonQueueUrl": jobs.poison_url,
        "vmssName": vmss.vmss_name,
        "vmssId": vmss.id,
        "identityClientId": ident.client_id,
        "identityPrincipalId": ident.principal_id,
        "registry": images.login_server,
        "keyVault": secrets.vault_name,
    }
    if queue_mode:
        scaler = Autoscale("autoscale", AutoscaleArgs(
            name=f"{name}-autoscale", resource_group=group.group_name, location=location, scale_set_id=vmss.id,
            capacity=derive.capacity(cfg),
            rules=derive.queue_rules(store.account_id.apply(derive.queue_metric_uri)),
            alerts=cfg.alert_targets, tags=tags))
        outputs["autoscaleSetting"] = scaler.setting.name
    return outputs
