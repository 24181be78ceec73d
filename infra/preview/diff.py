"""Diff two preview JSON documents (base branch, head branch) the way a reviewer reads a change.

``compute(base, head)`` returns::

    {"added": [res], "removed": [res], "renamed": [rename], "changed": [change],
     "policy": {"appeared": [violation], "disappeared": [violation]},
     "cost": {"delta_monthly_usd": {"idle", "full"}, "currency"},   # head minus base, in head's currency
     "summary": {...counts...}}

where ``res`` is ``{"urn", "type", "name"}``, ``change`` is ``{"urn", "type", "name", "paths", "values",
"replace", "replace_paths"}`` and ``rename`` is ``{"from", "to", "type"}``.

Semantics, loosely matching what ``pulumi preview`` would plan:
- Resources are matched by URN. Input paths are written ``tags.team`` and ``networkInterfaces[3].interfaceType``;
  a list of ``{key, ...}`` objects (an autoscaling group's tags) is matched by key, not position:
  ``tags[key=team].value``. A string holding a JSON document (an IAM or bucket policy) is compared
  inside, so its paths continue ``policy.Statement[0].Effect``.
- A change is a replacement when a changed path is (or lies under) a replace-causing property of that
  resource type in ``REPLACE_ON`` (the provider's ForceNew / URL-path properties), else an in-place update.
  A type missing from the table is never marked; tests/infra/review checks that it lists every type the
  dev, prod and azure stacks create.
- Rename: a removed and an added resource of the same type, with the same parent (or the parent's own
  rename target) and identical inputs, are reported as one rename instead of an add and a remove. That is
  the case a Pulumi alias (``opts.aliases=[Alias(name=old)]``) turns into a no-op; without one, ``pulumi up``
  deletes and recreates it, so the report says so.
- Secret values never appear: a value that the preview already masked, or that sits under a key whose name
  says it is secret (password, token, private key, ...), is shown as ``[secret]``.
A stack diffed against itself gives empty lists and zero cost deltas.
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterator

SECRET = "[secret]"
# The marker the Pulumi SDK uses for a serialised secret value.
_PULUMI_SECRET_SIG = "4dabf18193072939515e22adb298388d"
_SECRET_KEY = re.compile(r"(password|secret|token|privatekey|private_key|connectionstring|accesskey|sasurl)", re.I)
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_\-:/@+=$]+\Z")

ANY = "*"  # every change replaces (a resource the provider cannot update)
# Replace-causing input properties per resource type (paths as above; a change at or under one replaces).
# AWS: the Terraform provider's ForceNew arguments that pulumi-aws maps to these camelCase inputs.
# azure-native: the resource's URL path (its name and resourceGroupName) plus `location` are immutable.
REPLACE_ON: dict[str, tuple[str, ...]] = {
    # network
    "aws:ec2/vpc:Vpc": ("cidrBlock", "ipv4IpamPoolId", "ipv4NetmaskLength"),
    "aws:ec2/subnet:Subnet": ("cidrBlock", "availabilityZone", "availabilityZoneId", "vpcId"),
    "aws:ec2/securityGroup:SecurityGroup": ("name", "namePrefix", "description", "vpcId"),
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": ("vpcId",),
    "aws:ec2/securityGroupRule:SecurityGroupRule": (
        "type", "fromPort", "toPort", "protocol", "cidrBlocks", "ipv6CidrBlocks", "prefixListIds",
        "self", "sourceSecurityGroupId", "securityGroupId"),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": ("securityGroupId",),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": ("securityGroupId",),
    "aws:ec2/placementGroup:PlacementGroup": ("name", "strategy", "partitionCount", "spreadLevel"),
    "aws:ec2/vpcEndpoint:VpcEndpoint": ("vpcId", "serviceName", "vpcEndpointType"),
    "aws:ec2/natGateway:NatGateway": ("allocationId", "subnetId", "connectivityType"),
    "aws:ec2/routeTable:RouteTable": ("vpcId",),
    "aws:ec2/routeTableAssociation:RouteTableAssociation": ("subnetId", "gatewayId"),
    "aws:ec2/flowLog:FlowLog": ("vpcId", "subnetId", "logDestination", "logDestinationType", "trafficType",
                                "iamRoleArn", "maxAggregationInterval"),
    # the DNS firewall (infra/aws/dns_firewall.py)
    "aws:route53/resolverFirewallDomainList:ResolverFirewallDomainList": ("name",),
    "aws:route53/resolverFirewallRuleGroup:ResolverFirewallRuleGroup": ("name",),
    "aws:route53/resolverFirewallRule:ResolverFirewallRule": ("name", "firewallRuleGroupId", "firewallDomainListId",
                                                              "qType"),
    "aws:route53/resolverFirewallRuleGroupAssociation:ResolverFirewallRuleGroupAssociation": (
        "firewallRuleGroupId", "vpcId"),
    "aws:route53/resolverQueryLogConfig:ResolverQueryLogConfig": ("name", "destinationArn"),
    "aws:route53/resolverQueryLogConfigAssociation:ResolverQueryLogConfigAssociation": (
        "resolverQueryLogConfigId", "resourceId"),
    # storage
    "aws:s3/bucket:Bucket": ("bucket", "bucketPrefix", "objectLockEnabled"),
    "aws:s3/bucketVersioning:BucketVersioning": ("bucket", "expectedBucketOwner"),
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": (
        "bucket", "expectedBucketOwner"),
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": ("bucket",),
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": ("bucket",),
    "aws:s3/bucketPolicy:BucketPolicy": ("bucket",),
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": ("bucket", "expectedBucketOwner"),
    "aws:s3/bucketLogging:BucketLogging": ("bucket", "expectedBucketOwner"),
    "aws:kms/key:Key": ("customerMasterKeySpec", "keyUsage", "multiRegion", "customKeyStoreId", "xksKeyId"),
    "aws:kms/alias:Alias": ("name", "namePrefix"),
    # queue
    "aws:sqs/queue:Queue": ("name", "namePrefix", "fifoQueue"),
    "aws:sqs/queuePolicy:QueuePolicy": ("queueUrl",),
    "aws:sqs/redrivePolicy:RedrivePolicy": ("queueUrl",),
    "aws:sqs/redriveAllowPolicy:RedriveAllowPolicy": ("queueUrl",),
    # identity
    "aws:iam/role:Role": ("name", "namePrefix", "path"),
    "aws:iam/instanceProfile:InstanceProfile": ("name", "namePrefix", "path"),
    "aws:iam/policy:Policy": ("name", "namePrefix", "path", "description"),
    "aws:iam/rolePolicy:RolePolicy": ("name", "namePrefix", "role"),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ("role", "policyArn"),
    "aws:secretsmanager/secret:Secret": ("name", "namePrefix"),
    # compute: a launch template change (instanceType, userData, ...) makes a new version, not a replacement
    "aws:ec2/launchTemplate:LaunchTemplate": ("name", "namePrefix"),
    # the controller: its user-data is replace-on-change (its state is on the shared file system)
    "aws:ec2/instance:Instance": ("ami", "availabilityZone", "associatePublicIpAddress", "hostId", "keyName",
                                  "networkInterfaces", "placementGroup", "privateIp", "subnetId", "tenancy",
                                  "userData", "userDataBase64", "rootBlockDevice.encrypted",
                                  "rootBlockDevice.kmsKeyId"),
    "aws:ec2/networkInterface:NetworkInterface": ("subnetId", "interfaceType"),
    # the shared file system
    "aws:efs/fileSystem:FileSystem": ("creationToken", "encrypted", "kmsKeyId", "performanceMode",
                                      "availabilityZoneName"),
    "aws:efs/accessPoint:AccessPoint": ("fileSystemId", "posixUser", "rootDirectory"),
    "aws:efs/mountTarget:MountTarget": ("fileSystemId", "subnetId", "ipAddress"),
    "aws:efs/fileSystemPolicy:FileSystemPolicy": ("fileSystemId",),
    "aws:efs/backupPolicy:BackupPolicy": ("fileSystemId",),
    # registry: a repository's encryption is fixed at creation
    "aws:ecr/repository:Repository": ("name", "encryptionConfigurations"),
    "aws:ecr/lifecyclePolicy:LifecyclePolicy": ("repository",),
    "aws:ecr/repositoryPolicy:RepositoryPolicy": ("repository",),
    "aws:ecr/pullThroughCacheRule:PullThroughCacheRule": ("ecrRepositoryPrefix", "upstreamRegistryUrl",
                                                          "upstreamRepositoryPrefix"),
    "aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate": ("prefix",),
    # monitoring
    "aws:cloudwatch/logGroup:LogGroup": ("name", "namePrefix"),
    "aws:cloudwatch/metricAlarm:MetricAlarm": ("name",),
    "aws:cloudwatch/dashboard:Dashboard": ("dashboardName",),
    "aws:sns/topic:Topic": ("name", "namePrefix", "fifoTopic"),
    "aws:sns/topicPolicy:TopicPolicy": ("arn",),
    "aws:sns/topicSubscription:TopicSubscription": ("topic", "protocol", "endpoint"),
    "aws:budgets/budget:Budget": ("name", "namePrefix", "accountId"),
    # azure-native (v3)
    "azure-native:resources:ResourceGroup": ("resourceGroupName",),
    # Azure updates a VNet's address space in place, but not while subnets use the old range; the
    # review treats it as a replacement (issue 8) because in practice it means rebuilding the network.
    "azure-native:network:VirtualNetwork": ("virtualNetworkName", "addressSpace"),
    "azure-native:network:Subnet": ("subnetName", "virtualNetworkName"),
    "azure-native:network:NetworkSecurityGroup": ("networkSecurityGroupName",),
    "azure-native:managedidentity:UserAssignedIdentity": ("resourceName",),
    "azure-native:storage:StorageAccount": ("accountName", "encryption.requireInfrastructureEncryption"),
    "azure-native:storage:BlobServiceProperties": ("accountName", "blobServicesName"),
    "azure-native:storage:BlobContainer": ("containerName", "accountName"),
    "azure-native:storage:Queue": ("queueName", "accountName"),
    # Role assignments are immutable in Azure (RoleAssignmentUpdateNotPermitted).
    "azure-native:authorization:RoleAssignment": ("roleAssignmentName", "scope", "principalId",
                                                  "roleDefinitionId"),
    "azure-native:compute:VirtualMachineScaleSet": ("vmScaleSetName", "orchestrationMode",
                                                    "platformFaultDomainCount", "singlePlacementGroup"),
    "azure-native:compute:VirtualMachine": ("vmName", "osProfile.computerName", "osProfile.adminUsername",
                                            "osProfile.customData", "storageProfile.osDisk.createOption",
                                            "priority", "availabilitySet", "virtualMachineScaleSet", "zones"),
    "azure-native:compute:AvailabilitySet": ("availabilitySetName", "platformFaultDomainCount",
                                             "platformUpdateDomainCount"),
    "azure-native:network:NetworkInterface": ("networkInterfaceName",),
    "azure-native:network:NatGateway": ("natGatewayName", "zones"),
    "azure-native:network:PublicIPAddress": ("publicIpAddressName", "sku", "zones", "publicIPAddressVersion"),
    "azure-native:authorization:RoleDefinition": ("roleDefinitionId", "scope"),
    "azure-native:keyvault:Secret": ("secretName", "vaultName"),
    "azure-native:storage:FileShare": ("shareName", "accountName", "enabledProtocols"),
    "azure-native:monitor:ActionGroup": ("actionGroupName",),
    "azure-native:monitor:MetricAlert": ("ruleName",),
    "azure-native:containerregistry:Registry": ("registryName",),
    "azure-native:keyvault:Vault": ("vaultName",),
    "azure-native:network:PrivateEndpoint": ("privateEndpointName", "subnet"),
    "azure-native:network:PrivateDnsZoneGroup": ("privateDnsZoneGroupName", "privateEndpointName"),
    "azure-native:privatedns:PrivateZone": ("privateZoneName",),
    "azure-native:privatedns:VirtualNetworkLink": ("virtualNetworkLinkName", "privateZoneName", "virtualNetwork"),
    "azure-native:dnsresolver:DnsResolverPolicy": ("dnsResolverPolicyName",),
    "azure-native:dnsresolver:DnsResolverDomainList": ("dnsResolverDomainListName",),
    "azure-native:dnsresolver:DnsSecurityRule": ("dnsSecurityRuleName", "dnsResolverPolicyName"),
    "azure-native:dnsresolver:DnsResolverPolicyVirtualNetworkLink": (
        "dnsResolverPolicyVirtualNetworkLinkName", "dnsResolverPolicyName", "virtualNetwork"),
    "azure-native:operationalinsights:Workspace": ("workspaceName",),
    "azure-native:monitor:DiagnosticSetting": ("name", "resourceUri"),
    # tencentcloud (tencentcloud-iac-pulumi 0.2): the Terraform provider's ForceNew arguments as far as known
    # here (the Python SDK does not mark them); names a resource's API cannot change also replace.
    "tencentcloud:Vpc/instance:Instance": ("cidrBlock",),
    "tencentcloud:Subnet/instance:Instance": ("vpcId", "cidrBlock", "availabilityZone"),
    "tencentcloud:Security/group:Group": ("projectId",),
    "tencentcloud:Security/groupRuleSet:GroupRuleSet": ("securityGroupId",),
    "tencentcloud:Cos/bucket:Bucket": ("bucket", "multiAz", "chdfsOfs"),
    "tencentcloud:Cos/bucketPolicy:BucketPolicy": ("bucket",),
    "tencentcloud:Kms/key:Key": ("keyUsage",),
    "tencentcloud:Cam/role:Role": ("name",),
    "tencentcloud:Cam/policy:Policy": ("name",),
    "tencentcloud:Cam/group:Group": ("name",),
    "tencentcloud:Cam/rolePolicyAttachment:RolePolicyAttachment": ("roleId", "policyId"),
    "tencentcloud:Cam/groupPolicyAttachment:GroupPolicyAttachment": ("groupId", "policyId"),
    # the controller: its user-data is replace-on-change (its state is on the shared file system)
    "tencentcloud:Instance/instance:Instance": ("availabilityZone", "allocatePublicIp", "dataDisks", "imageId",
                                                "launchTemplateId", "privateIp", "spotMaxPrice", "subnetId",
                                                "userData", "userDataRaw", "vpcId"),
    # a launch template has no update: any change makes a new one
    "tencentcloud:Cvm/launchTemplate:LaunchTemplate": (ANY,),
    "tencentcloud:Cfs/fileSystem:FileSystem": ("availabilityZone", "protocol", "storageType", "vpcId", "subnetId",
                                               "mountIp"),
    "tencentcloud:Cfs/accessGroup:AccessGroup": (),
    "tencentcloud:Cfs/accessRule:AccessRule": ("accessGroupId",),
    "tencentcloud:Ssm/secret:Secret": ("secretName", "kmsKeyId"),
    "tencentcloud:Ssm/secretVersion:SecretVersion": ("secretName", "versionId"),
    "tencentcloud:Tcmq/queue:Queue": ("queueName",),
    "tencentcloud:Cls/logset:Logset": (),
    "tencentcloud:Cls/topic:Topic": ("logsetId",),
    "tencentcloud:Monitor/alarmNotice:AlarmNotice": (),
    "tencentcloud:Monitor/alarmPolicy:AlarmPolicy": ("monitorType", "namespace"),
    "tencentcloud:Monitor/policyBindingObject:PolicyBindingObject": ("policyId", "dimensions"),
    "tencentcloud:Billing/budget:Budget": (),
}
_AZURE_ALWAYS = ("resourceGroupName", "location")


def replace_paths(rtype: str, paths: list[str]) -> list[str]:
    """The changed paths that force replacement of a resource of type `rtype`."""
    props = REPLACE_ON.get(rtype, ())
    if ANY in props:
        return list(paths)
    if rtype.startswith("azure-native:"):
        props = props + _AZURE_ALWAYS
    return [p for p in paths if any(p == q or p.startswith((q + ".", q + "[")) for q in props)]


# --- value comparison --------------------------------------------------------------------------

def _is_secret(value: Any) -> bool:
    return value == SECRET or (isinstance(value, dict) and _PULUMI_SECRET_SIG in value)


def _as_json_doc(value: Any) -> Any:
    """A string holding a JSON object or array, decoded; otherwise None."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            doc = json.loads(value)
        except ValueError:
            return None
        return doc if isinstance(doc, (dict, list)) else None
    return None


def _key_path(prefix: str, key: str) -> str:
    if _PLAIN_KEY.match(key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{json.dumps(key)}]"


def _mask(value: Any) -> Any:
    """A whole value shown in a diff, with secrets (by marker or by key name) masked."""
    if _is_secret(value):
        return SECRET
    if isinstance(value, dict):
        return {k: SECRET if _SECRET_KEY.search(k) else _mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value


def _by_key(items: list) -> dict[str, Any] | None:
    """A list of ``{"key": ..., ...}`` objects with distinct keys (tags of an autoscaling group: a set)
    as a map by key; None for any other list, whose elements are compared by position."""
    if not items or not all(isinstance(i, dict) and isinstance(i.get("key"), str) for i in items):
        return None
    keyed = {i["key"]: i for i in items}
    return keyed if len(keyed) == len(items) else None


def _walk(old: Any, new: Any, path: str, secret: bool) -> Iterator[tuple[str, Any, Any]]:
    """Yield (path, old, new) for every differing leaf; secret leaves come out masked."""
    if old == new:
        return
    if secret or _is_secret(old) or _is_secret(new):
        yield path, SECRET, SECRET
        return
    old_doc, new_doc = _as_json_doc(old), _as_json_doc(new)
    if old_doc is not None and new_doc is not None:
        old, new = old_doc, new_doc
        if old == new:  # same document, different formatting
            return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            yield from _walk(old.get(key), new.get(key), _key_path(path, key),
                             bool(_SECRET_KEY.search(key)))
    elif isinstance(old, list) and isinstance(new, list):
        old_keyed, new_keyed = _by_key(old), _by_key(new)
        if old_keyed is not None and new_keyed is not None:
            for key in sorted(set(old_keyed) | set(new_keyed)):
                yield from _walk(old_keyed.get(key), new_keyed.get(key), f"{path}[key={key}]", False)
            return
        for i in range(max(len(old), len(new))):
            yield from _walk(old[i] if i < len(old) else None, new[i] if i < len(new) else None,
                             f"{path}[{i}]", False)
    else:
        yield path, _mask(old), _mask(new)


def changed_paths(old_inputs: dict, new_inputs: dict) -> dict[str, dict[str, Any]]:
    """``{path: {"old": v, "new": v}}`` for every input that differs (secrets masked)."""
    return {p: {"old": o, "new": n} for p, o, n in _walk(old_inputs or {}, new_inputs or {}, "", False)}


# --- resources ---------------------------------------------------------------------------------

def _brief(res: dict) -> dict:
    return {"urn": res["urn"], "type": res["type"], "name": res["name"]}


def _depth(res: dict) -> int:
    """How deep a resource sits in the component tree (its URN's type chain)."""
    return res["urn"].split("::")[2].count("$")


def _renames(removed: list[dict], added: list[dict]) -> dict[str, str]:
    """Old URN -> new URN for removed/added pairs that are one resource under a new name."""
    moved: dict[str, str] = {}
    free = sorted(added, key=lambda r: r["urn"])
    for old in sorted(removed, key=lambda r: (_depth(r), r["urn"])):
        parent = moved.get(old.get("parent"), old.get("parent"))
        for new in free:
            if (new["type"] == old["type"] and new.get("parent") == parent
                    and (new.get("inputs") or {}) == (old.get("inputs") or {})):
                moved[old["urn"]] = new["urn"]
                free.remove(new)
                break
    return moved


def _policy_key(v: dict) -> tuple[str, str]:
    return v.get("policy", ""), v.get("urn") or ""


def _policy_delta(base: dict, head: dict) -> dict[str, list[dict]]:
    old = {_policy_key(v): v for v in (base.get("policy") or {}).get("violations", [])}
    new = {_policy_key(v): v for v in (head.get("policy") or {}).get("violations", [])}
    return {"appeared": [new[k] for k in sorted(set(new) - set(old))],
            "disappeared": [old[k] for k in sorted(set(old) - set(new))]}


COST_SIZES = ("idle", "full")


def _cost_delta(base: dict, head: dict) -> dict[str, float]:
    """Head minus base of the monthly cost idle and at full size; a size a document lacks counts 0 (a base
    preview written before the Slurm cost model has min/desired/max instead)."""
    old = (base.get("cost") or {}).get("monthly_usd") or {}
    new = (head.get("cost") or {}).get("monthly_usd") or {}
    return {k: round((new.get(k) or 0.0) - (old.get(k) or 0.0), 2) for k in COST_SIZES}


def _cost_currency(base: dict, head: dict) -> str:
    return (head.get("cost") or {}).get("currency") or (base.get("cost") or {}).get("currency") or "USD"


def compute(base: dict, head: dict) -> dict:
    """The review diff of two preview documents: head (this branch) against base (main)."""
    old = {r["urn"]: r for r in base.get("resources", [])}
    new = {r["urn"]: r for r in head.get("resources", [])}
    removed = [old[u] for u in sorted(set(old) - set(new))]
    added = [new[u] for u in sorted(set(new) - set(old))]
    moved = _renames(removed, added)
    gone_to = set(moved.values())

    changed = []
    for urn in sorted(set(old) & set(new)):
        values = changed_paths(old[urn].get("inputs"), new[urn].get("inputs"))
        if not values:
            continue
        rtype = new[urn]["type"]
        repl = replace_paths(rtype, list(values))
        changed.append({**_brief(new[urn]), "paths": list(values), "values": values,
                        "replace": bool(repl), "replace_paths": repl})

    result = {
        "added": [_brief(r) for r in added if r["urn"] not in gone_to],
        "removed": [_brief(r) for r in removed if r["urn"] not in moved],
        "renamed": [{"from": o, "to": n, "type": old[o]["type"]} for o, n in sorted(moved.items())],
        "changed": changed,
        "policy": _policy_delta(base, head),
        "cost": {"delta_monthly_usd": _cost_delta(base, head), "currency": _cost_currency(base, head)},
    }
    result["summary"] = {
        "added": len(result["added"]), "removed": len(result["removed"]), "renamed": len(result["renamed"]),
        "updated": sum(1 for c in changed if not c["replace"]), "replaced": sum(1 for c in changed if c["replace"]),
        "policy_appeared": len(result["policy"]["appeared"]),
        "policy_disappeared": len(result["policy"]["disappeared"]),
    }
    return result


def is_empty(diff: dict) -> bool:
    """True when the diff shows no change at all."""
    return (not any(diff[k] for k in ("added", "removed", "renamed", "changed"))
            and not any(diff["policy"].values())
            and not any(diff["cost"]["delta_monthly_usd"].values()))
