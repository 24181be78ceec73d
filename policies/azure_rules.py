"""Azure guardrails: storage accounts, InfiniBand scale sets, network security groups, Key Vaults.

(Named azure_rules, not azure: the policy host puts policies/ on sys.path, where `azure.py` would
shadow the Azure SDK's `azure` namespace package.)
"""
from __future__ import annotations

from infra.catalog import CATALOG
from policies.common import UNKNOWN, Stack, flag, get, items, number, resource_policy, stack_policy
from policies.tokens import AZ_AUTOSCALE, AZ_CONTAINER, AZ_KEY_VAULT, AZ_NSG, AZ_SECURITY_RULE, AZ_STORAGE, AZ_VMSS

INTERNET = ("*", "internet", "any", "0.0.0.0/0", "0.0.0.0", "::/0")
TLS_OK = ("TLS1_2", "TLS1_3")
MAX_SINGLE_PLACEMENT_GROUP = 100


def check_https_only(props: dict, ctx):
    # Omitted means true since API version 2019-04-01.
    if flag(props.get("enableHttpsTrafficOnly")) is False:
        yield "enableHttpsTrafficOnly is false"


def check_min_tls(props: dict, ctx):
    tls = props.get("minimumTlsVersion")
    if tls is not UNKNOWN and tls not in TLS_OK:
        yield f"minimumTlsVersion is {tls or 'unset'}; set TLS1_2"


def check_no_public_blob(props: dict, ctx):
    if ctx.resource_type == AZ_CONTAINER:
        access = props.get("publicAccess")
        if access not in (None, "None", UNKNOWN):
            yield f"container publicAccess is {access}"
    elif flag(props.get("allowBlobPublicAccess")) is True:
        yield "allowBlobPublicAccess is true"


def check_no_shared_key(props: dict, ctx):
    # Omitted means true (shared key allowed).
    if props.get("allowSharedKeyAccess") is not UNKNOWN and flag(props.get("allowSharedKeyAccess")) is not False:
        yield "allowSharedKeyAccess is not false: account keys and SAS signed with them still work"


def check_restricted_network(props: dict, ctx):
    default_action = get(props, "networkRuleSet", "defaultAction")
    public = props.get("publicNetworkAccess")
    if UNKNOWN in (default_action, public) or public == "Disabled" or default_action == "Deny":
        return
    yield f"network default action is {default_action or 'Allow (unset)'} and publicNetworkAccess is {public or 'unset'}"


def check_vault_rbac_purge_protected(props: dict, ctx):
    vault = props.get("properties")
    if vault is UNKNOWN:
        return
    if flag(get(vault, "enableRbacAuthorization")) not in (True, UNKNOWN):
        yield "properties.enableRbacAuthorization is not true: access policies, not Azure RBAC, decide who reads"
    if flag(get(vault, "enablePurgeProtection")) not in (True, UNKNOWN):
        yield "properties.enablePurgeProtection is not true: a deleted secret or vault can be purged at once"
    if flag(get(vault, "enableSoftDelete")) is False:
        yield "properties.enableSoftDelete is false"


def check_vault_no_public_access(props: dict, ctx):
    public = get(props, "properties", "publicNetworkAccess")
    default_action = get(props, "properties", "networkAcls", "defaultAction")
    if UNKNOWN in (public, default_action) or public == "Disabled" or default_action == "Deny":
        return
    yield (f"properties.publicNetworkAccess is {public or 'Enabled (unset)'} and networkAcls.defaultAction is "
           f"{default_action or 'Allow (unset)'}")


def infiniband(vmss_props: dict) -> bool:
    row = CATALOG.get(get(vmss_props, "sku", "name"))
    return row is not None and row.infiniband_gbps > 0


def check_infiniband_scale_set(stack: Stack, ctx):
    for vmss in stack.of(AZ_VMSS):
        props = vmss.props
        if not infiniband(props):
            continue
        sku = get(props, "sku", "name")
        mode = props.get("orchestrationMode")
        if mode not in (None, "Uniform", UNKNOWN):
            yield f"InfiniBand scale set '{vmss.name}' uses {mode} orchestration; IB needs Uniform", vmss.urn
        if flag(props.get("singlePlacementGroup")) is False:
            yield f"InfiniBand scale set '{vmss.name}' spans placement groups; IB only reaches within one", vmss.urn
        domains = number(props.get("platformFaultDomainCount"))
        if props.get("platformFaultDomainCount") is not UNKNOWN and domains != 1:
            yield (f"InfiniBand scale set '{vmss.name}' has platformFaultDomainCount "
                   f"{props.get('platformFaultDomainCount') or 'unset'}; set 1"), vmss.urn
        sizes = [number(get(vmss.props, "sku", "capacity")) or 0]
        for setting in stack.referrers(vmss, [AZ_AUTOSCALE], "targetResourceUri"):
            sizes += [number(get(p, "capacity", "maximum")) or 0 for p in items(setting.props.get("profiles"))]
        if max(sizes) > MAX_SINGLE_PLACEMENT_GROUP:
            yield (f"InfiniBand scale set '{vmss.name}' ({sku}) can reach {max(sizes):g} instances; a single "
                   f"placement group holds at most {MAX_SINGLE_PLACEMENT_GROUP}"), vmss.urn


def check_ssh_keys_only(props: dict, ctx):
    os_profile = get(props, "virtualMachineProfile", "osProfile")
    if os_profile is UNKNOWN or os_profile is None:
        return
    if get(os_profile, "adminPassword") is not None:
        yield "osProfile sets an adminPassword"
    linux = get(os_profile, "linuxConfiguration")
    if linux is UNKNOWN:
        return
    if flag(get(linux, "disablePasswordAuthentication")) is not True:
        yield "linuxConfiguration.disablePasswordAuthentication is not true"
    keys = get(linux, "ssh", "publicKeys")
    if keys is not UNKNOWN and not items(keys):
        yield "no SSH public key in linuxConfiguration.ssh.publicKeys"


def check_encryption_at_host(props: dict, ctx):
    value = get(props, "virtualMachineProfile", "securityProfile", "encryptionAtHost")
    if value is not UNKNOWN and flag(value) is not True:
        yield "securityProfile.encryptionAtHost is not true: temp disks and caches are not encrypted"


def _internet_sources(rule: dict) -> list[str]:
    sources = [rule.get("sourceAddressPrefix")] + items(rule.get("sourceAddressPrefixes"))
    return [s for s in sources if isinstance(s, str) and s.lower() in INTERNET]


def check_nsg_inbound(props: dict, ctx):
    rules = items(props.get("securityRules")) if ctx.resource_type == AZ_NSG else [props]
    for rule in rules:
        if not isinstance(rule, dict):
            continue
        if rule.get("direction") == "Inbound" and rule.get("access") == "Allow":
            for source in _internet_sources(rule):
                yield (f"rule '{rule.get('name') or 'inline'}' allows inbound {rule.get('protocol', '*')} "
                       f"port {rule.get('destinationPortRange') or rule.get('destinationPortRanges')} from {source}")


_STORAGE = [AZ_STORAGE]
POLICIES = [
    resource_policy(
        "azure-storage-account-https-only", "Storage accounts accept HTTPS traffic only.",
        types=_STORAGE, severity="high", frameworks=["CIS", "HIPAA"], check=check_https_only,
        remediation="Set enableHttpsTrafficOnly true."),
    resource_policy(
        "azure-storage-account-min-tls", "Storage accounts require TLS 1.2 or newer.",
        types=_STORAGE, severity="high", frameworks=["CIS", "HIPAA"], check=check_min_tls,
        remediation="Set minimumTlsVersion 'TLS1_2'."),
    resource_policy(
        "azure-storage-account-no-public-blob", "Storage accounts and containers allow no anonymous blob access.",
        types=[AZ_STORAGE, AZ_CONTAINER], severity="critical", frameworks=["CIS", "GDPR"], check=check_no_public_blob,
        remediation="Set allowBlobPublicAccess false on the account and publicAccess 'None' on containers."),
    resource_policy(
        "azure-storage-account-no-shared-key", "Storage accounts disable shared-key authorization (Entra ID only).",
        types=_STORAGE, severity="high", frameworks=["CIS"], check=check_no_shared_key,
        remediation="Set allowSharedKeyAccess false and grant the nodes' managed identity "
                    "'Storage Blob Data Contributor' and 'Storage Queue Data Contributor'."),
    resource_policy(
        "azure-storage-account-restricted-network", "Storage accounts deny network access by default.",
        types=_STORAGE, severity="high", frameworks=["CIS", "GDPR"], check=check_restricted_network,
        remediation="Set networkRuleSet {defaultAction: 'Deny', bypass: 'AzureServices', virtualNetworkRules: "
                    "[the node subnet]} or publicNetworkAccess 'Disabled' with a private endpoint."),
    stack_policy(
        "azure-compute-vmss-infiniband-layout",
        "Scale sets on InfiniBand sizes are Uniform, one placement group, one fault domain, at most 100 nodes.",
        severity="high", frameworks=["gpufleet-gpu"], check=check_infiniband_scale_set,
        remediation="Set orchestrationMode 'Uniform', singlePlacementGroup true, platformFaultDomainCount 1, and "
                    "keep sku.capacity and the autoscale maximum at or below 100."),
    resource_policy(
        "azure-compute-vmss-ssh-keys-only", "Linux scale sets allow SSH key login only.",
        types=[AZ_VMSS], severity="high", frameworks=["CIS"], check=check_ssh_keys_only,
        remediation="Remove adminPassword, set linuxConfiguration.disablePasswordAuthentication true and "
                    "add ssh.publicKeys from gpufleet:sshPublicKey."),
    resource_policy(
        "azure-compute-vmss-encryption-at-host", "Scale sets encrypt temp disks and caches at the host.",
        types=[AZ_VMSS], severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_encryption_at_host,
        remediation="Set virtualMachineProfile.securityProfile.encryptionAtHost true "
                    "(register the EncryptionAtHost feature on the subscription)."),
    resource_policy(
        "azure-network-nsg-no-internet-inbound", "Network security groups allow nothing inbound from the internet.",
        types=[AZ_NSG, AZ_SECURITY_RULE], severity="critical", frameworks=["CIS"], check=check_nsg_inbound,
        remediation="Restrict sourceAddressPrefix to VirtualNetwork or a known range; use Azure Bastion for SSH."),
    resource_policy(
        "azure-keyvault-vault-rbac-purge-protected",
        "Key Vaults authorize with Azure RBAC and keep deleted secrets (soft delete, purge protection).",
        types=[AZ_KEY_VAULT], severity="high", frameworks=["CIS", "HIPAA"], check=check_vault_rbac_purge_protected,
        remediation="Set properties.enableRbacAuthorization, enableSoftDelete and enablePurgeProtection true and "
                    "grant readers 'Key Vault Secrets User' on the vault."),
    resource_policy(
        "azure-keyvault-vault-no-public-access", "Key Vaults deny the public network (disabled or deny by default).",
        types=[AZ_KEY_VAULT], severity="high", frameworks=["CIS", "GDPR"], check=check_vault_no_public_access,
        remediation="Set properties.publicNetworkAccess 'Disabled' and reach the vault through a private endpoint "
                    "with the privatelink.vaultcore.azure.net zone."),
]
