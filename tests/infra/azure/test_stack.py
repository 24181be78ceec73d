"""The Azure stack on Pulumi's mock runtime: what it registers, with which inputs, under which parents."""
from __future__ import annotations

import base64
import importlib
import ipaddress
import inspect
import re

import pytest

from infra.azure import derive
from infra.azure.registry import ACR_PULL, registry_name
from infra.azure.vault import SECRETS_USER, vault_name
from tests.infra.azure.conftest import azure_config, run_stack

RG = "azure-native:resources:ResourceGroup"
VNET, SUBNET, NSG = ("azure-native:network:VirtualNetwork", "azure-native:network:Subnet",
                     "azure-native:network:NetworkSecurityGroup")
ACCOUNT, CONTAINER, QUEUE = ("azure-native:storage:StorageAccount", "azure-native:storage:BlobContainer",
                             "azure-native:storage:Queue")
IDENTITY, ROLE = "azure-native:managedidentity:UserAssignedIdentity", "azure-native:authorization:RoleAssignment"
VMSS, AUTOSCALE = "azure-native:compute:VirtualMachineScaleSet", "azure-native:monitor:AutoscaleSetting"
ACR, ENDPOINT = "azure-native:containerregistry:Registry", "azure-native:network:PrivateEndpoint"
ZONE, ZONE_LINK = "azure-native:privatedns:PrivateZone", "azure-native:privatedns:VirtualNetworkLink"
ZONE_GROUP = "azure-native:network:PrivateDnsZoneGroup"
VAULT = "azure-native:keyvault:Vault"


def _taggable(typ: str) -> bool:
    _, module, kind = typ.split(":")
    cls = getattr(importlib.import_module(f"pulumi_azure_native.{module}"), kind)
    return "tags" in inspect.signature(cls._internal_init).parameters


def test_every_resource_sits_in_a_component_and_every_taggable_one_carries_the_tags(azure_run):
    cfg = azure_config()
    components = {r.type for r in azure_run.resources if r.type.startswith("gpufleet:azure:")}
    assert components == {f"gpufleet:azure:{c}" for c in
                          ("ResourceGroup", "Network", "Storage", "JobQueue", "Identity", "ScaleSet", "Autoscale",
                           "Registry", "Vault")}
    provider = [r for r in azure_run.resources if r.type.startswith("azure-native:")]
    assert {r.type for r in provider} >= {RG, VNET, SUBNET, NSG, ACCOUNT, CONTAINER, QUEUE, IDENTITY, ROLE,
                                          VMSS, AUTOSCALE, ACR, ENDPOINT, ZONE, ZONE_LINK, ZONE_GROUP, VAULT}
    for r in provider:
        assert r.parent_type in components, r.urn
        if _taggable(r.type):
            assert r.inputs.get("tags") == cfg.all_tags, r.urn
        # private DNS zones and their links are global resources
        want = "global" if r.type in (ZONE, ZONE_LINK) else cfg.region
        assert r.inputs.get("location", want) == want, r.urn


def test_network_is_private_and_reaches_storage_by_service_endpoint(azure_run):
    (space,) = azure_run.one(VNET).inputs["addressSpace"]["addressPrefixes"]
    assert not ipaddress.ip_network(space).overlaps(ipaddress.ip_network("172.16.0.0/16"))
    rules = azure_run.one(NSG).inputs["securityRules"]
    inbound_internet = [r for r in rules if r["direction"] == "Inbound" and r.get("sourceAddressPrefix") in
                        ("Internet", "*", "0.0.0.0/0")]
    assert [r["access"] for r in inbound_internet] == ["Deny"]
    assert inbound_internet[0]["destinationPortRange"] == "*" and inbound_internet[0]["protocol"] == "*"
    subnet = azure_run.one(SUBNET).inputs
    assert ipaddress.ip_network(subnet["addressPrefix"]).subnet_of(ipaddress.ip_network(space))
    assert subnet["networkSecurityGroup"]["id"].endswith("/networkSecurityGroups/gpufleet-azure-nodes")
    assert [e["service"] for e in subnet["serviceEndpoints"]] == ["Microsoft.Storage"]
    assert subnet["defaultOutboundAccess"] is False


def test_storage_account_is_locked_down_to_the_node_subnet(azure_run):
    acc = azure_run.one(ACCOUNT).inputs
    assert acc["enableHttpsTrafficOnly"] is True and acc["minimumTlsVersion"] == "TLS1_2"
    assert acc["allowBlobPublicAccess"] is False and acc["allowSharedKeyAccess"] is False
    assert acc["encryption"]["requireInfrastructureEncryption"] is True
    rules = acc["networkRuleSet"]
    assert rules["defaultAction"] == "Deny" and not rules.get("ipRules")
    assert [r["virtualNetworkResourceId"] for r in rules["virtualNetworkRules"]] == [azure_run.outputs["subnetId"]]
    assert azure_run.one(CONTAINER).inputs["publicAccess"] == "None"
    assert sorted(q.inputs["queueName"] for q in azure_run.of_type(QUEUE)) == ["jobs", "jobs-poison"]


def test_identity_gets_data_roles_scoped_to_its_container_and_queues_only(azure_run):
    principal = azure_run.outputs["identityPrincipalId"]
    grants = {(r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"].rsplit("/", 2)[-1])
              for r in azure_run.of_type(ROLE)}
    registry = azure_run.one(ACR).inputs["registryName"]
    assert grants == {(derive.STORAGE_BLOB_DATA_CONTRIBUTOR, "checkpoints"),
                      (derive.STORAGE_QUEUE_DATA_CONTRIBUTOR, "jobs"),
                      (derive.STORAGE_QUEUE_DATA_CONTRIBUTOR, "jobs-poison"),
                      (ACR_PULL, registry), (SECRETS_USER, azure_run.one(VAULT).inputs["vaultName"])}
    for r in azure_run.of_type(ROLE):
        assert r.inputs["principalId"] == principal and r.inputs["principalType"] == "ServicePrincipal"
        assert r.inputs["roleDefinitionId"].startswith("/subscriptions/")
        if r.inputs["roleDefinitionId"].endswith(ACR_PULL):
            assert r.inputs["scope"].endswith("/providers/Microsoft.ContainerRegistry/registries/" + registry)
        elif r.inputs["roleDefinitionId"].endswith(SECRETS_USER):
            assert "/providers/Microsoft.KeyVault/vaults/" in r.inputs["scope"]
        else:
            assert "/storageAccounts/" + azure_run.outputs["storageAccount"] + "/" in r.inputs["scope"]


def test_registry_is_premium_private_and_pulled_with_the_node_identity_only(azure_run):
    acr = azure_run.one(ACR).inputs
    name = acr["registryName"]
    assert re.fullmatch(r"[a-z0-9]{5,50}", name) and name == registry_name("azure", "westeurope")
    assert acr["sku"] == {"name": "Premium"}  # private endpoints and publicNetworkAccess Disabled need Premium
    assert acr["publicNetworkAccess"] == "Disabled" and acr["networkRuleBypassOptions"] == "None"
    assert acr["adminUserEnabled"] is False and acr["anonymousPullEnabled"] is False
    assert "networkRuleSet" not in acr
    assert acr["policies"]["exportPolicy"] == {"status": "disabled"}
    assert azure_run.outputs["registry"] == f"{name}.azurecr.io"
    registry_id = next(r.inputs["scope"] for r in azure_run.of_type(ROLE) if r.inputs["roleDefinitionId"].endswith(
        ACR_PULL))
    # the private path: an endpoint in the node subnet, its records in privatelink.azurecr.io, linked to the VNet
    assert_private_path(azure_run, "Registry", registry_id, "registry", "privatelink.azurecr.io")
    # the nodes learn the login server from node.json
    custom = azure_run.one(VMSS).inputs["virtualMachineProfile"]["osProfile"]["customData"]
    assert f'"registry": "{name}.azurecr.io"' in base64.b64decode(custom).decode()


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


def test_key_vault_is_private_rbac_only_purge_protected_and_read_by_the_node_identity_only(azure_run):
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
    readers = [r.inputs for r in azure_run.of_type(ROLE) if r.inputs["roleDefinitionId"].endswith(SECRETS_USER)]
    (reader,) = readers
    assert reader["principalId"] == azure_run.outputs["identityPrincipalId"]
    assert reader["scope"].endswith(f"/providers/Microsoft.KeyVault/vaults/{name}")
    assert_private_path(azure_run, "Vault", reader["scope"], "vault", "privatelink.vaultcore.azure.net")
    # the nodes learn the vault's name from node.json
    custom = azure_run.one(VMSS).inputs["virtualMachineProfile"]["osProfile"]["customData"]
    assert f'"key_vault": "{name}"' in base64.b64decode(custom).decode()


def test_scale_set_is_one_infiniband_domain_with_ssh_keys_only_on_spot(azure_run):
    cfg = azure_config()
    v = azure_run.one(VMSS).inputs
    assert (v["orchestrationMode"], v["singlePlacementGroup"], v["platformFaultDomainCount"]) == ("Uniform", True, 1)
    assert v["sku"]["name"] == "Standard_ND96asr_v4" and v["sku"]["capacity"] == cfg.nodes.desired
    assert v["identity"]["type"] == "UserAssigned"
    (identity,) = v["identity"]["userAssignedIdentities"]
    assert identity.endswith("/userAssignedIdentities/" + azure_run.one(IDENTITY).inputs["resourceName"])
    p = v["virtualMachineProfile"]
    linux = p["osProfile"]["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True and "adminPassword" not in p["osProfile"]
    assert [k["keyData"] for k in linux["ssh"]["publicKeys"]] == [cfg.ssh_public_key]
    assert p["securityProfile"]["encryptionAtHost"] is True
    assert (p["priority"], p["evictionPolicy"], p["billingProfile"]["maxPrice"]) == ("Spot", "Delete", -1)
    notice = p["scheduledEventsProfile"]["terminateNotificationProfile"]
    assert notice["enable"] is True and notice["notBeforeTimeout"] == "PT10M"
    (nic,) = p["networkProfile"]["networkInterfaceConfigurations"]
    assert nic["enableAcceleratedNetworking"] is True
    (ip,) = nic["ipConfigurations"]
    assert ip["subnet"]["id"] == azure_run.outputs["subnetId"] and "publicIPAddressConfiguration" not in ip
    assert p["storageProfile"]["imageReference"] == derive.image(cfg.image).reference and "plan" not in v


def test_custom_data_is_the_cloud_config_of_this_node(azure_run):
    from infra.userdata import render_user_data

    out = azure_run.outputs
    node = derive.node_settings(
        azure_config(), container_url=out["containerUrl"], queue_url=out["queueUrl"], scale_set=out["vmssName"],
        client_id=out["identityClientId"], resource_group=out["resourceGroup"],
        subscription_id=out["vmssId"].split("/")[2], registry=out["registry"], key_vault=out["keyVault"])
    custom = azure_run.one(VMSS).inputs["virtualMachineProfile"]["osProfile"]["customData"]
    text = base64.b64decode(custom).decode()
    assert text.startswith("#cloud-config") and text == render_user_data(node)


def test_autoscale_follows_the_job_queue_down_to_zero(azure_run):
    a = azure_run.one(AUTOSCALE).inputs
    assert a["enabled"] is True and a["targetResourceUri"] == azure_run.outputs["vmssId"]
    (profile,) = a["profiles"]
    assert profile["capacity"] == {"minimum": "0", "maximum": "4", "default": "0"}
    account_id = azure_run.outputs["vmssId"].split("/providers/")[0] + (
        f"/providers/Microsoft.Storage/storageAccounts/{azure_run.outputs['storageAccount']}")
    for rule in profile["rules"]:
        assert rule["metricTrigger"]["metricName"] == "ApproximateMessageCount"
        assert rule["metricTrigger"]["metricResourceUri"] == account_id + "/services/queue/queues/jobs"
    assert {r["scaleAction"]["direction"] for r in profile["rules"]} == {"Increase", "Decrease"}


def test_scale_events_reach_the_alert_recipients(azure_run):
    assert "notifications" not in azure_run.one(AUTOSCALE).inputs
    run = run_stack(azure_config(alertEmails=["ops@example.com"], alerts=[
        {"email": "ml@example.com"}, {"https": "https://pager.example.com/azure"}]))
    (notice,) = run.one(AUTOSCALE).inputs["notifications"]
    assert notice["operation"] == "Scale"
    assert notice["email"]["customEmails"] == ["ops@example.com", "ml@example.com"]
    assert notice["webhooks"] == [{"serviceUri": "https://pager.example.com/azure"}]


def test_outputs_name_what_users_and_nodes_need(azure_run):
    out = azure_run.outputs
    account = out["storageAccount"]
    assert out["containerUrl"] == f"https://{account}.blob.core.windows.net/checkpoints"
    assert out["queueUrl"] == f"https://{account}.queue.core.windows.net/jobs"
    assert out["poisonQueueUrl"] == f"https://{account}.queue.core.windows.net/jobs-poison"
    assert out["resourceGroup"] == "gpufleet-azure" and out["vmssName"] == "gpufleet-azure-nodes"
    assert out["identityClientId"] and out["autoscaleSetting"] == "gpufleet-azure-autoscale"


def test_gang_mode_on_demand_holds_a_fixed_size_without_autoscale():
    cfg = azure_config(mode="gang", instanceTypes=["Standard_ND96isr_H100_v5"], spot=False,
                       nodes={"min": 2, "desired": 2, "max": 2})
    run = run_stack(cfg)
    assert run.of_type(AUTOSCALE) == [] and "autoscaleSetting" not in run.outputs
    v = run.one(VMSS).inputs
    assert v["sku"] == {"name": "Standard_ND96isr_H100_v5", "tier": "Standard", "capacity": 2}
    p = v["virtualMachineProfile"]
    assert p["priority"] == "Regular" and "evictionPolicy" not in p and "billingProfile" not in p


def test_third_party_marketplace_image_carries_its_plan():
    run = run_stack(azure_config(image="nvidia:ngc_azure_17_11:ngc-base-version-24_03_4_gen2:24.03.4"))
    assert run.one(VMSS).inputs["plan"] == {"name": "ngc-base-version-24_03_4_gen2", "product": "ngc_azure_17_11",
                                            "publisher": "nvidia"}


@pytest.mark.parametrize("max_nodes", [101, 1000])
def test_more_nodes_than_a_placement_group_holds_stops_before_any_resource(max_nodes):
    from infra.config import ConfigError

    with pytest.raises(ConfigError, match="at most 100"):
        run_stack(azure_config(nodes={"min": 0, "desired": 0, "max": max_nodes}))
