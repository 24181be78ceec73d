"""The Azure stack on Pulumi's mock runtime: a Slurm cluster. What it registers, with which inputs, under which
parents: the controller and its address, the partitions' scale sets and availability sets, the munge key's secret,
the shared file system, the identities and their roles, the network, the monitoring, the tags."""
from __future__ import annotations

import base64
import importlib
import inspect
import ipaddress
import json
import re

import pytest
import yaml

from infra import slurm
from infra.azure import derive, dns_firewall
from infra.azure.registry import ACR_PULL, registry_name
from infra.azure.vault import SECRETS_USER, vault_name
from infra.config import ConfigError
from infra.userdata import render_node_user_data
from tests.infra.mock_run import stack_config
from tests.infra.azure.conftest import (TWO_PARTITIONS, azure_config, controller_file, controller_user_data,
                                        node_json, node_user_data, nodes_json, partitions_config, run_stack)
from trainer.clouds.azure_nodes import PARTITION_KEYS, parse_secret_url

RG = "azure-native:resources:ResourceGroup"
VNET, SUBNET, NSG = ("azure-native:network:VirtualNetwork", "azure-native:network:Subnet",
                     "azure-native:network:NetworkSecurityGroup")
NIC, NAT, PIP = ("azure-native:network:NetworkInterface", "azure-native:network:NatGateway",
                 "azure-native:network:PublicIPAddress")
ACCOUNT, CONTAINER, QUEUE, SHARE = ("azure-native:storage:StorageAccount", "azure-native:storage:BlobContainer",
                                    "azure-native:storage:Queue", "azure-native:storage:FileShare")
IDENTITY, ROLE = "azure-native:managedidentity:UserAssignedIdentity", "azure-native:authorization:RoleAssignment"
ROLE_DEF = "azure-native:authorization:RoleDefinition"
VM, VMSS, AVSET = ("azure-native:compute:VirtualMachine", "azure-native:compute:VirtualMachineScaleSet",
                   "azure-native:compute:AvailabilitySet")
AUTOSCALE = "azure-native:monitor:AutoscaleSetting"
ACTION_GROUP, METRIC_ALERT = "azure-native:monitor:ActionGroup", "azure-native:monitor:MetricAlert"
ACR, ENDPOINT = "azure-native:containerregistry:Registry", "azure-native:network:PrivateEndpoint"
ZONE, ZONE_LINK = "azure-native:privatedns:PrivateZone", "azure-native:privatedns:VirtualNetworkLink"
ZONE_GROUP = "azure-native:network:PrivateDnsZoneGroup"
VAULT, SECRET = "azure-native:keyvault:Vault", "azure-native:keyvault:Secret"
PARTITION = "gpufleet:azure:Partition"
GLOBAL = {ZONE, ZONE_LINK, ACTION_GROUP, METRIC_ALERT}


def _taggable(typ: str) -> bool:
    _, module, kind = typ.split(":")
    cls = getattr(importlib.import_module(f"pulumi_azure_native.{module}"), kind)
    return "tags" in inspect.signature(cls._internal_init).parameters


def _account(run, kind: str):
    (acc,) = [a for a in run.of_type(ACCOUNT) if a.inputs["kind"] == kind]
    return acc


def _role_guid(role_definition_id: str) -> str:
    return role_definition_id.rsplit("/", 1)[1]


def _principals(run) -> dict[str, str]:
    return {r.inputs["resourceName"].removeprefix("gpufleet-azure-"): r.id for r in run.of_type(IDENTITY)}


# --- every resource ------------------------------------------------------------------------------

def test_every_resource_sits_in_a_component_and_every_taggable_one_carries_the_tags(azure_run):
    cfg = azure_config()
    components = {r.type for r in azure_run.resources if r.type.startswith("gpufleet:azure:")}
    assert components == {f"gpufleet:azure:{c}" for c in
                          ("ResourceGroup", "Network", "DnsFirewall", "Storage", "JobQueue", "Identity", "Registry",
                           "Vault", "SharedFs", "Monitoring", "Partition", "Controller")}
    provider = [r for r in azure_run.resources if r.type.startswith("azure-native:")]
    assert {r.type for r in provider} >= {RG, VNET, SUBNET, NSG, NIC, NAT, PIP, ACCOUNT, CONTAINER, QUEUE, SHARE,
                                          IDENTITY, ROLE, ROLE_DEF, VM, VMSS, ACTION_GROUP, METRIC_ALERT, ACR,
                                          ENDPOINT, ZONE, ZONE_LINK, ZONE_GROUP, VAULT, SECRET}
    for r in provider:
        assert r.parent_type in components, r.urn
        if _taggable(r.type):
            assert cfg.all_tags.items() <= (r.inputs.get("tags") or {}).items(), r.urn
            # only the munge secret carries a tag of its own (its state, which the node provider reads)
            extra = set(r.inputs["tags"]) - set(cfg.all_tags)
            assert extra == ({derive.MUNGE_TAG} if r.type == SECRET else set()), r.urn
        want = "global" if r.type in GLOBAL else cfg.region
        assert str(r.inputs.get("location", want)).lower() == want, r.urn


def test_the_uniform_scale_set_and_its_autoscale_are_gone(azure_run, two_partitions):
    for run in (azure_run, two_partitions):
        assert run.of_type(AUTOSCALE) == []
        assert all(v.inputs["orchestrationMode"] == "Flexible" for v in run.of_type(VMSS))
        assert all("virtualMachineProfile" not in v.inputs and "sku" not in v.inputs for v in run.of_type(VMSS))


# --- network ------------------------------------------------------------------------------------

def _rules(run, nsg_name: str) -> list[dict]:
    (nsg,) = [n for n in run.of_type(NSG) if n.inputs["networkSecurityGroupName"] == nsg_name]
    return nsg.inputs["securityRules"]


def _allowed(rules, direction):
    return {(r["sourceAddressPrefix"], r["destinationAddressPrefix"], r["protocol"], r["destinationPortRange"])
            for r in rules if r["direction"] == direction and r["access"] == "Allow"}


def test_two_private_subnets_clear_of_the_rdma_range(azure_run):
    (space,) = azure_run.one(VNET).inputs["addressSpace"]["addressPrefixes"]
    assert not ipaddress.ip_network(space).overlaps(ipaddress.ip_network("172.16.0.0/16"))
    subnets = {s.inputs["subnetName"]: s.inputs for s in azure_run.of_type(SUBNET)}
    assert set(subnets) == {"nodes", "controller"}
    nodes, ctl = (ipaddress.ip_network(subnets[n]["addressPrefix"]) for n in ("nodes", "controller"))
    assert nodes.subnet_of(ipaddress.ip_network(space)) and ctl.subnet_of(ipaddress.ip_network(space))
    assert not nodes.overlaps(ctl)
    for s in subnets.values():
        assert s["defaultOutboundAccess"] is False
        assert [e["service"] for e in s["serviceEndpoints"]] == ["Microsoft.Storage"]
    assert subnets["nodes"]["networkSecurityGroup"]["id"].endswith("/networkSecurityGroups/gpufleet-azure-nodes")
    assert subnets["controller"]["networkSecurityGroup"]["id"].endswith(
        "/networkSecurityGroups/gpufleet-azure-controller")
    # the nodes have no way out; the controller's NAT gateway is its only one
    assert "natGateway" not in subnets["nodes"]
    assert subnets["controller"]["natGateway"]["id"] == azure_run.one(NAT).id
    assert azure_run.one(NAT).inputs["publicIpAddresses"] == [{"id": azure_run.one(PIP).id}]


def test_nsgs_let_in_slurm_from_the_cluster_only_and_nothing_from_the_internet(azure_run):
    nodes, ctl = derive.NODE_SUBNET_CIDR, derive.CONTROLLER_SUBNET_CIDR
    low, high = slurm.SRUN_PORTS
    node_rules, ctl_rules = _rules(azure_run, "gpufleet-azure-nodes"), _rules(azure_run, "gpufleet-azure-controller")
    assert _allowed(node_rules, "Inbound") == {(ctl, nodes, "Tcp", "6818"), (nodes, nodes, "*", "*"),
                                               ("VirtualNetwork", nodes, "Tcp", "22")}
    assert _allowed(ctl_rules, "Inbound") == {(nodes, ctl, "Tcp", "6817"), (nodes, ctl, "Tcp", f"{low}-{high}"),
                                              ("VirtualNetwork", ctl, "Tcp", "22")}
    for rules in (node_rules, ctl_rules):
        inbound = sorted((r for r in rules if r["direction"] == "Inbound"), key=lambda r: r["priority"])
        # the denials come last: internet, then everything else (Azure's default allows the whole VNet)
        assert [(r["access"], r["sourceAddressPrefix"]) for r in inbound[-2:]] == [("Deny", "Internet"), ("Deny", "*")]
        assert all(r["access"] == "Deny" for r in inbound if r["sourceAddressPrefix"] in ("Internet", "*"))
        assert len({(r["direction"], r["priority"]) for r in rules}) == len(rules)
    assert _allowed(node_rules, "Outbound") == set()
    # the controller goes out to Resource Manager and storage (its service endpoint) only
    assert _allowed(ctl_rules, "Outbound") == {(ctl, "AzureResourceManager", "Tcp", "443"),
                                               (ctl, "Storage", "Tcp", "443")}
    (deny_out,) = [r for r in ctl_rules if r["direction"] == "Outbound" and r["access"] == "Deny"]
    assert (deny_out["destinationAddressPrefix"], deny_out["destinationPortRange"]) == ("Internet", "*")
    assert deny_out["priority"] > max(r["priority"] for r in ctl_rules if r["direction"] == "Outbound"
                                      and r["access"] == "Allow")


def test_controller_address_is_static_on_its_own_nic_without_a_public_ip(azure_run):
    nic = azure_run.one(NIC).inputs
    (ip,) = nic["ipConfigurations"]
    assert (ip["privateIPAllocationMethod"], ip["privateIPAddress"]) == ("Static", derive.CONTROLLER_IP)
    assert ip["subnet"]["id"] == azure_run.outputs["controllerSubnetId"] and "publicIPAddress" not in ip
    assert ipaddress.ip_address(derive.CONTROLLER_IP) in ipaddress.ip_network(derive.CONTROLLER_SUBNET_CIDR)
    assert azure_run.outputs["controllerAddress"] == derive.CONTROLLER_IP
    # the one public address of the stack is the NAT gateway's, outbound only
    (pip,) = azure_run.of_type(PIP)
    assert pip.inputs["sku"] == {"name": "Standard"} and "ipConfiguration" not in pip.inputs
    assert "dnsSettings" not in pip.inputs


DNS = "azure-native:dnsresolver:"


def _resolves(name: str, domains) -> bool:
    """Whether a name falls under one of the domains (a rule covers a domain and every name below it)."""
    fq = name.rstrip(".") + "."
    return any(d == "." or fq == d or fq.endswith("." + d) for d in domains)


def test_the_vnet_resolves_only_the_azure_names_the_stack_uses_and_logs_every_query(azure_run):
    """The DNS firewall: the stack's Azure service names and the VMs' own allowed first, every other name
    answered SERVFAIL, the policy linked to the stack's VNet; every query into a workspace of the stack."""
    policy = azure_run.one(f"{DNS}DnsResolverPolicy")
    lists = {r.id: r.inputs["domains"] for r in azure_run.of_type(f"{DNS}DnsResolverDomainList")}
    rules = sorted((r.inputs for r in azure_run.of_type(f"{DNS}DnsSecurityRule")), key=lambda r: r["priority"])
    assert all(r["dnsResolverPolicyName"] == policy.inputs["dnsResolverPolicyName"] for r in rules)
    assert all(r["dnsSecurityRuleState"] == "Enabled" for r in rules)
    assert [(r["action"], [lists[d["id"]] for d in r["dnsResolverDomainLists"]]) for r in rules] == [
        ({"actionType": "Allow"}, [list(dns_firewall.ALLOWED_DOMAINS)]),
        ({"actionType": "Block", "blockResponseCode": "SERVFAIL"}, [["."]])]
    link = azure_run.one(f"{DNS}DnsResolverPolicyVirtualNetworkLink").inputs
    assert link["virtualNetwork"]["id"] == azure_run.one(VNET).id
    assert link["dnsResolverPolicyName"] == policy.inputs["dnsResolverPolicyName"]
    workspace = azure_run.one("azure-native:operationalinsights:Workspace")
    assert workspace.inputs["retentionInDays"] == dns_firewall.LOG_RETENTION_DAYS[azure_config().data_classification]
    setting = azure_run.one("azure-native:monitor:DiagnosticSetting").inputs
    assert (setting["resourceUri"], setting["workspaceId"]) == (policy.id, workspace.id)
    assert setting["logs"] == [{"category": "DnsResponse", "enabled": True}]
    assert azure_run.outputs["dnsQueryWorkspace"] == workspace.inputs["workspaceName"]


def test_every_name_the_nodes_and_the_controller_resolve_is_allowed(azure_run):
    """The names the stack's VMs look up (the container's and queues' hosts and their targets, the private
    endpoints' names and zones, Resource Manager, the VMs' own) fall under an allowed domain; names elsewhere,
    and the allowed names as a prefix of another domain, do not."""
    o = azure_run.outputs
    account, vault, files = o["storageAccount"], o["keyVault"], o["sharedFilesAccount"]
    registry = o["registry"].split(".")[0]
    names = [o["containerUrl"].split("/")[2], o["queueUrl"].split("/")[2], "blob.ams07prdstr01a.store.core.windows.net",
             f"{vault}.vault.azure.net", f"{vault}.privatelink.vaultcore.azure.net", o["registry"],
             f"{registry}.privatelink.azurecr.io", f"{registry}.westeurope.data.azurecr.io",
             f"{files}.file.core.windows.net", f"{files}.privatelink.file.core.windows.net",
             "management.azure.com", "gpufleet-azure-gpu-1.abcdefgh.ax.internal.cloudapp.net"]
    assert account in names[0]
    assert all(_resolves(n, dns_firewall.ALLOWED_DOMAINS) for n in names)
    for outside in ("pypi.org", "attacker.example", "core.windows.net.attacker.example", "login.microsoftonline.com",
                    "evilcore.windows.net", "azure.com"):
        assert not _resolves(outside, dns_firewall.ALLOWED_DOMAINS), outside
    assert _resolves("anything.example", ["."])  # the block list's one entry covers every name


# --- the controller -----------------------------------------------------------------------------

def test_controller_vm_is_private_encrypted_at_host_with_ssh_keys_only(azure_run):
    cfg = azure_config()
    v = azure_run.one(VM).inputs
    assert v["hardwareProfile"] == {"vmSize": "Standard_D2s_v5"} == {"vmSize": cfg.controller.instance_type}
    assert v["vmName"] == "gpufleet-azure-controller" and v["priority"] == "Regular"
    os_profile = v["osProfile"]
    assert os_profile["computerName"] == "controller" and "adminPassword" not in os_profile
    linux = os_profile["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True
    assert linux["ssh"]["publicKeys"] == [{"path": "/home/azureuser/.ssh/authorized_keys",
                                           "keyData": cfg.ssh_public_key}]
    assert v["securityProfile"] == {"encryptionAtHost": True}
    disk = v["storageProfile"]["osDisk"]
    assert (disk["createOption"], disk["diskSizeGB"], disk["deleteOption"]) == ("FromImage", 64, "Delete")
    # the stack has no disk encryption set: the OS disk is encrypted with platform keys (and at the host)
    assert disk["managedDisk"] == {"storageAccountType": "Premium_LRS"}
    assert v["storageProfile"]["imageReference"] == derive.image(cfg.image).reference and "plan" not in v
    # the NIC with the address outlives the VM
    assert v["networkProfile"]["networkInterfaces"] == [{"id": azure_run.one(NIC).id, "primary": True,
                                                         "deleteOption": "Detach"}]
    ids = _principals(azure_run)
    assert v["identity"]["type"] == "UserAssigned"
    assert list(v["identity"]["userAssignedIdentities"]) == [ids["controller"]]
    assert v["diagnosticsProfile"] == {"bootDiagnostics": {"enabled": True}}
    assert azure_run.outputs["controller"] == "gpufleet-azure-controller"
    assert azure_run.outputs["controllerId"] == azure_run.one(VM).id


def test_controller_size_comes_from_the_config():
    run = run_stack(azure_config(controller={"instanceType": "Standard_D8s_v5"}))
    assert run.one(VM).inputs["hardwareProfile"] == {"vmSize": "Standard_D8s_v5"}
    with pytest.raises(ConfigError, match=r"^gpufleet:controller.instanceType: 'm6i.large'.*Standard_D2s_v5"):
        azure_config(controller={"instanceType": "m6i.large"})


def test_controller_custom_data_holds_the_cluster(azure_run):
    o, cfg = azure_run.outputs, azure_config()
    text = controller_user_data(azure_run)
    assert text.startswith("#cloud-config") and "gpufleet-controller.service" in text
    conf = controller_file(azure_run, "/etc/slurm/slurm.conf")
    lines = conf.splitlines()
    assert f"SlurmctldHost=controller({derive.CONTROLLER_IP})" in lines
    assert f"StateSaveLocation={slurm.STATE_DIR}" in lines and "enable_configless" in conf
    assert "ResumeProgram=/usr/local/sbin/gpufleet-resume" in lines
    assert "PartitionName=gpu Nodes=gpu-[1-4] Default=YES" in conf
    assert "Name=gpu" in controller_file(azure_run, "/etc/slurm/gres.conf")
    ctl = controller_file(azure_run, "/etc/gpufleet/controller.json")
    assert (ctl["cloud"], ctl["bucket"], ctl["queue_url"], ctl["partition"], ctl["state_dir"]) == (
        "azure", o["containerUrl"], o["queueUrl"], "gpu", slurm.STATE_DIR)
    assert ctl["slurm"] == {"controller_addr": derive.CONTROLLER_IP, "controller_port": 6817,
                            "munge": o["mungeKeySecret"]}
    assert ctl["azure"] == {"client_id": o["controllerIdentityClientId"], "resource_group": "gpufleet-azure",
                            "subscription_id": o["controllerId"].split("/")[2], "key_vault": o["keyVault"]}
    assert [m["target"] for m in ctl["mounts"]] == ["/home", slurm.STATE_DIR]
    assert ctl["shared"] == {"home": "/home", "fs": o["homeShare"]}
    mounts = yaml.safe_load(text)["mounts"]
    assert [m[1] for m in mounts] == ["/home", slurm.STATE_DIR] and {m[2] for m in mounts} == {"aznfs"}
    assert all("_netdev" in m[3].split(",") for m in mounts)
    assert cfg.instance_types == (ctl["instance_type"],)


def test_nodes_json_gives_the_provider_every_key_it_needs(azure_run):
    o, cfg = azure_run.outputs, azure_config()
    nodes = nodes_json(azure_run)
    assert (nodes["provider"], nodes["cloud"], nodes["stack"], nodes["region"]) == ("azure", "azure", "azure",
                                                                                  "westeurope")
    assert nodes["slurm_conf"] == "/etc/slurm/slurm.conf" and nodes["tags"] == cfg.all_tags
    assert nodes["client_id"] == o["controllerIdentityClientId"]
    part = nodes["partitions"]["gpu"]
    assert all(part[k] not in (None, "") for k in PARTITION_KEYS), PARTITION_KEYS
    ids = _principals(azure_run)
    sub = o["controllerId"].split("/")[2]
    assert (part["subscription_id"], part["resource_group"], part["location"]) == (sub, "gpufleet-azure-nodes",
                                                                                   "westeurope")
    assert part["scale_set_id"] == azure_run.one(VMSS).id == o["partitionGroups"]["gpu"]
    assert part["availability_set_id"] is None
    assert (part["vm_size"], part["instance_types"], part["spot"], part["on_demand_base"], part["gang"]) == (
        "Standard_ND96asr_v4", ["Standard_ND96asr_v4"], True, 0, False)
    assert (part["subnet_id"], part["identity_id"]) == (o["subnetId"], ids["nodes"])
    assert (part["image"], part["plan"], part["admin_username"], part["ssh_public_key"]) == (
        cfg.image, None, "azureuser", cfg.ssh_public_key)
    assert part["disk_encryption_set_id"] is None and part["os_disk_gb"] == 256


def test_node_custom_data_is_the_cloud_config_of_a_slurm_node(azure_run):
    o = azure_run.outputs
    node = node_json(azure_run)
    assert node_user_data(azure_run) == render_node_user_data(node)
    assert "gpufleet-node.service" in node_user_data(azure_run)
    assert node["slurm"] == {"controller_addr": derive.CONTROLLER_IP, "controller_port": 6817,
                             "munge": o["mungeKeySecret"]}
    assert node["mounts"] == [{"source": o["homeShare"], "target": "/home", "type": "aznfs",
                               "options": derive.MOUNT_OPTIONS}]
    assert node["azure"] == {"client_id": o["identityClientId"], "resource_group": "gpufleet-azure-nodes",
                             "subscription_id": o["controllerId"].split("/")[2], "key_vault": o["keyVault"],
                             "team_client_ids": o["teamIdentityClientIds"]}  # its jobs' identities, by team
    assert set(o["teamIdentityClientIds"]) == {"default"}
    assert (node["registry"], node["bucket"]) == (o["registry"], o["containerUrl"])
    assert not {"mode", "node_count", "queue_url"} & set(node)  # Slurm's partitions; a node polls no queue


# --- partitions ----------------------------------------------------------------------------------

def test_a_queue_partition_is_an_empty_flexible_scale_set_in_the_nodes_group(azure_run):
    v = azure_run.one(VMSS).inputs
    assert (v["vmScaleSetName"], v["resourceGroupName"]) == ("gpufleet-azure-gpu", "gpufleet-azure-nodes")
    assert (v["orchestrationMode"], v["platformFaultDomainCount"], v["singlePlacementGroup"]) == ("Flexible", 1, False)
    assert azure_run.of_type(AVSET) == [] and len(azure_run.of_type(PARTITION)) == 1
    assert azure_run.one(VMSS).urn.split("::")[2].split("$")[-2] == PARTITION


def test_partitions_key_gives_a_scale_set_and_an_availability_set(two_partitions):
    run = two_partitions
    (vmss,) = run.of_type(VMSS)
    (avset,) = run.of_type(AVSET)
    assert vmss.inputs["vmScaleSetName"] == "gpufleet-azure-small"
    a = avset.inputs
    assert (a["availabilitySetName"], a["resourceGroupName"]) == ("gpufleet-azure-big", "gpufleet-azure-nodes")
    assert (a["platformFaultDomainCount"], a["platformUpdateDomainCount"], a["sku"]) == (1, 1, {"name": "Aligned"})
    parts = nodes_json(run)["partitions"]
    assert (parts["small"]["scale_set_id"], parts["small"]["availability_set_id"]) == (vmss.id, None)
    assert (parts["big"]["scale_set_id"], parts["big"]["availability_set_id"]) == (None, avset.id)
    assert (parts["small"]["spot"], parts["small"]["on_demand_base"], parts["big"]["spot"], parts["big"]["gang"]) == (
        True, 1, False, True)
    assert parts["big"]["vm_size"] == "Standard_ND96isr_H100_v5"
    big = node_json(run, "big")
    assert set(big["instance_types"]) == {"Standard_ND96isr_H100_v5"}
    assert set(node_json(run, "small")["instance_types"]) != set(big["instance_types"])
    conf = controller_file(run, "/etc/slurm/slurm.conf")
    assert "PartitionName=small Nodes=small-[1-8] Default=YES" in conf
    assert "PartitionName=big Nodes=big-[1-4] Default=NO" in conf
    assert run.outputs["partitions"] == ["small", "big"]
    assert run.outputs["partitionGroups"] == {"small": vmss.id, "big": avset.id}


def test_partition_components_carry_what_the_policies_judge(two_partitions):
    props = {r.name: r.inputs for r in two_partitions.of_type(PARTITION)}
    assert props == {
        "partition-small": {"partition": "small", "vmSize": "Standard_ND96asr_v4",
                            "instanceTypes": ["Standard_ND96asr_v4"], "maxNodes": 8, "alwaysOn": 0, "spot": True,
                            "onDemandBase": 1, "gang": False, "gpusPerNode": 8, "infiniband": True,
                            "placement": "scale_set"},
        "partition-big": {"partition": "big", "vmSize": "Standard_ND96isr_H100_v5",
                          "instanceTypes": ["Standard_ND96isr_H100_v5"], "maxNodes": 4, "alwaysOn": 0,
                          "spot": False, "onDemandBase": 0, "gang": True, "gpusPerNode": 8, "infiniband": True,
                          "placement": "availability_set"},
    }


def test_a_one_node_gang_needs_no_availability_set():
    run = run_stack(azure_config(mode="gang", instanceTypes=["Standard_ND96isr_H100_v5"], spot=True,
                                 nodes={"min": 0, "max": 1}))
    assert run.of_type(AVSET) == [] and len(run.of_type(VMSS)) == 1
    part = nodes_json(run)["partitions"]["gpu"]
    assert (part["gang"], part["spot"], part["availability_set_id"]) == (True, True, None)


@pytest.mark.parametrize("overrides,key", [
    ({"partitions": [TWO_PARTITIONS[0], {**TWO_PARTITIONS[1], "spot": True}]}, "gpufleet:partitions[1].spot"),
    ({"mode": "gang", "instanceTypes": ["Standard_ND96isr_H100_v5"], "nodes": {"min": 2, "max": 2}, "spot": True},
     "gpufleet:spot"),
])
def test_a_gang_on_spot_is_a_one_line_config_error_naming_the_key(overrides, key):
    raw = {**overrides}
    if "partitions" in raw:
        raw.update(mode=None, instanceTypes=None, nodes=None, spot=None)
    with pytest.raises(ConfigError) as err:
        azure_config(**raw)
    assert str(err.value).startswith(f"{key}: true is not allowed; false for a gang partition on azure")
    assert "availability set" in str(err.value) and "\n" not in str(err.value)


def test_partition_sizes_on_azure():
    # a Flexible scale set holds 1000 VMs: a queue partition may have more than a placement group's 100
    assert azure_config(nodes={"min": 0, "max": 101}).partitions[0].nodes.max == 101
    with pytest.raises(ConfigError, match=r"^gpufleet:partitions\[1\]\.nodes: .*at most 200 on azure"):
        partitions_config([TWO_PARTITIONS[0], {**TWO_PARTITIONS[1], "nodes": {"max": 201}}])
    with pytest.raises(ConfigError, match=r"^gpufleet:instanceTypes: .*one size on azure"):
        azure_config(instanceTypes=["Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4"])


# --- the munge key ------------------------------------------------------------------------------

def test_munge_secret_holds_the_placeholder_until_the_controller_makes_the_key(azure_run):
    secret = azure_run.one(SECRET)
    name = azure_run.one(VAULT).inputs["vaultName"]
    assert (secret.inputs["secretName"], secret.inputs["vaultName"]) == (derive.MUNGE_SECRET, name)
    assert secret.inputs["properties"]["value"] == "unset" and secret.inputs["tags"][derive.MUNGE_TAG] == "unset"
    o = azure_run.outputs
    assert o["mungeKeySecret"] == f"https://{name}.vault.azure.net/secrets/slurm-munge-key"
    assert parse_secret_url(o["mungeKeySecret"])[:2] == (f"https://{name}.vault.azure.net", "slurm-munge-key")
    assert o["mungeKeySecretId"] == secret.id and secret.id.endswith(f"/vaults/{name}/secrets/slurm-munge-key")


def test_no_secret_value_anywhere_in_resources_or_outputs(azure_run, two_partitions):
    def strings(value):
        if isinstance(value, dict):
            for k, v in value.items():
                yield str(k)
                yield from strings(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value

    for run in (azure_run, two_partitions):
        texts = [s for r in run.resources for s in strings(r.inputs)] + list(strings(run.outputs))
        # the user-data documents, decoded: the controller's, and each partition's node cloud-config inside it
        texts += [controller_user_data(run)] + [node_user_data(run, p) for p in nodes_json(run)["partitions"]]
        for text in texts:
            assert not re.search(r"(?i)adminPassword|client_secret|BEGIN [A-Z ]*PRIVATE KEY|munge\.key|[?&]sig=", text), \
                text[:80]
        # no base64 blob of a munge key's size but the custom data itself
        blobs = [t for t in texts if re.fullmatch(r"[A-Za-z0-9+/=]{1300,}", t)]
        assert all(base64.b64decode(b).startswith(b"#cloud-config") for b in blobs)
        values = [r.inputs["properties"]["value"] for r in run.of_type(SECRET)]
        assert values == ["unset"]
        assert not any("value" in json.dumps(v) for k, v in run.outputs.items() if "munge" in k.lower())


def test_key_vault_is_private_rbac_only_purge_protected(azure_run):
    v = azure_run.one(VAULT).inputs
    name = v["vaultName"]
    assert re.fullmatch(r"[a-z][a-z0-9-]{1,22}[a-z0-9]", name) and name == vault_name("azure", "westeurope")
    p = v["properties"]
    assert p["sku"] == {"family": "A", "name": "standard"} and p["tenantId"]
    assert p["enableRbacAuthorization"] is True and "accessPolicies" not in p
    assert (p["enableSoftDelete"], p["softDeleteRetentionInDays"], p["enablePurgeProtection"]) == (True, 90, True)
    assert p["publicNetworkAccess"] == "Disabled"
    assert p["networkAcls"] == {"defaultAction": "Deny", "bypass": "None"}
    assert azure_run.outputs["keyVault"] == name
    vault_id = next(r.inputs["scope"] for r in azure_run.of_type(ROLE) if r.inputs["scope"].endswith(
        f"/vaults/{name}"))
    assert_private_path(azure_run, "Vault", vault_id, "vault", "privatelink.vaultcore.azure.net")
    assert node_json(azure_run)["azure"]["key_vault"] == name


# --- identities and their roles -------------------------------------------------------------------

def _grants(run) -> set[tuple[str, str, str]]:
    """(principal, role GUID, scope) of every role assignment."""
    return {(r.inputs["principalId"], _role_guid(r.inputs["roleDefinitionId"]), r.inputs["scope"])
            for r in run.of_type(ROLE)}


def test_each_identity_holds_its_roles_on_the_resources_it_needs_only(azure_run):
    run, o = azure_run, azure_run.outputs
    by_name = {r.inputs["resourceName"]: r for r in run.of_type(IDENTITY)}
    nodes_principal, ctl_principal = o["identityPrincipalId"], o["controllerIdentityPrincipalId"]
    ctl = by_name["gpufleet-azure-controller"]
    container = run.one(CONTAINER).id
    jobs, poison = (q.id for q in sorted(run.of_type(QUEUE), key=lambda q: q.inputs["queueName"]))
    secret, vault, registry = run.one(SECRET).id, run.one(VAULT).id, run.one(ACR).id
    nodes_group = next(g.id for g in run.of_type(RG) if g.inputs["resourceGroupName"] == "gpufleet-azure-nodes")
    guid = {r.inputs["roleName"].split()[3]: r.inputs["roleDefinitionId"] for r in run.of_type(ROLE_DEF)}
    team = by_name["gpufleet-azure-team-default"]  # the default team's jobs' identity
    (jobs_blobs,) = [r.inputs for r in run.of_type(ROLE) if r.inputs.get("condition")]
    team_principal = jobs_blobs["principalId"]
    assert team_principal not in (nodes_principal, ctl_principal)
    assert _grants(run) == {
        (team_principal, guid["job-blobs"], container),   # under a condition: its team's prefix
        (team_principal, ACR_PULL, registry),
        (ctl_principal, derive.MANAGED_IDENTITY_OPERATOR, team.id),
        (nodes_principal, derive.STORAGE_BLOB_DATA_CONTRIBUTOR, container),
        (nodes_principal, ACR_PULL, registry),
        (nodes_principal, SECRETS_USER, vault),        # the secrets jobs name in their env
        (nodes_principal, SECRETS_USER, secret),       # the munge key
        (ctl_principal, derive.STORAGE_BLOB_DATA_CONTRIBUTOR, container),
        (ctl_principal, derive.STORAGE_QUEUE_DATA_CONTRIBUTOR, jobs),
        (ctl_principal, derive.STORAGE_QUEUE_DATA_CONTRIBUTOR, poison),
        (ctl_principal, guid["node-launcher"], nodes_group),
        (ctl_principal, guid["subnet-joiner"], o["subnetId"]),
        (ctl_principal, derive.MANAGED_IDENTITY_OPERATOR, by_name["gpufleet-azure-nodes"].id),
        (ctl_principal, guid["munge-keeper"], secret),
    }
    assert ctl.id in run.one(VM).inputs["identity"]["userAssignedIdentities"]
    assert jobs_blobs["condition"] == derive.job_blob_condition("default") and jobs_blobs["conditionVersion"] == "2.0"
    for r in run.of_type(ROLE):
        assert r.inputs["principalType"] == "ServicePrincipal"
        assert re.fullmatch(r"/subscriptions/[0-9a-f-]+/providers/Microsoft.Authorization/roleDefinitions/[0-9a-f-]+",
                            r.inputs["roleDefinitionId"])
        assert "/resourceGroups/" in r.inputs["scope"]  # nothing at subscription scope


def test_custom_roles_are_narrow_and_assignable_only_where_they_are_used(azure_run):
    roles = {r.inputs["roleName"].split()[3]: r.inputs for r in azure_run.of_type(ROLE_DEF)}
    assert set(roles) == {"node-launcher", "subnet-joiner", "munge-keeper", "job-blobs"}
    want = {"node-launcher": (derive.NODE_LAUNCH_ACTIONS, ()), "subnet-joiner": (derive.SUBNET_JOIN_ACTIONS, ()),
            "munge-keeper": ((), derive.MUNGE_KEEPER_DATA_ACTIONS), "job-blobs": ((), derive.JOB_BLOB_DATA_ACTIONS)}
    groups = {g.inputs["resourceGroupName"]: g.id for g in azure_run.of_type(RG)}
    for name, role in roles.items():
        (perm,) = role["permissions"]
        actions, data_actions = want[name]
        assert (perm["actions"], perm["dataActions"]) == (list(actions), list(data_actions)), name
        assert perm["notActions"] == [] and perm["notDataActions"] == []
        assert not any("*" in a for a in perm["actions"] + perm["dataActions"]), name
        assert role["roleType"] == "CustomRole" and role["assignableScopes"] == [role["scope"]]
        assert role["scope"] == groups["gpufleet-azure-nodes" if name == "node-launcher" else "gpufleet-azure"]
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                            role["roleDefinitionId"])
    # the launcher reaches VMs, disks, NICs and the partitions' groups; nothing of Key Vault, storage or roles
    assert {a.split("/")[0] for a in derive.NODE_LAUNCH_ACTIONS} == {"Microsoft.Compute", "Microsoft.Network"}
    assert derive.MUNGE_KEEPER_DATA_ACTIONS == ("Microsoft.KeyVault/vaults/secrets/getSecret/action",
                                                "Microsoft.KeyVault/vaults/secrets/readMetadata/action",
                                                "Microsoft.KeyVault/vaults/secrets/setSecret/action")


def test_a_gallery_image_is_readable_by_the_controller_only_where_it_is():
    gallery = ("/subscriptions/s/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/gpu/versions/"
               "1.2.3")
    run = run_stack(azure_config(image=gallery))
    readers = [r.inputs for r in run.of_type(ROLE) if r.inputs["roleDefinitionId"].endswith(derive.READER)]
    assert [r["scope"] for r in readers] == [gallery.rsplit("/versions/", 1)[0]]
    assert run.one(VM).inputs["storageProfile"]["imageReference"] == {"id": gallery}
    assert nodes_json(run)["partitions"]["gpu"]["image"] == gallery


def test_third_party_marketplace_image_carries_its_plan():
    run = run_stack(azure_config(image="nvidia:ngc_azure_17_11:ngc-base-version-24_03_4_gen2:24.03.4"))
    plan = {"name": "ngc-base-version-24_03_4_gen2", "product": "ngc_azure_17_11", "publisher": "nvidia"}
    assert run.one(VM).inputs["plan"] == plan
    assert nodes_json(run)["partitions"]["gpu"]["plan"] == plan


# --- the shared file system ---------------------------------------------------------------------

def test_shared_file_system_is_premium_nfs_over_tls_through_a_private_endpoint_only(azure_run):
    acc = _account(azure_run, "FileStorage").inputs
    assert acc["sku"] == {"name": "Premium_LRS"} and acc["accountName"] == azure_run.outputs["sharedFilesAccount"]
    assert acc["enableHttpsTrafficOnly"] is True    # secure transfer: Azure Files takes NFS over TLS only
    assert acc["minimumTlsVersion"] == "TLS1_2" and acc["allowSharedKeyAccess"] is False
    assert acc["allowBlobPublicAccess"] is False
    assert acc["publicNetworkAccess"] == "Disabled"
    assert acc["networkRuleSet"] == {"defaultAction": "Deny", "bypass": "None"}
    assert acc["encryption"]["keySource"] == "Microsoft.Storage"
    shares = {s.inputs["shareName"]: s.inputs for s in azure_run.of_type(SHARE)}
    assert set(shares) == {"home", "slurm-state"}
    for share in shares.values():
        assert (share["enabledProtocols"], share["shareQuota"], share["rootSquash"]) == ("NFS", 100, "NoRootSquash")
        assert share["accountName"] == acc["accountName"]
    assert_private_path(azure_run, "SharedFs", _account(azure_run, "FileStorage").id, "file",
                        "privatelink.file.core.windows.net")
    account = acc["accountName"]
    assert azure_run.outputs["homeShare"] == f"{account}.file.core.windows.net:/{account}/home"
    state = controller_file(azure_run, "/etc/gpufleet/controller.json")["mounts"][1]
    assert state == {"source": f"{account}.file.core.windows.net:/{account}/slurm-state",
                     "target": slurm.STATE_DIR, "type": "aznfs", "options": derive.MOUNT_OPTIONS}
    assert [m["target"] for m in node_json(azure_run)["mounts"]] == ["/home"]  # the state is the controller's


def test_controller_waits_for_its_rights_its_shares_and_its_secret(azure_run):
    # registration order on the mock runtime follows the dependencies the program declares
    names = [r.name for r in azure_run.resources]
    vm = names.index("controller-vm")
    for name in ("identity-controller-launch", "identity-controller-subnet", "identity-controller-assign-identity",
                 "vault-munge-keeper-assignment", "shared-fs-home", "shared-fs-slurm-state", "shared-fs-dns-records",
                 "partition-gpu-vmss"):
        assert names.index(name) < vm, name


# --- the storage account, queue and registry --------------------------------------------------------

def test_storage_account_is_locked_down_to_the_two_subnets(azure_run):
    acc = _account(azure_run, "StorageV2").inputs
    assert acc["enableHttpsTrafficOnly"] is True and acc["minimumTlsVersion"] == "TLS1_2"
    assert acc["allowBlobPublicAccess"] is False and acc["allowSharedKeyAccess"] is False
    assert acc["encryption"]["requireInfrastructureEncryption"] is True
    rules = acc["networkRuleSet"]
    assert rules["defaultAction"] == "Deny" and not rules.get("ipRules")
    assert [r["virtualNetworkResourceId"] for r in rules["virtualNetworkRules"]] == [
        azure_run.outputs["subnetId"], azure_run.outputs["controllerSubnetId"]]
    assert azure_run.one(CONTAINER).inputs["publicAccess"] == "None"
    assert sorted(q.inputs["queueName"] for q in azure_run.of_type(QUEUE)) == ["jobs", "jobs-poison"]


def test_registry_is_premium_private_and_pulled_with_the_node_identity_only(azure_run):
    acr = azure_run.one(ACR).inputs
    name = acr["registryName"]
    assert re.fullmatch(r"[a-z0-9]{5,50}", name) and name == registry_name("azure", "westeurope")
    assert acr["sku"] == {"name": "Premium"}  # private endpoints and publicNetworkAccess Disabled need Premium
    assert acr["publicNetworkAccess"] == "Disabled" and acr["networkRuleBypassOptions"] == "None"
    assert acr["adminUserEnabled"] is False and acr["anonymousPullEnabled"] is False
    assert acr["policies"]["exportPolicy"] == {"status": "disabled"}
    assert azure_run.outputs["registry"] == f"{name}.azurecr.io"
    assert_private_path(azure_run, "Registry", azure_run.one(ACR).id, "registry", "privatelink.azurecr.io")
    assert node_json(azure_run)["registry"] == f"{name}.azurecr.io"


def assert_private_path(run, component: str, target_id: str, group_id: str, zone_name: str) -> None:
    """The private path of a component's resource: an endpoint in the node subnet, its records in the
    privatelink zone, the zone linked to the VNet."""
    def one(typ):
        (r,) = [r for r in run.of_type(typ) if r.parent_type == f"gpufleet:azure:{component}"]
        return r.inputs

    endpoint = one(ENDPOINT)
    assert endpoint["subnet"] == {"id": run.outputs["subnetId"]}
    (connection,) = endpoint["privateLinkServiceConnections"]
    assert connection["privateLinkServiceId"] == target_id and connection["groupIds"] == [group_id]
    zone = one(ZONE)
    assert zone["privateZoneName"] == zone_name
    link = one(ZONE_LINK)
    assert link["privateZoneName"] == zone["privateZoneName"] and link["registrationEnabled"] is False
    assert link["virtualNetwork"]["id"].endswith("/virtualNetworks/gpufleet-azure")
    group = one(ZONE_GROUP)
    assert group["privateEndpointName"] == endpoint["privateEndpointName"]
    (config,) = group["privateDnsZoneConfigs"]
    assert config["privateDnsZoneId"].endswith(f"/privateDnsZones/{zone_name}")


# --- monitoring ---------------------------------------------------------------------------------

def test_controller_down_alert_reaches_the_action_group(azure_run):
    group = azure_run.one(ACTION_GROUP)
    assert group.inputs["enabled"] is True and len(group.inputs["groupShortName"]) <= 12
    assert "emailReceivers" not in group.inputs or group.inputs["emailReceivers"] == []
    alert = azure_run.one(METRIC_ALERT).inputs
    assert alert["scopes"] == [azure_run.one(VM).id] and alert["enabled"] is True
    (criterion,) = alert["criteria"]["allOf"]
    assert alert["criteria"]["odataType"] == "Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria"
    assert (criterion["metricNamespace"], criterion["metricName"], criterion["operator"], criterion["threshold"],
            criterion["timeAggregation"]) == ("Microsoft.Compute/virtualMachines", "VmAvailabilityMetric",
                                              "LessThan", 1, "Average")
    assert (alert["windowSize"], alert["evaluationFrequency"]) == ("PT5M", "PT1M")
    assert alert["actions"] == [{"actionGroupId": group.id}]
    assert azure_run.outputs["actionGroup"] == group.id


def test_alert_recipients_are_the_action_groups_receivers():
    run = run_stack(azure_config(alertEmails=["ops@example.com"], alerts=[
        {"email": "ml@example.com"}, {"https": "https://pager.example.com/azure"}]))
    group = run.one(ACTION_GROUP).inputs
    assert [r["emailAddress"] for r in group["emailReceivers"]] == ["ops@example.com", "ml@example.com"]
    assert [r["serviceUri"] for r in group["webhookReceivers"]] == ["https://pager.example.com/azure"]
    assert all(r["useCommonAlertSchema"] is True for r in group["emailReceivers"] + group["webhookReceivers"])
    assert len({r["name"] for r in group["emailReceivers"] + group["webhookReceivers"]}) == 3


# --- outputs ------------------------------------------------------------------------------------

def test_outputs_name_what_users_and_the_cluster_need(azure_run):
    out = azure_run.outputs
    account = out["storageAccount"]
    assert out["containerUrl"] == f"https://{account}.blob.core.windows.net/checkpoints"
    assert out["queueUrl"] == f"https://{account}.queue.core.windows.net/jobs"
    assert out["poisonQueueUrl"] == f"https://{account}.queue.core.windows.net/jobs-poison"
    assert (out["resourceGroup"], out["nodesResourceGroup"]) == ("gpufleet-azure", "gpufleet-azure-nodes")
    assert out["partitions"] == ["gpu"] and out["controllerAddress"] == derive.CONTROLLER_IP
    assert out["sharedFileShares"] == {"home": "home", "slurm-state": "slurm-state"}
    assert out["checkpointUriTemplate"] == f"{out['containerUrl']}/teams/<team>/jobs/<job_id>/"
    assert out["teams"] == ["default"]  # no gpufleet:teams in Pulumi.azure.yaml: the one default team
    for key in ("controller", "controllerId", "controllerIdentityClientId", "controllerIdentityPrincipalId",
                "identityClientId", "mungeKeySecret",
                "mungeKeySecretId", "sharedFilesAccount", "homeShare", "registry", "keyVault", "actionGroup"):
        assert out[key], key
    assert "vmssName" not in out and "autoscaleSetting" not in out


NLP_GROUP = "0b5e9a52-7c1d-4f7e-9a3b-2f6d8c4e1a90"


def test_each_team_has_its_queue_and_its_entra_group_reaches_only_its_own():
    """Issue 23 on Azure: the queue a message came through is the team that sent it; a team's Entra group sends to
    its queue only, takes back its poison messages and keeps records and bundles under its own prefix."""
    run = run_stack(azure_config(teams=[{"name": "vision"}, {"name": "nlp", "azureGroup": NLP_GROUP}]))
    o, account = run.outputs, run.outputs["storageAccount"]
    queues = {q.inputs["queueName"]: q.id for q in run.of_type(QUEUE)}
    assert set(queues) == {"jobs", "jobs-poison", "jobs-nlp", "jobs-nlp-poison"}
    url = f"https://{account}.queue.core.windows.net/"
    assert o["teamQueues"] == {"vision": url + "jobs", "nlp": url + "jobs-nlp"}
    assert o["teamDeadLetterQueues"] == {"vision": url + "jobs-poison", "nlp": url + "jobs-nlp-poison"}
    assert o["queueUrl"] == o["teamQueues"]["vision"]
    ctl = controller_file(run, "/etc/gpufleet/controller.json")
    assert {t["name"]: t["queue_url"] for t in ctl["teams"]} == o["teamQueues"]
    ctl_principal = o["controllerIdentityPrincipalId"]
    assert {q for p, role, q in _grants(run)
            if p == ctl_principal and role == derive.STORAGE_QUEUE_DATA_CONTRIBUTOR} == set(queues.values())
    (blob_role,) = [r for r in run.of_type(ROLE_DEF) if r.inputs["roleName"].split()[3] == "submit-blobs"]
    assert blob_role.inputs["permissions"] == [{"actions": [], "notActions": [], "notDataActions": [],
                                                "dataActions": list(derive.SUBMIT_BLOB_DATA_ACTIONS)}]
    groups = [r.inputs for r in run.of_type(ROLE) if r.inputs["principalType"] == "Group"]
    assert {(g["principalId"], _role_guid(g["roleDefinitionId"]), g["scope"]) for g in groups} == {
        (NLP_GROUP, derive.STORAGE_QUEUE_DATA_MESSAGE_SENDER, queues["jobs-nlp"]),
        (NLP_GROUP, derive.STORAGE_QUEUE_DATA_MESSAGE_PROCESSOR, queues["jobs-nlp-poison"]),
        (NLP_GROUP, blob_role.inputs["roleDefinitionId"], run.one(CONTAINER).id)}  # vision: none given
    (blobs,) = [g for g in groups if g["scope"] == run.one(CONTAINER).id]
    assert blobs["conditionVersion"] == "2.0" and blobs["condition"] == derive.submit_blob_condition("nlp")
    assert all("condition" not in g for g in groups if g is not blobs)
    assert all(r.parent_type.startswith("gpufleet:azure:") for r in run.resources if r.type.startswith("azure-native:"))
    with pytest.raises(ConfigError, match=r"teams\.0\.azureGroup.*only an Azure stack's teams have an Entra group"):
        stack_config("dev", teams=[{"name": "nlp", "azureGroup": NLP_GROUP}])
    with pytest.raises(ConfigError, match=r"teams\.1\.azureGroup"):
        azure_config(teams=[{"name": "vision"}, {"name": "nlp", "azureGroup": "nlp-people"}])


def test_a_teams_blob_condition_reads_writes_and_lists_under_its_prefix_only():
    """The exact ABAC condition (Azure's documented grammar: ActionMatches, SubOperationMatches 'Blob.List', the
    blob path and the listing's prefix attributes)."""
    blobs = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
    assert derive.submit_blob_condition("nlp") == (
        f"((!(ActionMatches{{'{blobs}/read'}} AND NOT SubOperationMatches{{'Blob.List'}})) OR "
        f"(@Resource[{blobs}:path] StringStartsWith 'teams/nlp/jobs/' OR "
        f"@Resource[{blobs}:path] StringStartsWith 'teams/nlp/jobs-index/' OR "
        f"@Resource[{blobs}:path] StringStartsWith 'teams/nlp/code/'))"
        f" AND ((!(ActionMatches{{'{blobs}/write'}}) AND !(ActionMatches{{'{blobs}/add/action'}})) OR "
        f"(@Resource[{blobs}:path] StringStartsWith 'teams/nlp/jobs/' OR "
        f"@Resource[{blobs}:path] StringStartsWith 'teams/nlp/code/'))"
        f" AND ((!(ActionMatches{{'{blobs}/read'}} AND SubOperationMatches{{'Blob.List'}})) OR "
        f"(@Request[{blobs}:prefix] StringStartsWith 'teams/nlp/'))")
    assert derive.SUBMIT_BLOB_DATA_ACTIONS == (f"{blobs}/read", f"{blobs}/write", f"{blobs}/add/action")


def test_the_teams_output_is_the_configs_teams_in_order():
    """The trainer's commands take outputs["teams"][0] as the team of the stack's one queue."""
    teams = [{"name": "speech", "fairShare": 2}, {"name": "nlp"}]
    assert run_stack(azure_config(teams=teams)).outputs["teams"] == ["speech", "nlp"]
