"""DNS firewall: the stack's VNet resolves only the names its nodes and controller need, and every query is logged.

An Azure DNS security policy (ARM's `Microsoft.Network/dnsResolverPolicies`) linked to the VNet filters every query
the VNet's VMs send to Azure-provided DNS (168.63.129.16), public names and private zones alike. Two traffic rules:
the names the stack uses are allowed first (priority 100; a rule covers a domain and every name below it), and a
list holding `.`, every name, is blocked after (priority 200; the answer is SERVFAIL, the one block response the
API offers). That closes DNS as a way to carry data out (a job resolving `<data>.attacker.example`).

The names: Storage (`core.windows.net`: the account's blob and queue hosts, reached through the subnets' service
endpoint, and their `store.core.windows.net` targets; the shared file system's `file` host and its
`privatelink.file.core.windows.net` zone), Key Vault (`vault.azure.net` and its `privatelink.vaultcore.azure.net`
zone), the registry (`azurecr.io`: the login server, its regional data endpoints, `privatelink.azurecr.io`),
Resource Manager (`management.azure.com`, the controller's node provider) and the VMs' own names
(`internal.cloudapp.net`). Tokens and Scheduled Events come from the metadata service by address, not by name.
Azure documents that a rule judges the name queried; whether it also judges the names a CNAME answer leads to is
not documented, and Resource Manager's front-door names lie outside this list: a first deployment should read
the log for blocked answers to the controller.

The log: the policy's diagnostic setting sends its `DnsResponse` category (every query, the rule that matched and
its action) to a Log Analytics workspace of the stack, in the resource-specific table `DNSQueryLogs`, kept as
long as the data's classification asks (at most 730 days: a workspace's interactive retention).

The VNet is always the stack's own on Azure (infra.azure.network): a VNet links to one policy only.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import dnsresolver, monitor, operationalinsights

ALLOW_PRIORITY, BLOCK_PRIORITY = 100, 200   # 100..65000; the lower is judged first
ALLOWED_DOMAINS = ("core.windows.net.", "vault.azure.net.", "vaultcore.azure.net.", "azurecr.io.",
                   "management.azure.com.", "internal.cloudapp.net.")
EVERY_DOMAIN = "."
LOG_CATEGORY = "DnsResponse"
LOG_RETENTION_DAYS = {"public": 30, "internal": 90, "personal": 365, "phi": 730}


@dataclass(frozen=True)
class DnsFirewallArgs:
    name: str                            # the stack's base name
    resource_group: pulumi.Input[str]
    location: str
    vnet_id: pulumi.Input[str]
    classification: str                  # gpufleet:dataClassification: how long the log is kept
    tags: dict


class DnsFirewall(pulumi.ComponentResource):
    def __init__(self, name: str, args: DnsFirewallArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:azure:DnsFirewall", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        rg, location, tags, n = args.resource_group, args.location, args.tags, args.name
        self.policy = dnsresolver.DnsResolverPolicy(
            f"{name}-policy", dns_resolver_policy_name=f"{n}-dns", resource_group_name=rg, location=location,
            tags=tags, opts=child)
        allowed = dnsresolver.DnsResolverDomainList(
            f"{name}-allowed", dns_resolver_domain_list_name=f"{n}-dns-allowed", resource_group_name=rg,
            location=location, domains=list(ALLOWED_DOMAINS), tags=tags, opts=child)
        everything = dnsresolver.DnsResolverDomainList(
            f"{name}-everything", dns_resolver_domain_list_name=f"{n}-dns-everything", resource_group_name=rg,
            location=location, domains=[EVERY_DOMAIN], tags=tags, opts=child)
        for rule, priority, action, domains in (
                ("allow-azure-and-vnet-names", ALLOW_PRIORITY, dnsresolver.DnsSecurityRuleActionArgs(
                    action_type="Allow"), allowed),
                ("block-everything-else", BLOCK_PRIORITY, dnsresolver.DnsSecurityRuleActionArgs(
                    action_type="Block", block_response_code="SERVFAIL"), everything)):
            dnsresolver.DnsSecurityRule(
                f"{name}-{rule}", dns_security_rule_name=rule, dns_resolver_policy_name=self.policy.name,
                resource_group_name=rg, location=location, priority=priority, action=action,
                dns_resolver_domain_lists=[dnsresolver.SubResourceArgs(id=domains.id)],
                dns_security_rule_state="Enabled", tags=tags, opts=child)
        self.link = dnsresolver.DnsResolverPolicyVirtualNetworkLink(
            f"{name}-vnet", dns_resolver_policy_virtual_network_link_name="vnet",
            dns_resolver_policy_name=self.policy.name, resource_group_name=rg, location=location,
            virtual_network=dnsresolver.SubResourceArgs(id=args.vnet_id), tags=tags, opts=child)

        self.workspace = operationalinsights.Workspace(
            f"{name}-queries", workspace_name=f"{n}-dns-queries", resource_group_name=rg, location=location,
            sku=operationalinsights.WorkspaceSkuArgs(name="PerGB2018"),
            retention_in_days=LOG_RETENTION_DAYS[args.classification], tags=tags, opts=child)
        monitor.DiagnosticSetting(
            f"{name}-queries", name="dns-queries", resource_uri=self.policy.id, workspace_id=self.workspace.id,
            log_analytics_destination_type="Dedicated",
            logs=[monitor.DiagnosticsLogSettingsArgs(category=LOG_CATEGORY, enabled=True)], opts=child)
        self.register_outputs({"policy": self.policy.id, "workspace": self.workspace.name})
