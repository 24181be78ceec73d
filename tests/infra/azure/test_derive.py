"""Pure derivations of the Azure stack, tested without Pulumi."""
from __future__ import annotations

import ipaddress
import re

import pytest

from infra.azure import derive
from infra.config import AZURE_SCALE_SET_MAX
from tests.infra.azure.conftest import azure_config


def test_vnet_is_clear_of_the_infiniband_range_and_holds_the_subnet():
    vnet, subnet = ipaddress.ip_network(derive.VNET_CIDR), ipaddress.ip_network(derive.SUBNET_CIDR)
    assert not vnet.overlaps(ipaddress.ip_network("172.16.0.0/16"))
    assert subnet.subnet_of(vnet)
    assert subnet.num_addresses - 5 >= AZURE_SCALE_SET_MAX  # Azure keeps 5 addresses per subnet


@pytest.mark.parametrize("stack", ["azure", "prod-eu", "A_Very-Long.Stack.Name.With.Dots", "x"])
def test_storage_account_name_is_valid_and_stable(stack):
    name = derive.storage_account_name(stack, "westeurope")
    assert re.fullmatch(r"[a-z0-9]{3,24}", name)
    assert name == derive.storage_account_name(stack, "westeurope")
    assert name != derive.storage_account_name(stack, "northeurope")


def test_gallery_image_is_referenced_by_id_without_plan():
    gallery = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/gpu/versions/1.2.3"
    assert derive.image(gallery) == derive.Image({"id": gallery})


def test_first_party_marketplace_image_has_no_plan_and_third_party_has_one():
    hpc = derive.image("microsoft-dsvm:ubuntu-hpc:2204:latest")
    assert hpc.reference == {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
    assert hpc.plan is None
    assert derive.image("Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest").plan is None
    ngc = derive.image("nvidia:ngc_azure_17_11:ngc-base-version-24_03_4_gen2:24.03.4")
    assert ngc.plan == {"name": "ngc-base-version-24_03_4_gen2", "product": "ngc_azure_17_11", "publisher": "nvidia"}


def test_capacity_reaches_zero_and_is_bounded_by_nodes():
    cfg = azure_config()
    assert derive.capacity(cfg) == {"minimum": "0", "maximum": str(cfg.nodes.max), "default": "0"}


def test_queue_rules_add_a_node_per_waiting_job_and_drain_to_zero():
    uri = derive.queue_metric_uri("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/acc")
    assert uri.endswith("/storageAccounts/acc/services/queue/queues/jobs")
    out, in_ = derive.queue_rules(uri)
    for rule in (out, in_):
        trig = rule["metric_trigger"]
        assert (trig["metric_name"], trig["metric_resource_uri"], trig["divide_per_instance"]) == (
            "ApproximateMessageCount", uri, True)
        assert trig["threshold"] == 1
    assert (out["metric_trigger"]["operator"], out["scale_action"]["direction"]) == ("GreaterThan", "Increase")
    assert (in_["metric_trigger"]["operator"], in_["scale_action"]["direction"]) == ("LessThan", "Decrease")
    # Scale in only after a longer quiet spell than scale out needs.
    minutes = lambda rule: int(rule["metric_trigger"]["time_window"].removeprefix("PT").removesuffix("M"))
    assert minutes(in_) > minutes(out)


def test_node_settings_follow_the_contract():
    cfg = azure_config()
    node = derive.node_settings(cfg, container_url="https://a.blob.core.windows.net/checkpoints",
                                queue_url="https://a.queue.core.windows.net/jobs", scale_set="ss",
                                client_id="cid", resource_group="rg", subscription_id="sub")
    assert node["cloud"] == "azure" and node["mode"] == "queue" and node["asg_name"] == "ss"
    assert node["bucket"].startswith("https://") and node["queue_url"].endswith("/jobs")
    assert node["instance_types"] == {"Standard_ND96asr_v4": {"gpus": 8, "efa": 0, "nvswitch": True,
                                                              "infiniband_gbps": 1600}}
    assert node["azure"] == {"client_id": "cid", "resource_group": "rg", "subscription_id": "sub", "key_vault": None}
    assert (node["log_group"], node["metric_namespace"]) == ("/gpufleet/azure", "gpufleet/azure")
