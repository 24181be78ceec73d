"""Azure guardrails: storage accounts, VMs and scale sets (SSH keys only, encryption at host), where a Slurm
partition's VMs go (a Flexible scale set, or one availability set for a multi-node InfiniBand gang), the Slurm
controller's hardening, public IPs (a NAT gateway's outbound address only), network security groups, the VNets'
DNS security policy, Key Vaults, and a team's people held to their team's prefix of the blob container.

On Azure the GPU nodes are Slurm CLOUD nodes the controller creates as VMs: each Slurm partition is a
`gpufleet:azure:Partition` component whose properties say what it is and whose child is the group its VMs join,
an empty Flexible scale set (no VM profile, no capacity) or an availability set. The controller is a VM under a
`gpufleet:azure:Controller` component, on a network interface of its own (linked through networkProfile).

(Named azure_rules, not azure: the policy host puts policies/ on sys.path, where `azure.py` would
shadow the Azure SDK's `azure` namespace package.)
"""
from __future__ import annotations

from typing import Optional

from infra.catalog import CATALOG
from policies.common import (UNKNOWN, Resource, Stack, flag, get, items, number, resource_policy, stack_policy,
                             type_chain)
from policies.gpu import is_gang, partition_label, partition_types
from policies.tokens import (AZ_AVSET, AZ_CONTAINER, AZ_CONTROLLER, AZ_DNS_POLICY_LINK, AZ_KEY_VAULT, AZ_NAT_GATEWAY,
                             AZ_NIC, AZ_NSG, AZ_PARTITION, AZ_PUBLIC_IP, AZ_ROLE_ASSIGNMENT, AZ_SECURITY_RULE,
                             AZ_STORAGE, AZ_VM, AZ_VMSS, AZ_VNET)

INTERNET = ("*", "internet", "any", "0.0.0.0/0", "0.0.0.0", "::/0")
TLS_OK = ("TLS1_2", "TLS1_3")
AVAILABILITY_SET_MAX = 200      # VMs one availability set holds
ALIGNED = "Aligned"             # an availability set of VMs with managed disks


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


CONTAINER_SCOPE = "/blobServices/default/containers/"
PEOPLE = ("Group", "User", "ForeignGroup")


def check_people_on_a_container_conditioned(props: dict, ctx):
    """A role a group or user holds on a blob container carries a condition (a team's Entra group is held to
    ``teams/<team>/``: infra.azure.derive.submit_blob_condition); the machines' own identities are others'."""
    scope, kind, condition = props.get("scope"), props.get("principalType"), props.get("condition")
    if UNKNOWN in (scope, kind, condition) or kind not in PEOPLE or not isinstance(scope, str):
        return
    if CONTAINER_SCOPE in scope and not condition:
        yield (f"a {kind} holds a role on the whole container {scope.rsplit('/', 1)[-1]}, with no condition holding "
               "it to a team's prefix")


# --- VMs and scale sets -------------------------------------------------------------------------------

def vm_profile(props: dict, resource_type: str):
    """The part of a VM or scale set that describes its VMs: a VM's own properties, a scale set's
    virtualMachineProfile (None for an empty Flexible scale set, whose VMs bring their own)."""
    return props if resource_type == AZ_VM else props.get("virtualMachineProfile")


def ssh_gaps(profile) -> list[str]:
    """How a VM profile's login falls short of SSH keys only ([] when there is no OS profile to judge)."""
    os_profile = get(profile, "osProfile")
    if os_profile is UNKNOWN or os_profile is None:
        return []
    gaps = []
    if get(os_profile, "adminPassword") is not None:
        gaps.append("osProfile sets an adminPassword")
    linux = get(os_profile, "linuxConfiguration")
    if linux is UNKNOWN:
        return gaps
    if flag(get(linux, "disablePasswordAuthentication")) is not True:
        gaps.append("linuxConfiguration.disablePasswordAuthentication is not true")
    keys = get(linux, "ssh", "publicKeys")
    if keys is not UNKNOWN and not items(keys):
        gaps.append("no SSH public key in linuxConfiguration.ssh.publicKeys")
    return gaps


def host_encryption_gaps(profile) -> list[str]:
    value = get(profile, "securityProfile", "encryptionAtHost")
    if value is not UNKNOWN and flag(value) is not True:
        return ["securityProfile.encryptionAtHost is not true: temp disks and caches are not encrypted"]
    return []


def check_ssh_keys_only(props: dict, ctx):
    profile = vm_profile(props, ctx.resource_type)
    if profile is None or profile is UNKNOWN:
        return
    yield from ssh_gaps(profile)


def check_encryption_at_host(props: dict, ctx):
    profile = vm_profile(props, ctx.resource_type)
    if profile is None or profile is UNKNOWN:
        return
    yield from host_encryption_gaps(profile)


# --- where a partition's VMs go -------------------------------------------------------------------------

def infiniband(part: Resource) -> Optional[bool]:
    """The partition's nodes talk over InfiniBand: its infiniband property, else its sizes in the catalog."""
    value = part.props.get("infiniband")
    if value is UNKNOWN:
        return None
    if value is not None:
        return flag(value)
    return any(CATALOG[t].infiniband_gbps > 0 for t in partition_types(part) if t in CATALOG)


def _domains(group: Resource) -> list[str]:
    value = group.props.get("platformFaultDomainCount")
    if value is UNKNOWN or number(value) == 1:
        return []
    return [f"platformFaultDomainCount {value if value is not None else 'unset'}, not 1"]


def placement_problems(stack: Stack, part: Resource) -> list[str]:
    """How a partition's VM group differs from its kind's: a multi-node InfiniBand gang one availability set (one
    fault domain, Aligned), on demand, of at most 200 VMs; every other partition one Flexible scale set with one
    fault domain."""
    gang, size, ib = is_gang(part.props), number(part.props.get("maxNodes")), infiniband(part)
    if gang is None or size is None or (gang and size > 1 and ib is None):
        return []
    label = partition_label(part)
    sets, avsets = stack.children(part, [AZ_VMSS]), stack.children(part, [AZ_AVSET])
    problems = []
    if gang and size > 1 and ib:
        what = f"multi-node InfiniBand gang {label}"
        if sets:
            problems.append(f"{what} puts its VMs in scale set(s) {', '.join(s.name for s in sets)}: Flexible scale "
                            f"sets have no InfiniBand")
        if not avsets:
            problems.append(f"{what} has no availability set")
        elif len(avsets) > 1:
            problems.append(f"{what} has {len(avsets)} availability sets ({', '.join(a.name for a in avsets)}); "
                            f"its VMs must share one InfiniBand fabric")
        for avset in avsets:
            problems += [f"availability set '{avset.name}' of {label}: {p}" for p in _domains(avset)]
            sku = get(avset.props, "sku", "name")
            if sku is not UNKNOWN and sku != ALIGNED:
                problems.append(f"availability set '{avset.name}' of {label}: sku {sku or 'unset'}, not {ALIGNED} "
                                f"(managed disks)")
        if flag(part.props.get("spot")) is True:
            problems.append(f"{what} runs spot VMs, which an availability set does not take")
        if size > AVAILABILITY_SET_MAX:
            problems.append(f"{what} can reach {size:g} VMs; an availability set holds at most "
                            f"{AVAILABILITY_SET_MAX}")
        return problems
    if avsets:
        problems.append(f"{label} puts its VMs in availability set(s) {', '.join(a.name for a in avsets)}; only a "
                        f"multi-node InfiniBand gang needs one")
    if not sets:
        problems.append(f"{label} has no scale set for its VMs to join")
    elif len(sets) > 1:
        problems.append(f"{label} has {len(sets)} scale sets ({', '.join(s.name for s in sets)}); it needs one")
    for vmss in sets:
        mode = vmss.props.get("orchestrationMode")
        if mode not in ("Flexible", UNKNOWN):
            problems.append(f"scale set '{vmss.name}' of {label}: {mode or 'Uniform (unset)'} orchestration, not "
                            f"Flexible")
        problems += [f"scale set '{vmss.name}' of {label}: {p}" for p in _domains(vmss)]
    return problems


def check_partition_placement(stack: Stack, ctx):
    for part in stack.of(AZ_PARTITION):
        for problem in placement_problems(stack, part):
            yield problem, part.urn


# --- the Slurm controller, public addresses ---------------------------------------------------------------

def controllers(stack: Stack) -> list[Resource]:
    """The stack's Slurm controller VMs: VMs created under a gpufleet:azure:Controller component."""
    return [r for r in stack.of(AZ_VM)
            if stack.under(r, AZ_CONTROLLER) is not None or AZ_CONTROLLER in type_chain(r.urn)[:-1]]


def inline_public_ips(profile) -> list[str]:
    """Public IPs a VM (or scale set) profile creates on the network interfaces it defines itself."""
    found = []
    for nic in items(get(profile, "networkProfile", "networkInterfaceConfigurations")):
        for conf in items(get(nic, "ipConfigurations")):
            if get(conf, "publicIPAddressConfiguration") not in (None, UNKNOWN):
                found.append(f"its network interface configuration '{get(nic, 'name') or '?'}' creates a public IP")
    return found


def nic_public_ips(stack: Stack, nic: Resource) -> list[str]:
    """The public IPs a network interface holds: those of this stack it depends on, or any its ipConfigurations
    name."""
    held = stack.targets(nic, [AZ_PUBLIC_IP], "ipConfigurations")
    if held:
        return [f"public IP '{ip.name}'" for ip in held]
    named = [get(c, "publicIPAddress") for c in items(nic.props.get("ipConfigurations"))]
    return ["a public IP address" for value in named if value not in (None, UNKNOWN)][:1]


def controller_gaps(stack: Stack, vm: Resource) -> list[str]:
    gaps = list(inline_public_ips(vm.props))
    for nic in stack.targets(vm, [AZ_NIC], "networkProfile"):
        gaps += [f"its network interface '{nic.name}' holds {ip}" for ip in nic_public_ips(stack, nic)]
    return gaps + host_encryption_gaps(vm.props) + ssh_gaps(vm.props)


def check_controller(stack: Stack, ctx):
    for vm in controllers(stack):
        for gap in controller_gaps(stack, vm):
            yield f"controller '{vm.name}': {gap}", vm.urn


# What may hold a public IP and take traffic through it (other than a NAT gateway's outbound use).
_HOLDERS = {AZ_NIC: ("ipConfigurations",), AZ_VM: ("networkProfile",), AZ_VMSS: ("virtualMachineProfile",),
            "azure-native:network:LoadBalancer": ("frontendIPConfigurations",),
            "azure-native:network:ApplicationGateway": ("frontendIPConfigurations",),
            "azure-native:network:BastionHost": ("ipConfigurations",),
            "azure-native:network:VirtualNetworkGateway": ("ipConfigurations",)}


def check_public_ips(stack: Stack, ctx):
    for ip in stack.of(AZ_PUBLIC_IP):
        holders = [r for t, props in _HOLDERS.items() for r in stack.referrers(ip, [t], *props)]
        for holder in holders:
            yield f"public IP '{ip.name}' is on {holder.type.rsplit(':', 1)[-1]} '{holder.name}'", ip.urn
        if not stack.referrers(ip, [AZ_NAT_GATEWAY], "publicIpAddresses"):
            yield f"public IP '{ip.name}' is not the outbound address of a NAT gateway of this stack", ip.urn
    for nic in stack.of(AZ_NIC):
        if not stack.targets(nic, [AZ_PUBLIC_IP], "ipConfigurations"):
            for held in nic_public_ips(stack, nic):
                yield f"network interface '{nic.name}' holds {held}", nic.urn
    for r in stack.of(AZ_VM, AZ_VMSS):
        profile = vm_profile(r.props, r.type)
        for found in [] if profile in (None, UNKNOWN) else inline_public_ips(profile):
            yield f"{r.type.rsplit(':', 1)[-1]} '{r.name}': {found}", r.urn


def check_dns_security_policy(stack: Stack, ctx):
    """Every VNet the stack creates is linked to a DNS security policy (a VNet takes one): its VMs' queries to
    Azure-provided DNS are filtered and logged."""
    for vnet in stack.of(AZ_VNET):
        if not stack.referrers(vnet, [AZ_DNS_POLICY_LINK], "virtualNetwork"):
            yield (f"virtual network '{vnet.name}' is linked to no DNS security policy: a job can resolve any name, "
                   f"and tunnel data out through DNS queries"), vnet.urn


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
        "azure-slurm-partition-placement",
        "A multi-node InfiniBand gang partition's VMs share one on-demand availability set of at most 200 (one fault "
        "domain, Aligned); every other partition's VMs join one Flexible scale set with one fault domain.",
        severity="high", frameworks=["gpufleet-gpu"], check=check_partition_placement,
        remediation="Give a multi-node gang partition one child azure-native compute.AvailabilitySet with "
                    "platformFaultDomainCount 1 and sku 'Aligned' (spot false, nodes.max at most 200: the stack "
                    "config enforces both), and every other partition one child VirtualMachineScaleSet with "
                    "orchestrationMode 'Flexible' and platformFaultDomainCount 1 (infra/azure/partition.py)."),
    resource_policy(
        "azure-compute-vm-ssh-keys-only", "Linux VMs and scale set VM profiles allow SSH key login only.",
        types=[AZ_VM, AZ_VMSS], severity="high", frameworks=["CIS"], check=check_ssh_keys_only,
        remediation="Remove adminPassword, set osProfile.linuxConfiguration.disablePasswordAuthentication true and "
                    "add ssh.publicKeys from gpufleet:sshPublicKey (virtualMachineProfile.osProfile on a scale set)."),
    resource_policy(
        "azure-compute-vm-encryption-at-host",
        "VMs and scale set VM profiles encrypt temp disks and caches at the host.",
        types=[AZ_VM, AZ_VMSS], severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_encryption_at_host,
        remediation="Set securityProfile.encryptionAtHost true (virtualMachineProfile.securityProfile on a scale "
                    "set; register the EncryptionAtHost feature on the subscription). An empty Flexible scale set "
                    "has no VM profile: the node provider sets it on each VM it creates."),
    stack_policy(
        "azure-slurm-controller-hardened",
        "The Slurm controller VM holds no public IP, encrypts at the host and allows SSH key login only.",
        severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_controller,
        remediation="Give the controller a network interface in the private controller subnet with no public IP "
                    "(outbound through the subnet's NAT gateway), securityProfile.encryptionAtHost true and "
                    "osProfile.linuxConfiguration {disablePasswordAuthentication: true, ssh.publicKeys} with no "
                    "adminPassword; reach it with Azure Bastion or from the VNet."),
    stack_policy(
        "azure-network-publicip-nat-only",
        "A public IP in the stack is only a NAT gateway's outbound address: no VM, scale set or network interface "
        "holds one.",
        severity="high", frameworks=["CIS"], check=check_public_ips,
        remediation="Remove the public IP from the network interface (or VM/scale set network configuration) and "
                    "give its subnet a NAT gateway whose publicIpAddresses name the address; reach VMs from the "
                    "VNet or through Azure Bastion."),
    stack_policy(
        "azure-network-vnet-dns-security-policy",
        "VNets of the stack resolve names through a DNS security policy that filters and logs their queries.",
        severity="medium", frameworks=["CIS", "GDPR", "HIPAA"], check=check_dns_security_policy,
        remediation="Link an azure-native dnsresolver.DnsResolverPolicy to the VNet "
                    "(DnsResolverPolicyVirtualNetworkLink with virtualNetwork.id of the VNet) whose rules allow the "
                    "Azure service domains the nodes need and block every other domain ('.'), and send its "
                    "DnsResponse logs to a Log Analytics workspace (infra.azure.dns_firewall)."),
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
        "azure-authorization-team-container-role-conditioned",
        "A role a group or user holds on a blob container is held to the team's prefix by a condition.",
        types=[AZ_ROLE_ASSIGNMENT], severity="high", frameworks=["CIS", "GDPR"],
        check=check_people_on_a_container_conditioned,
        remediation="Give the assignment condition (version 2.0) holding reads, writes and listings to "
                    "'teams/<team>/' (infra.azure.derive.submit_blob_condition), or name the team's group in "
                    "gpufleet:teams[].azureGroup and let the stack assign it."),
    resource_policy(
        "azure-keyvault-vault-no-public-access", "Key Vaults deny the public network (disabled or deny by default).",
        types=[AZ_KEY_VAULT], severity="high", frameworks=["CIS", "GDPR"], check=check_vault_no_public_access,
        remediation="Set properties.publicNetworkAccess 'Disabled' and reach the vault through a private endpoint "
                    "with the privatelink.vaultcore.azure.net zone."),
]
