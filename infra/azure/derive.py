"""Pure derivations for the Azure stack: names, image reference, scale-set limits, autoscale rules,
node settings. No Pulumi here; the components turn these values into resources."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Optional

from infra.config import StackConfig

# The RDMA/InfiniBand network of ND-series VMs uses 172.16.0.0/16: the VNet must not overlap it.
VNET_CIDR = "10.64.0.0/16"
SUBNET_CIDR = "10.64.0.0/20"
ADMIN_USER = "azureuser"
JOBS_QUEUE = "jobs"
POISON_QUEUE = f"{JOBS_QUEUE}-poison"
CONTAINER = "checkpoints"

# Built-in role definition GUIDs (identical in every tenant).
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
# The agent receives, deletes, *updates* (extends/releases a lease: Update Message needs
# queues/messages/write) and adds (moves to the poison queue) messages. Storage Queue Data Message
# Processor (8a0f0c08-...) grants only read + process, so the Contributor role is assigned,
# scoped to the two queues and nothing else.
STORAGE_QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"

# Sizes whose NICs support accelerated networking (every ND-series GPU size in the catalog).
ACCELERATED_NETWORKING = frozenset({
    "Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4", "Standard_ND96isr_H100_v5",
})

# Marketplace publishers whose images carry no purchase plan: Microsoft's own and the endorsed
# distributions. Any other publisher's image is sold under marketplace terms and needs `plan`.
NO_PLAN_PUBLISHERS = frozenset({
    "canonical", "microsoft-dsvm", "microsoftcblmariner", "microsoftwindowsserver", "redhat",
    "suse", "debian", "openlogic", "oracle", "microsoft-aks",
})


def base_name(stack: str) -> str:
    return f"gpufleet-{stack}"


def storage_account_name(stack: str, region: str) -> str:
    """A globally unique-enough account name: 3-24 lowercase letters and digits, stable per stack+region."""
    digest = hashlib.sha256(f"gpufleet/{stack}/{region}".encode()).hexdigest()[:8]
    stem = re.sub(r"[^a-z0-9]", "", stack.lower())[:12]
    return f"gpuf{stem}{digest}"


def blob_container_url(account: str, container: str = CONTAINER) -> str:
    return f"https://{account}.blob.core.windows.net/{container}"


def queue_url(account: str, queue: str = JOBS_QUEUE) -> str:
    return f"https://{account}.queue.core.windows.net/{queue}"


def role_definition_id(subscription_id: str, role_guid: str) -> str:
    return f"/subscriptions/{subscription_id}/providers/Microsoft.Authorization/roleDefinitions/{role_guid}"


def queue_metric_uri(storage_account_id: str, queue: str = JOBS_QUEUE) -> str:
    """The resource URI Azure Monitor autoscale reads a storage queue's ApproximateMessageCount from."""
    return f"{storage_account_id}/services/queue/queues/{queue}"


@dataclass(frozen=True)
class Image:
    """`reference` is the scale set's imageReference; `plan` is set for marketplace images sold with terms."""
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


def capacity(cfg: StackConfig) -> dict:
    """Autoscale capacity bounds: minimum nodes.min (0 scales to zero), maximum nodes.max."""
    return {"minimum": str(cfg.nodes.min), "maximum": str(cfg.nodes.max), "default": str(cfg.nodes.desired)}


def queue_rules(metric_uri: str) -> list[dict]:
    """Scale rules that keep one node per job.

    ApproximateMessageCount counts queued *and* leased (invisible) messages, so it equals waiting
    plus running jobs. For a storage queue the autoscale engine compares the count per instance
    (divide_per_instance): above 1 message per node adds a node, below 1 removes one, so an empty
    queue drains the set to nodes.min (0). Scale-in waits longer than scale-out; a node removed
    while busy gets a Terminate scheduled event, checkpoints and releases its job.
    """
    def rule(operator: str, direction: str, window: str, cooldown: str) -> dict:
        return {
            "metric_trigger": {
                "metric_name": "ApproximateMessageCount",
                "metric_namespace": "",
                "metric_resource_uri": metric_uri,
                "divide_per_instance": True,
                "operator": operator,
                "threshold": 1,
                "statistic": "Average",
                "time_aggregation": "Average",
                "time_grain": "PT1M",
                "time_window": window,
            },
            "scale_action": {"direction": direction, "type": "ChangeCount", "value": "1", "cooldown": cooldown},
        }

    return [rule("GreaterThan", "Increase", "PT5M", "PT5M"),
            rule("LessThan", "Decrease", "PT15M", "PT10M")]


def node_settings(cfg: StackConfig, *, container_url: str, queue_url: str, scale_set: str,
                  client_id: str, resource_group: str, subscription_id: str, registry: Optional[str] = None,
                  key_vault: Optional[str] = None) -> dict:
    """The /etc/gpufleet/node.json document of an Azure node (contracts.md); `registry` is the login server,
    `key_vault` the name of the stack's Key Vault (the secrets jobs name in their env)."""
    size = cfg.primary
    return {
        "cloud": "azure",
        "stack": cfg.stack,
        "region": cfg.region,
        "mode": cfg.mode,
        "node_count": cfg.nodes.max,
        "bucket": container_url,
        "queue_url": queue_url,
        "asg_name": scale_set,
        "log_group": f"/gpufleet/{cfg.stack}",
        "metric_namespace": f"gpufleet/{cfg.stack}",
        "instance_types": {
            size.name: {"gpus": size.gpus, "efa": 0, "nvswitch": size.nvswitch,
                        "infiniband_gbps": size.infiniband_gbps},
        },
        "launch_hook": None,
        "terminate_hook": None,
        "azure": {"client_id": client_id, "resource_group": resource_group, "subscription_id": subscription_id,
                  "key_vault": key_vault},
        "registry": registry,
    }
