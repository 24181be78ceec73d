"""Pure derivations of the Azure stack, tested without Pulumi."""
from __future__ import annotations

import base64
import ipaddress
import re

import pytest

from infra import slurm
from infra.azure import derive
from infra.azure.controller import CUSTOM_DATA_LIMIT, controller_user_data
from tests.infra.azure.conftest import azure_config, partitions_config
from trainer.clouds.azure_nodes import PARTITION_KEYS, image_reference, parse_secret_url, vm_body
from trainer.node import node_schema


def test_address_plan_keeps_clear_of_infiniband_and_pins_the_controller():
    vnet = ipaddress.ip_network(derive.VNET_CIDR)
    nodes, ctl = ipaddress.ip_network(derive.NODE_SUBNET_CIDR), ipaddress.ip_network(derive.CONTROLLER_SUBNET_CIDR)
    assert not vnet.overlaps(ipaddress.ip_network("172.16.0.0/16"))
    assert nodes.subnet_of(vnet) and ctl.subnet_of(vnet) and not nodes.overlaps(ctl)
    assert nodes.num_addresses - 5 >= 1000  # Azure keeps 5 addresses per subnet; the private endpoints fit too
    ip = ipaddress.ip_address(derive.CONTROLLER_IP)
    hosts = list(ctl.hosts())
    assert ip in ctl and ip not in hosts[:3] and ip != ctl.broadcast_address  # Azure keeps .1-.3 and the last


@pytest.mark.parametrize("stack", ["azure", "prod-eu", "A_Very-Long.Stack.Name.With.Dots", "x"])
def test_account_names_are_valid_stable_and_apart(stack):
    for fn in (derive.storage_account_name, derive.files_account_name):
        name = fn(stack, "westeurope")
        assert re.fullmatch(r"[a-z0-9]{3,24}", name)
        assert name == fn(stack, "westeurope") and name != fn(stack, "northeurope")
    assert derive.storage_account_name(stack, "westeurope") != derive.files_account_name(stack, "westeurope")


def test_gallery_image_is_referenced_by_id_without_plan():
    gallery = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/gpu/versions/1.2.3"
    assert derive.image(gallery) == derive.Image({"id": gallery})
    assert derive.gallery_image_definition(gallery) == gallery.rsplit("/versions/", 1)[0]
    assert derive.gallery_image_definition("microsoft-dsvm:ubuntu-hpc:2204:latest") is None


def test_first_party_marketplace_image_has_no_plan_and_third_party_has_one():
    hpc = derive.image("microsoft-dsvm:ubuntu-hpc:2204:latest")
    assert hpc.reference == {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
    assert hpc.plan is None
    assert derive.image("Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest").plan is None
    ngc = derive.image("nvidia:ngc_azure_17_11:ngc-base-version-24_03_4_gen2:24.03.4")
    assert ngc.plan == {"name": "ngc-base-version-24_03_4_gen2", "product": "ngc_azure_17_11", "publisher": "nvidia"}
    # the provider reads the same image string into the same reference
    assert image_reference("microsoft-dsvm:ubuntu-hpc:2204:latest") == hpc.reference


def test_custom_roles_have_stable_guids_and_tenant_unique_names():
    a = derive.custom_role_guid("sub-a", "azure", "westeurope", "node-launcher")
    assert a == derive.custom_role_guid("sub-a", "azure", "westeurope", "node-launcher")
    assert len({a, derive.custom_role_guid("sub-b", "azure", "westeurope", "node-launcher"),
                derive.custom_role_guid("sub-a", "prod", "westeurope", "node-launcher"),
                derive.custom_role_guid("sub-a", "azure", "northeurope", "node-launcher"),
                derive.custom_role_guid("sub-a", "azure", "westeurope", "munge-keeper")}) == 5
    assert derive.custom_role_name("12345678-aaaa", "azure", "westeurope", "munge-keeper") == \
        "gpufleet azure westeurope munge-keeper (12345678)"


def test_munge_secret_url_is_what_the_provider_parses():
    url = derive.munge_secret_url("gfazure-ef2f5b2d")
    assert parse_secret_url(url) == ("https://gfazure-ef2f5b2d.vault.azure.net", derive.MUNGE_SECRET,
                                     "https://vault.azure.net")


def test_mounts_are_nfs_shares_through_the_tls_helper():
    home, state = derive.controller_mounts("acct")
    assert home == {"source": "acct.file.core.windows.net:/acct/home", "target": "/home", "type": "aznfs",
                    "options": "vers=4.1,sec=sys,proto=tcp"}
    assert (state["source"], state["target"]) == ("acct.file.core.windows.net:/acct/slurm-state", slurm.STATE_DIR)
    assert derive.node_mounts("acct") == [home]
    assert "notls" not in home["options"].split(",")


def _node(cfg, part):
    return derive.node_settings(
        cfg, part, container_url="https://a.blob.core.windows.net/checkpoints",
        client_id="cid", resource_group="rg-nodes",
        subscription_id="sub", registry="r.azurecr.io", key_vault="kv",
        slurm_=derive.slurm_settings(derive.CONTROLLER_IP, derive.munge_secret_url("kv")),
        mounts=derive.node_mounts("acct"))


def test_node_settings_follow_the_contract():
    cfg = azure_config()
    node = _node(cfg, cfg.partitions[0])
    assert node_schema.check(node, complete=True) == node
    assert node["cloud"] == "azure" and not {"mode", "node_count", "queue_url"} & set(node)
    assert node["asg_name"] == "gpufleet-azure-nodes"
    assert node["instance_types"] == {"Standard_ND96asr_v4": {"gpus": 8, "efa": 0, "nvswitch": True,
                                                              "infiniband_gbps": 1600}}
    assert node["azure"] == {"client_id": "cid", "resource_group": "rg-nodes", "subscription_id": "sub",
                             "key_vault": "kv"}
    assert node["slurm"] == {"controller_addr": "10.64.16.4", "controller_port": 6817,
                             "munge": "https://kv.vault.azure.net/secrets/slurm-munge-key"}
    gang = partitions_config().partitions[1]
    assert set(_node(cfg, gang)["instance_types"]) == {gang.primary.name}


def test_placement_by_partition():
    small, big = partitions_config().partitions
    assert (derive.placement(small), derive.placement(big)) == ("scale_set", "availability_set")
    one = azure_config(mode="gang", instanceTypes=["Standard_ND96isr_H100_v5"], nodes={"min": 0, "max": 1}).partitions[0]
    assert derive.placement(one) == "scale_set"  # one node shares nothing: a Flexible set, spot allowed


@pytest.mark.parametrize("index", [0, 1])
def test_partition_nodes_give_the_provider_a_vm_body(index):
    cfg = partitions_config()
    part = cfg.partitions[index]
    group = f"/subscriptions/sub/resourceGroups/rg-nodes/providers/Microsoft.Compute/{['virtualMachineScaleSets', 'availabilitySets'][index]}/g"
    entry = derive.partition_nodes(cfg, part, subscription_id="sub", resource_group="rg-nodes", group_id=group,
                                   subnet_id="/subscriptions/sub/.../subnets/nodes", identity_id="/id/nodes",
                                   custom_data=base64.b64encode(b"#cloud-config\n").decode())
    assert all(entry[k] not in (None, "") for k in PARTITION_KEYS)
    assert entry["gang"] is part.gang and entry["spot"] is part.spot
    body = vm_body(f"{part.name}-1", 1, entry, {"gpufleet-stack": "azure"}, "/nic")
    props = body["properties"]
    assert props["hardwareProfile"] == {"vmSize": part.primary.name}
    assert props["securityProfile"] == {"encryptionAtHost": True}
    assert props["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert list(body["identity"]["userAssignedIdentities"]) == ["/id/nodes"]
    if index == 0:  # the queue partition's node 1 is its on-demand base; the provider puts it into the scale set
        assert entry["scale_set_id"] == group and entry["availability_set_id"] is None
        assert props["virtualMachineScaleSet"] == {"id": group} and props["priority"] == "Regular"
        spot = vm_body(f"{part.name}-2", 2, entry, {}, "/nic")["properties"]
        assert (spot["priority"], spot["evictionPolicy"]) == ("Spot", "Delete")
    else:
        assert entry["scale_set_id"] is None and entry["availability_set_id"] == group
        assert props["priority"] == "Regular" and "virtualMachineScaleSet" not in props


def test_nodes_config_and_controller_settings_are_what_user_data_accepts():
    cfg = partitions_config()
    parts = {p.name: derive.partition_nodes(cfg, p, subscription_id="sub", resource_group="rg-nodes",
                                            group_id="/g", subnet_id="/s", identity_id="/i",
                                            custom_data=base64.b64encode(b"#cloud-config\n" * 200).decode())
             for p in cfg.partitions}
    nodes = derive.nodes_config(cfg, parts, "cid-controller")
    assert list(nodes["partitions"]) == ["small", "big"] and nodes["client_id"] == "cid-controller"
    settings = derive.controller_settings(
        cfg, container_url="https://a.blob.core.windows.net/checkpoints", account="a",
        slurm_=derive.slurm_settings(derive.CONTROLLER_IP, derive.munge_secret_url("kv")),
        mounts=derive.controller_mounts("acct"), client_id="cid-controller", resource_group="rg", subscription_id="sub",
        key_vault="kv")
    assert node_schema.check_controller(settings, complete=True) == settings
    assert settings["queue_url"] == "https://a.queue.core.windows.net/jobs"
    assert (settings["partition"], settings["instance_type"], settings["gpus"]) == ("small", "Standard_ND96asr_v4", 8)
    text = controller_user_data(cfg, derive.CONTROLLER_IP, settings, nodes)
    assert text.startswith("#cloud-config") and len(text.encode()) <= CUSTOM_DATA_LIMIT
    assert f"SlurmctldHost=controller({derive.CONTROLLER_IP})" in text
    with pytest.raises(ValueError, match="Azure takes at most"):
        huge = {**nodes, "tags": {**nodes["tags"], "padding": "x" * CUSTOM_DATA_LIMIT}}
        controller_user_data(cfg, derive.CONTROLLER_IP, settings, huge)
