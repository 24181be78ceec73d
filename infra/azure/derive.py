"""Pure derivations for the Azure stack: names, address plan, image reference, the controller's and the nodes'
settings documents (controller.json, nodes.json, node.json), the shared file system's mounts and the custom roles'
permissions. No Pulumi here; the components turn these values into resources."""
from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from typing import Optional

from infra import slurm
from infra.config import Partition, StackConfig
from infra.userdata import controller_json, node_json
from trainer.jobs.layout import team_prefix
from infra.preview.cost import AZURE_OS_DISK_GB as NODE_OS_DISK_GB  # the preview prices what the stack makes

# The RDMA/InfiniBand network of ND-series VMs uses 172.16.0.0/16: the VNet must not overlap it.
VNET_CIDR = "10.64.0.0/16"
NODE_SUBNET_CIDR = "10.64.0.0/20"          # GPU nodes and the private endpoints
CONTROLLER_SUBNET_CIDR = "10.64.16.0/24"   # the controller alone
# The controller's address: static on a NIC of its own that outlives the VM (Azure keeps .0-.3 of a subnet).
CONTROLLER_IP = "10.64.16.4"
ADMIN_USER = "azureuser"
JOBS_QUEUE = "jobs"
POISON_QUEUE = f"{JOBS_QUEUE}-poison"
CONTAINER = "checkpoints"
MUNGE_SECRET = "slurm-munge-key"           # the Key Vault secret that holds the cluster's munge key
MUNGE_TAG = "gpufleet-munge"               # trainer.clouds.azure_nodes.MUNGE_TAG: unset | generated | set
MUNGE_PLACEHOLDER = "unset"                # trainer.clouds.azure_nodes.UNSET: the controller makes the key
HOME = "/home"
HOME_SHARE = "home"
STATE_SHARE = "slurm-state"
# The AZNFS mount helper's fstab type: NFS 4.1 through its stunnel TLS tunnel (the account requires secure
# transfer, so Azure Files refuses a mount without TLS).
MOUNT_TYPE = "aznfs"
MOUNT_OPTIONS = "vers=4.1,sec=sys,proto=tcp"

# Built-in role definition GUIDs (identical in every tenant).
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
# The bridge receives, deletes, *updates* (a message's lease: Update Message needs queues/messages/write) and adds
# (moves to the poison queue) messages. Storage Queue Data Message Processor grants only read + process, so the
# Contributor role is assigned, scoped to the two queues and nothing else.
STORAGE_QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
# Managed Identity Operator: read and assign (*/assign/action) user-assigned identities; assigned on the node
# identity alone, it lets the controller give new VMs that identity and no other.
MANAGED_IDENTITY_OPERATOR = "f1a07417-d97a-45cb-824c-7a7467783830"
# A team's submitters (its Entra group, gpufleet:teams[].azureGroup): send to its queue, take back its poison messages
STORAGE_QUEUE_DATA_MESSAGE_SENDER = "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a"
STORAGE_QUEUE_DATA_MESSAGE_PROCESSOR = "8a0f0c08-91a1-4084-bc3d-661d67233fed"
# ... and keep its records and bundles: a custom role of blob data actions only (no container rights through
# Resource Manager, which Storage Blob Data Contributor's actions hold), held to its prefix by a condition.
BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
SUBMIT_BLOB_DATA_ACTIONS = (f"{BLOBS}/read", f"{BLOBS}/write", f"{BLOBS}/add/action")
SUBMIT_READS = ("jobs/", "jobs-index/", "code/")     # under the team's prefix (as AWS's submit role)
SUBMIT_WRITES = ("jobs/", "code/")
READER = "acdd72a7-3385-48ef-bd42-f606fba81ae7"  # on a gallery image definition: the controller may use it

# What the controller's node provider (trainer.clouds.azure_nodes) does in the nodes' resource group: create,
# read and delete VMs, their NICs and OS disks (deleteOption Delete), put VMs into a partition's scale set or
# availability set, and follow the long-running operations. Compute's and Network's own operation reads are
# listed because the provider polls their Azure-AsyncOperation URLs.
NODE_LAUNCH_ACTIONS = (
    "Microsoft.Compute/virtualMachines/read", "Microsoft.Compute/virtualMachines/write",
    "Microsoft.Compute/virtualMachines/delete",
    "Microsoft.Compute/disks/read", "Microsoft.Compute/disks/write", "Microsoft.Compute/disks/delete",
    "Microsoft.Compute/virtualMachineScaleSets/read", "Microsoft.Compute/virtualMachineScaleSets/write",
    "Microsoft.Compute/availabilitySets/read", "Microsoft.Compute/availabilitySets/write",
    "Microsoft.Compute/locations/operations/read",
    "Microsoft.Network/networkInterfaces/read", "Microsoft.Network/networkInterfaces/write",
    "Microsoft.Network/networkInterfaces/delete", "Microsoft.Network/networkInterfaces/join/action",
    "Microsoft.Network/locations/operations/read", "Microsoft.Network/locations/operationResults/read",
)
# On the node subnet alone: put a NIC in it.
SUBNET_JOIN_ACTIONS = ("Microsoft.Network/virtualNetworks/subnets/read",
                       "Microsoft.Network/virtualNetworks/subnets/join/action")
# On the munge secret alone: what trainer.clouds.azure_nodes.munge_key(create=True) calls (get the latest and a
# given version, list versions, set a new version). Key Vault Secrets Officer would add delete, purge, backup...
MUNGE_KEEPER_DATA_ACTIONS = ("Microsoft.KeyVault/vaults/secrets/getSecret/action",
                             "Microsoft.KeyVault/vaults/secrets/readMetadata/action",
                             "Microsoft.KeyVault/vaults/secrets/setSecret/action")

# Sizes whose NICs support accelerated networking (every ND-series GPU size in the catalog, and the controller's).
ACCELERATED_NETWORKING = frozenset({
    "Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4", "Standard_ND96isr_H100_v5",
    "Standard_D2s_v5", "Standard_D4s_v5", "Standard_D8s_v5",
})

# Marketplace publishers whose images carry no purchase plan: Microsoft's own and the endorsed
# distributions. Any other publisher's image is sold under marketplace terms and needs `plan`.
NO_PLAN_PUBLISHERS = frozenset({
    "canonical", "microsoft-dsvm", "microsoftcblmariner", "microsoftwindowsserver", "redhat",
    "suse", "debian", "openlogic", "oracle", "microsoft-aks",
})


def base_name(stack: str) -> str:
    return f"gpufleet-{stack}"


def nodes_group_name(stack: str) -> str:
    """The resource group of the GPU nodes' VMs, NICs and disks (made by the controller), and of the partitions'
    scale sets and availability sets: the one place the controller's compute rights reach."""
    return f"{base_name(stack)}-nodes"


def _account_name(stack: str, region: str, purpose: str = "") -> str:
    digest = hashlib.sha256(f"gpufleet/{stack}/{region}{purpose}".encode()).hexdigest()[:8]
    stem = re.sub(r"[^a-z0-9]", "", stack.lower())[:12]
    return f"gpuf{stem}{digest}"


def storage_account_name(stack: str, region: str) -> str:
    """A globally unique-enough account name: 3-24 lowercase letters and digits, stable per stack+region."""
    return _account_name(stack, region)


def files_account_name(stack: str, region: str) -> str:
    """The FileStorage account of the shared file system (NFS shares need a premium FileStorage account)."""
    return _account_name(stack, region, "/files")


def blob_container_url(account: str, container: str = CONTAINER) -> str:
    return f"https://{account}.blob.core.windows.net/{container}"


def team_queues(teams: list[str]) -> dict[str, tuple[str, str]]:
    """Each team's storage queue and poison queue, ``{team: (queue, poison)}``: the first team's keep the stack's
    names (as before teams had queues), another's are ``jobs-<team>`` and ``jobs-<team>-poison`` (the bridge moves
    a message to ``<queue>-poison``: trainer.clouds.azure)."""
    out = {}
    for i, team in enumerate(teams):
        queue = JOBS_QUEUE if i == 0 else f"{JOBS_QUEUE}-{team}"
        out[team] = (queue, f"{queue}-poison")
    return out


def submit_blob_condition(team: str) -> str:
    """The condition (version 2.0) on a team's submit group's blob role, as Azure's ABAC writes it: reads only under
    ``teams/<team>/{jobs,jobs-index,code}/``, writes only under ``teams/<team>/{jobs,code}/``, listings only with a
    prefix under ``teams/<team>/``."""
    return _prefix_condition(team, SUBMIT_READS, SUBMIT_WRITES, (f"{BLOBS}/write", f"{BLOBS}/add/action"))


def _prefix_condition(team: str, reads: tuple[str, ...], writes: tuple[str, ...], writing: tuple[str, ...]) -> str:
    """Reads (not listings) only under the team's ``reads``, the ``writing`` actions only under its ``writes``,
    listings only with a prefix under ``teams/<team>/``."""
    base = team_prefix(team)
    path, prefix = f"@Resource[{BLOBS}:path]", f"@Request[{BLOBS}:prefix]"

    def under(attribute: str, parts: tuple[str, ...]) -> str:
        return " OR ".join(f"{attribute} StringStartsWith '{base}{p}'" for p in parts)

    read, listing = f"ActionMatches{{'{BLOBS}/read'}}", "SubOperationMatches{'Blob.List'}"
    not_writing = " AND ".join(f"!(ActionMatches{{'{a}'}})" for a in writing)
    return (f"((!({read} AND NOT {listing})) OR ({under(path, reads)}))"
            f" AND (({not_writing}) OR ({under(path, writes)}))"
            f" AND ((!({read} AND {listing})) OR ({prefix} StringStartsWith '{base}'))")


JOB_BLOB_DATA_ACTIONS = (f"{BLOBS}/read", f"{BLOBS}/write", f"{BLOBS}/delete", f"{BLOBS}/add/action")
JOB_WRITES = ("jobs/",)                             # under the team's prefix: its jobs' records, checkpoints, logs
JOB_READS = ("jobs/", "code/", "data/")


def job_blob_condition(team: str) -> str:
    """The condition (version 2.0) on a team's jobs' identity's blob role: reads only under
    ``teams/<team>/{jobs,code,data}/``, writes and deletes only under ``teams/<team>/jobs/``, listings only with a
    prefix under ``teams/<team>/``. No write to ``jobs-index/`` (the bridge keeps it)."""
    writing = (f"{BLOBS}/write", f"{BLOBS}/delete", f"{BLOBS}/add/action")
    return _prefix_condition(team, JOB_READS, JOB_WRITES, writing)


def team_identity_name(name: str, team: str) -> str:
    """A team's jobs' user-assigned identity (every node holds it; only the team's jobs get its tokens)."""
    return f"{name}-team-{team}"


def queue_url(account: str, queue: str = JOBS_QUEUE) -> str:
    return f"https://{account}.queue.core.windows.net/{queue}"


def role_definition_id(subscription_id: str, role_guid: str) -> str:
    return f"/subscriptions/{subscription_id}/providers/Microsoft.Authorization/roleDefinitions/{role_guid}"


def custom_role_guid(subscription_id: str, stack: str, region: str, purpose: str) -> str:
    """A custom role definition's name: a GUID fixed by subscription, stack, region and purpose, so that a run of
    the program finds the role it made before."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpufleet/{subscription_id}/{stack}/{region}/{purpose}"))


def custom_role_name(subscription_id: str, stack: str, region: str, purpose: str) -> str:
    """A custom role's display name: unique in the tenant, as Azure requires."""
    return f"gpufleet {stack} {region} {purpose} ({subscription_id[:8]})"


def munge_secret_url(vault: str, name: str = MUNGE_SECRET) -> str:
    """node.json's slurm.munge: the secret's URL without a version (trainer.clouds.azure_nodes.parse_secret_url)."""
    return f"https://{vault}.vault.azure.net/secrets/{name}"


def gallery_image_definition(spec: str) -> Optional[str]:
    """The image definition id of a gallery image id (its /versions/... dropped); None for a marketplace URN."""
    if not spec.startswith("/"):
        return None
    return re.sub(r"/versions/[^/]+$", "", spec, flags=re.IGNORECASE)


@dataclass(frozen=True)
class Image:
    """`reference` is a VM's imageReference; `plan` is set for marketplace images sold with terms."""
    reference: dict
    plan: Optional[dict] = None


def image(spec: str) -> Image:
    """A gallery image id -> {id}; a marketplace URN publisher:offer:sku:version -> its four parts,
    with plan {name: sku, product: offer, publisher} unless the publisher is in NO_PLAN_PUBLISHERS."""
    if spec.startswith("/"):
        return Image({"id": spec})
    publisher, offer, sku, version = spec.split(":")
    reference = {"publisher": publisher, "offer": offer, "sku": sku, "version": version}
    if publisher.lower() in NO_PLAN_PUBLISHERS:
        return Image(reference)
    return Image(reference, {"name": sku, "product": offer, "publisher": publisher})


def share_source(account: str, share: str) -> str:
    """An NFS share as mount names it: <account>.file.core.windows.net:/<account>/<share>."""
    return f"{account}.file.core.windows.net:/{account}/{share}"


def mount(account: str, share: str, target: str) -> dict:
    """One entry of node.json's / controller.json's ``mounts``: an NFS 4.1 share through the AZNFS helper (TLS)."""
    return {"source": share_source(account, share), "target": target, "type": MOUNT_TYPE, "options": MOUNT_OPTIONS}


def node_mounts(account: str) -> list[dict]:
    """A GPU node mounts /home only."""
    return [mount(account, HOME_SHARE, HOME)]


def controller_mounts(account: str) -> list[dict]:
    """The controller mounts /home and slurmctld's state (StateSaveLocation), which a replacement controller takes
    over."""
    return [mount(account, HOME_SHARE, HOME), mount(account, STATE_SHARE, slurm.STATE_DIR)]


def slurm_settings(controller_addr: str, munge_url: str) -> dict:
    """node.json's and controller.json's "slurm": where slurmctld listens, and the munge key's secret."""
    return {"controller_addr": controller_addr, "controller_port": slurm.SLURMCTLD_PORT, "munge": munge_url}


def log_group(stack: str) -> str:
    """node.json's log_group on Azure: a name the nodes' log lines carry (Log Analytics has no groups)."""
    return f"/gpufleet/{stack}"


def node_group(stack: str) -> str:
    """The nodes' metric dimension value (metrics.ASG), one for every partition as on AWS."""
    return f"{base_name(stack)}-nodes"


def node_settings(cfg: StackConfig, part: Partition, *, container_url: str, client_id: str,
                  resource_group: str, subscription_id: str, registry: Optional[str] = None,
                  key_vault: Optional[str] = None, slurm_: Optional[dict] = None,
                  mounts: Optional[list] = None, team_client_ids: Optional[dict] = None) -> dict:
    """A partition's /etc/gpufleet/node.json (trainer.node.node_schema): `registry` is the login server,
    `key_vault` the name of the stack's Key Vault (the secrets jobs name in their env), `resource_group` the
    nodes' own group, `team_client_ids` each team's identity (its jobs' tokens: trainer.node.jobcreds)."""
    own = {"client_id": client_id, "resource_group": resource_group, "subscription_id": subscription_id,
           "key_vault": key_vault, **({"team_client_ids": team_client_ids} if team_client_ids else {})}
    return node_json(cfg, part, bucket=container_url, asg_name=node_group(cfg.stack), log_group=log_group(cfg.stack),
                     own=own,
                     slurm_=slurm_, mounts=mounts, registry=registry)


def placement(part: Partition) -> str:
    """Where a partition's VMs go: a multi-node gang on InfiniBand into an availability set (Azure's Flexible
    scale sets have no InfiniBand), every other partition into a Flexible scale set."""
    return "availability_set" if part.multi_node else "scale_set"


def partition_nodes(cfg: StackConfig, part: Partition, *, subscription_id: str, resource_group: str,
                    group_id: str, subnet_id: str, identity_id: str, custom_data: str,
                    disk_encryption_set_id: Optional[str] = None, team_identity_ids: tuple[str, ...] = ()) -> dict:
    """One partition of nodes.json: what trainer.clouds.azure_nodes needs to create its VMs. ``group_id`` is the
    partition's scale set or availability set (``placement``); each VM holds the node identity and the teams'."""
    size = part.primary.name
    where = placement(part)
    return {"instance_types": [size], "vm_size": size, "spot": part.spot, "on_demand_base": part.on_demand_base,
            "gang": part.gang, "subscription_id": subscription_id, "resource_group": resource_group,
            "location": cfg.region,
            "scale_set_id": group_id if where == "scale_set" else None,
            "availability_set_id": group_id if where == "availability_set" else None,
            "subnet_id": subnet_id, "image": cfg.image, "plan": image(cfg.image).plan, "identity_id": identity_id,
            "team_identity_ids": list(team_identity_ids), "admin_username": ADMIN_USER,
            "ssh_public_key": cfg.ssh_public_key,
            "disk_encryption_set_id": disk_encryption_set_id, "custom_data": custom_data,
            "os_disk_gb": NODE_OS_DISK_GB}


def nodes_config(cfg: StackConfig, partitions: dict[str, dict], controller_client_id: str) -> dict:
    """The controller's /etc/gpufleet/nodes.json: the power-saving provider's config (see /work/plan22.md)."""
    return {"provider": "azure", "cloud": "azure", "stack": cfg.stack, "region": cfg.region,
            "slurm_conf": "/etc/slurm/slurm.conf", "tags": cfg.all_tags, "client_id": controller_client_id,
            "partitions": {p.name: partitions[p.name] for p in cfg.partitions}}


def controller_settings(cfg: StackConfig, *, container_url: str, account: str, slurm_: dict, mounts: list,
                        client_id: str, resource_group: str, subscription_id: str, key_vault: str) -> dict:
    """The controller's /etc/gpufleet/controller.json: the bridge's queues (each team's) and container, the default
    partition, slurmctld's state directory, the mounts and the controller's own identity."""
    queues = {team: queue_url(account, q) for team, (q, _) in team_queues([t.name for t in cfg.teams]).items()}
    return controller_json(cfg, bucket=container_url, queue_url=queues[cfg.teams[0].name], team_queues=queues,
                           log_group=log_group(cfg.stack),
                           slurm_=slurm_, mounts=mounts,
                           own={"client_id": client_id, "resource_group": resource_group,
                                "subscription_id": subscription_id, "key_vault": key_vault},
                           shared={"home": HOME, "fs": mounts[0]["source"]})


