"""The Azure stack: a Slurm cluster. Wires the components in data-flow order and returns the outputs to export.

The controller (slurmctld, the bridge, power saving) on its own VM, and, per partition, the group its GPU nodes
join when slurmctld powers them up (the node provider creates and deletes the VMs); the shared file system, the
munge key's secret, the job queue, the blob container, the registry, the VNet's DNS firewall and the monitoring
around them.
"""
from __future__ import annotations

import base64

import pulumi
from pulumi_azure_native import authorization

from infra.azure import derive
from infra.azure.controller import Controller, ControllerArgs, controller_user_data, encode
from infra.azure.dns_firewall import DnsFirewall, DnsFirewallArgs
from infra.azure.group import ResourceGroup
from infra.azure.identity import Identity, IdentityArgs, custom_role, custom_role_id
from infra.azure.monitoring import Monitoring, MonitoringArgs
from infra.azure.network import Network, NetworkArgs
from infra.azure.partition import PartitionArgs, PartitionNodes
from infra.azure.queue import JobQueue, JobQueueArgs
from infra.azure.registry import Registry, RegistryArgs, registry_name
from infra.azure.shared_fs import SharedFs, SharedFsArgs
from infra.azure.storage import Storage, StorageArgs
from infra.azure.vault import Vault, VaultArgs, vault_name
from infra.config import StackConfig
from infra.userdata import render_node_user_data


def node_custom_data(node: dict) -> str:
    """A node's base64 cloud-config (nodes.json's custom_data)."""
    return base64.b64encode(render_node_user_data(node).encode()).decode()


def build_azure(cfg: StackConfig) -> dict[str, pulumi.Input]:
    name = derive.base_name(cfg.stack)
    tags = cfg.all_tags
    location = cfg.region
    client = authorization.get_client_config_output()
    sub = client.subscription_id

    group = ResourceGroup("group", group_name=name, location=location, tags=tags)
    nodes_group = ResourceGroup("nodes-group", group_name=derive.nodes_group_name(cfg.stack), location=location,
                                tags=tags)
    net = Network("network", NetworkArgs(name=name, resource_group=group.group_name, location=location,
                                         controller_size=cfg.controller.instance_type, tags=tags))
    dns = DnsFirewall("dns-firewall", DnsFirewallArgs(
        name=name, resource_group=group.group_name, location=location, vnet_id=net.vnet.id,
        classification=cfg.data_classification, tags=tags))
    store = Storage("storage", StorageArgs(
        account_name=derive.storage_account_name(cfg.stack, location), resource_group=group.group_name,
        location=location, subnet_ids=(net.subnet_id, net.controller_subnet_id), tags=tags))
    # each team its queue (the first team's keeps the stack's names) and, where the config names its Entra group,
    # that group's submit rights; the blob part is a custom role of the container's, made once if a team needs it
    submit_role = [custom_role(
        "storage-submit-blobs", sub, cfg.stack, location, group.group_id, "submit-blobs",
        "gpufleet: a team's submitters keep its records and bundles (held to its prefix by each assignment's "
        "condition)", data_actions=derive.SUBMIT_BLOB_DATA_ACTIONS, opts=pulumi.ResourceOptions(parent=store))
    ] if any(t.azure_group for t in cfg.teams) else []
    queues = derive.team_queues([t.name for t in cfg.teams])
    inlets = {team.name: JobQueue("queue" if i == 0 else f"queue-{team.name}", JobQueueArgs(
        account_name=store.account.name, resource_group=group.group_name, team=team.name,
        queue=queues[team.name][0], poison=queues[team.name][1], subscription_id=sub,
        container_id=store.container_id, submit_role=custom_role_id(sub, cfg.stack, location, "submit-blobs"),
        group=team.azure_group, after=tuple(submit_role)))
        for i, team in enumerate(cfg.teams)}
    jobs = inlets[cfg.teams[0].name]
    ident = Identity("identity", IdentityArgs(
        name=name, stack=cfg.stack, resource_group=group.group_name, resource_group_id=group.group_id,
        location=location, subscription_id=sub, container_id=store.container_id,
        queue_ids=tuple(i for q in inlets.values() for i in (q.queue_id, q.poison_queue_id)),
        nodes_group_id=nodes_group.group_id,
        node_subnet_id=net.subnet_id, image_definition_id=derive.gallery_image_definition(cfg.image), tags=tags,
        teams=tuple(t.name for t in cfg.teams)))
    images = Registry("registry", RegistryArgs(
        name=registry_name(cfg.stack, location), resource_group=group.group_name, location=location,
        subnet_id=net.subnet_id, vnet_id=net.vnet.id, subscription_id=sub,
        principal_id=ident.principal_id, tags=tags,
        job_principal_ids={t: i.principal_id for t, i in ident.teams.items()}))
    secrets = Vault("vault", VaultArgs(
        name=vault_name(cfg.stack, location), resource_group=group.group_name, location=location,
        tenant_id=client.tenant_id, subnet_id=net.subnet_id, vnet_id=net.vnet.id, subscription_id=sub,
        resource_group_id=group.group_id, stack=cfg.stack, principal_id=ident.principal_id,
        controller_principal_id=ident.controller_principal_id, tags=tags))
    shared = SharedFs("shared-fs", SharedFsArgs(
        account_name=derive.files_account_name(cfg.stack, location), resource_group=group.group_name,
        location=location, subnet_id=net.subnet_id, vnet_id=net.vnet.id, tags=tags))
    monitoring = Monitoring("monitoring", MonitoringArgs(
        name=name, stack=cfg.stack, resource_group=group.group_name, alerts=cfg.alert_targets, tags=tags))

    slurm_ = pulumi.Output.all(net.controller_address, secrets.munge_url).apply(
        lambda v: derive.slurm_settings(*v))
    team_client_ids = pulumi.Output.all(**{t: i.client_id for t, i in ident.teams.items()})
    team_identity_ids = pulumi.Output.all(*(i.id for i in ident.teams.values()))
    parts: dict[str, PartitionNodes] = {}
    nodes_parts = {}
    for part in cfg.partitions:
        parts[part.name] = PartitionNodes(f"partition-{part.name}", PartitionArgs(
            prefix=name, partition=part, resource_group=nodes_group.group_name, location=location, tags=tags))
        node = pulumi.Output.all(store.container_url, ident.client_id, nodes_group.group_name, sub,
                                 images.login_server, secrets.vault_name, slurm_, shared.node_mounts,
                                 team_client_ids).apply(
            lambda v, part=part: derive.node_settings(
                cfg, part, container_url=v[0], client_id=v[1], resource_group=v[2],
                subscription_id=v[3], registry=v[4], key_vault=v[5], slurm_=v[6], mounts=v[7],
                team_client_ids=v[8]))
        nodes_parts[part.name] = pulumi.Output.all(
            sub, nodes_group.group_name, parts[part.name].group_id, net.subnet_id, ident.id,
            node.apply(node_custom_data), team_identity_ids).apply(
            lambda v, part=part: derive.partition_nodes(
                cfg, part, subscription_id=v[0], resource_group=v[1], group_id=v[2], subnet_id=v[3],
                identity_id=v[4], custom_data=v[5], team_identity_ids=tuple(v[6])))
    nodes = pulumi.Output.all(pulumi.Output.all(**nodes_parts), ident.controller_client_id).apply(
        lambda v: derive.nodes_config(cfg, v[0], v[1]))
    settings = pulumi.Output.all(store.container_url, store.account.name, slurm_, shared.controller_mounts,
                                 ident.controller_client_id, group.group_name, sub, secrets.vault_name).apply(
        lambda v: derive.controller_settings(
            cfg, container_url=v[0], account=v[1], slurm_=v[2], mounts=v[3], client_id=v[4],
            resource_group=v[5], subscription_id=v[6], key_vault=v[7]))
    custom_data = pulumi.Output.all(net.controller_address, settings, nodes).apply(
        lambda v: encode(controller_user_data(cfg, *v)))
    controller = Controller("controller", ControllerArgs(
        prefix=name, size=cfg.controller.instance_type, resource_group=group.group_name, location=location,
        image=derive.image(cfg.image), network_interface_id=net.controller_nic.id, identity_id=ident.controller_id,
        ssh_public_key=cfg.ssh_public_key, custom_data=custom_data, disk_encryption_set_id=None, tags=tags,
        # its rights, its file systems and its secret before it boots
        wait_for=(*ident.controller_roles, secrets.munge_keep_role, shared, *parts.values())))
    monitoring.watch_controller(controller.vm.id)

    return {
        "resourceGroup": group.group_name,
        "nodesResourceGroup": nodes_group.group_name,
        "location": location,
        "vnetCidr": derive.VNET_CIDR,
        "subnetId": net.subnet_id,
        "dnsQueryWorkspace": dns.workspace.name,
        "controllerSubnetId": net.controller_subnet_id,
        "storageAccount": store.account.name,
        "containerUrl": store.container_url,
        "queueUrl": jobs.queue_url,
        "poisonQueueUrl": jobs.poison_url,
        "teamQueues": {t: q.queue_url for t, q in inlets.items()},
        "teamDeadLetterQueues": {t: q.poison_url for t, q in inlets.items()},
        "controller": controller.vm.name,
        "controllerId": controller.vm.id,
        "controllerAddress": net.controller_address,
        "controllerIdentityClientId": ident.controller_client_id,
        "controllerIdentityPrincipalId": ident.controller_principal_id,
        "partitions": [p.name for p in cfg.partitions],
        "partitionGroups": pulumi.Output.all(**{n: p.group_id for n, p in parts.items()}),
        "identityClientId": ident.client_id,
        "identityPrincipalId": ident.principal_id,
        "teamIdentityClientIds": team_client_ids,
        "registry": images.login_server,
        "keyVault": secrets.vault_name,
        "mungeKeySecret": secrets.munge_url,
        "mungeKeySecretId": secrets.munge.id,
        "sharedFilesAccount": shared.account.name,
        "sharedFileShares": {share: fs.name for share, fs in shared.shares.items()},
        "homeShare": shared.node_mounts.apply(lambda m: m[0]["source"]),
        "actionGroup": monitoring.action_group.id,
        "checkpointUriTemplate": store.container_url.apply(lambda u: f"{u}/teams/<team>/jobs/<job_id>/"),
        "teams": [t.name for t in cfg.teams],
    }
