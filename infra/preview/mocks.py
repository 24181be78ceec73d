"""Offline stand-ins for the cloud providers: realistic, deterministic ids, ARNs and invoke results.

``PreviewMocks.new_resource`` returns what a provider would report after creating a resource: its
physical id plus computed attributes (``arn``, ``url``, ``name`` from auto-naming, ...), so values
that depend on them (a bucket policy built from the bucket ARN) resolve as they would in ``pulumi up``.
Random-looking parts are hashes of (stack, type, name): the same program gives the same preview.
``call`` answers the provider functions (invokes) the programs use; an unknown function is an error,
not a silent empty result.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import pulumi

from infra import catalog

ACCOUNT_ID = "123456789012"
TENCENT_APP_ID = "1250000000"
TENCENT_UIN = "100000000001"
SUBSCRIPTION_ID = "00000000-0000-4000-8000-000000000001"
TENANT_ID = "00000000-0000-4000-8000-000000000002"
PREVIEW_PRINCIPAL = "gpufleet-preview"


class MissingMock(Exception):
    """A provider function the offline preview has no answer for."""


def digest(*parts: str, n: int = 17) -> str:
    """``n`` hex characters determined by ``parts``."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:n]


def fake_uuid(*parts: str) -> str:
    h = digest(*parts, n=32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-8{h[17:20]}-{h[20:32]}"


class PreviewMocks(pulumi.runtime.Mocks):
    """Mocks for aws, azure-native and tencentcloud resources in one stack, account and region."""

    def __init__(self, stack: str, region: str, account_id: str = ACCOUNT_ID,
                 subscription_id: str = SUBSCRIPTION_ID):
        self.stack, self.region = stack, region
        self.account, self.subscription = account_id, subscription_id

    # --- resources ------------------------------------------------------------------------------
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        inputs = dict(args.inputs)
        if args.resource_id:  # a read (Resource.get) or an import: the id is given
            return args.resource_id, {**inputs, "id": args.resource_id, **self._read_extras(args)}
        pkg = args.typ.split(":", 1)[0]
        if pkg == "aws":
            handler = _AWS.get(args.typ, _aws_generic)
        elif pkg == "azure-native":
            handler = _azure_resource
        elif pkg == "tencentcloud":
            handler = _TENCENT.get(args.typ, _tencent_generic)
        elif args.typ.startswith("pulumi:providers:"):
            return fake_uuid(self.stack, args.typ, args.name), inputs
        else:
            handler = _generic
        rid, computed = handler(self, args.typ, args.name, inputs)
        state = {**inputs, **computed}
        if pkg == "aws" and "tags" in inputs:
            state.setdefault("tagsAll", inputs["tags"])
        return rid, state

    def _read_extras(self, args) -> dict:
        if args.typ == "aws:ec2/subnet:Subnet":
            return {"availabilityZone": f"{self.region}a", "vpcId": "vpc-" + digest(args.resource_id)}
        return {}

    def auto_name(self, typ: str, name: str, given: Any = None, sep: str = "-", lower: bool = False) -> str:
        """The provider's auto-name: the logical name plus a 7-character suffix, unless one is given."""
        if given:
            return given
        out = f"{name}{sep}{digest(self.stack, typ, name, n=7)}"
        return out.lower() if lower else out

    def arn(self, service: str, resource: str, region: bool = True, account: bool = True) -> str:
        return (f"arn:aws:{service}:{self.region if region else ''}:"
                f"{self.account if account else ''}:{resource}")

    def hexid(self, prefix: str, typ: str, name: str) -> str:
        return f"{prefix}-{digest(self.stack, typ, name)}"

    def tencent_id(self, prefix: str, typ: str, name: str) -> str:
        """Tencent's short ids: a prefix and 8 lower-case letters and digits (vpc-, sg-, asg-, ...)."""
        return f"{prefix}-{_base36(digest(self.stack, typ, name, n=16), 8)}"

    # --- invokes --------------------------------------------------------------------------------
    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        fn = _CALLS.get(args.token)
        if fn is None:
            raise MissingMock(f"the offline preview has no result for function {args.token} "
                              "(add one to infra/preview/mocks.py)")
        return fn(self, dict(args.args))


# --- AWS resources ----------------------------------------------------------------------------------
Handler = Callable[[PreviewMocks, str, str, dict], "tuple[str, dict]"]


def _bucket(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    prefix = inputs.get("bucketPrefix")
    bucket = inputs.get("bucket") or (prefix + digest(m.stack, typ, name, n=26) if prefix
                                      else m.auto_name(typ, name, lower=True))
    return bucket, {
        "bucket": bucket, "arn": f"arn:aws:s3:::{bucket}", "region": m.region,
        "bucketDomainName": f"{bucket}.s3.amazonaws.com",
        "bucketRegionalDomainName": f"{bucket}.s3.{m.region}.amazonaws.com",
        "hostedZoneId": "Z1BKCTXD74EZPE",
    }


def _bucket_child(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    return str(inputs.get("bucket", name)), {}


def _queue(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    qname = inputs.get("name") or m.auto_name(typ, name) + (".fifo" if inputs.get("fifoQueue") else "")
    url = f"https://sqs.{m.region}.amazonaws.com/{m.account}/{qname}"
    return url, {"name": qname, "url": url, "arn": m.arn("sqs", qname)}


def _queue_child(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    return str(inputs.get("queueUrl", name)), {}


def _kms_key(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    key_id = fake_uuid(m.stack, typ, name)
    return key_id, {"keyId": key_id, "arn": m.arn("kms", f"key/{key_id}")}


def _kms_alias(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    alias = inputs.get("name") or "alias/" + m.auto_name(typ, name)
    return alias, {"name": alias, "arn": m.arn("kms", alias), "targetKeyArn": m.arn("kms", f"key/{inputs.get('targetKeyId', '')}")}


def _iam_named(kind: str, id_is_arn: bool = False) -> Handler:
    def handler(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
        prefix = inputs.get("namePrefix")
        iname = inputs.get("name") or (prefix + digest(m.stack, typ, name, n=26) if prefix else m.auto_name(typ, name))
        path = inputs.get("path") or "/"
        arn = m.arn("iam", f"{kind}{path}{iname}", region=False)
        out = {"name": iname, "arn": arn, "path": path}
        if kind == "role":
            out["uniqueId"] = "AROA" + digest(m.stack, typ, name, n=17).upper()
        if kind == "instance-profile":
            out["uniqueId"] = "AIPA" + digest(m.stack, typ, name, n=17).upper()
        if kind == "policy":
            out["policyId"] = "ANPA" + digest(m.stack, typ, name, n=17).upper()
        return (arn if id_is_arn else iname), out
    return handler


def _role_policy(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    pname = inputs.get("name") or m.auto_name(typ, name)
    return f"{inputs.get('role', '')}:{pname}", {"name": pname}


def _with_arn(prefix: str, arn_kind: str, extra: Callable[[PreviewMocks, str, str, dict, str], dict] | None = None) -> Handler:
    """An EC2-style resource: ``<prefix>-<17 hex>`` id and ``arn:aws:ec2:...:<arn_kind>/<id>``."""
    def handler(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
        rid = m.hexid(prefix, typ, name)
        out = {"arn": m.arn("ec2", f"{arn_kind}/{rid}"), "ownerId": m.account}
        if extra:
            out.update(extra(m, typ, name, inputs, rid))
        return rid, out
    return handler


def _resolver(prefix: str, arn_kind: str | None) -> Handler:
    """A Route 53 Resolver resource: ``rslvr-<prefix>-<17 hex>`` id and, if it has one,
    ``arn:aws:route53resolver:...:<arn_kind>/<id>``."""
    def handler(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
        rid = m.hexid(f"rslvr-{prefix}", typ, name)
        return rid, ({"arn": m.arn("route53resolver", f"{arn_kind}/{rid}"), "ownerId": m.account} if arn_kind
                     else {})
    return handler


def _firewall_rule(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    """A DNS firewall rule: the provider's id is `<rule group id>:<domain list id>`."""
    return f"{inputs.get('firewallRuleGroupId', '')}:{inputs.get('firewallDomainListId', '')}", {}


def _vpc_extra(m, typ, name, inputs, rid):
    return {"defaultSecurityGroupId": m.hexid("sg", typ, name + "/default"),
            "mainRouteTableId": m.hexid("rtb", typ, name + "/main"),
            "defaultRouteTableId": m.hexid("rtb", typ, name + "/main"),
            "defaultNetworkAclId": m.hexid("acl", typ, name + "/default"),
            "dhcpOptionsId": m.hexid("dopt", typ, name)}


def _subnet_extra(m, typ, name, inputs, rid):
    az = inputs.get("availabilityZone") or f"{m.region}a"
    return {"availabilityZone": az, "availabilityZoneId": _zone_id(m.region, az[-1])}


def _sg_extra(m, typ, name, inputs, rid):
    return {"name": inputs.get("name") or m.auto_name(typ, name)}


def _lt_extra(m, typ, name, inputs, rid):
    return {"name": inputs.get("name") or m.auto_name(typ, name), "latestVersion": 1, "defaultVersion": 1}


def _endpoint_extra(m, typ, name, inputs, rid):
    service = str(inputs.get("serviceName", ""))
    out = {"state": "available"}
    if inputs.get("vpcEndpointType", "Gateway") == "Gateway":
        out["prefixListId"] = "pl-" + digest(service, n=8)
    else:
        short = service.rsplit(".", 1)[-1]
        out["dnsEntries"] = [{"dnsName": f"{rid}.{short}.{m.region}.vpce.amazonaws.com",
                              "hostedZoneId": "Z" + digest(service, n=13).upper()}]
    return out


def _eip_extra(m, typ, name, inputs, rid):
    h = int(digest(m.stack, typ, name, n=4), 16)
    return {"allocationId": rid, "publicIp": f"203.0.113.{h % 254 + 1}", "domain": "vpc"}


def _placement_group(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    pname = inputs.get("name") or m.auto_name(typ, name)
    return pname, {"name": pname, "placementGroupId": m.hexid("pg", typ, name),
                   "arn": m.arn("ec2", f"placement-group/{pname}")}


def _private_ip(m: PreviewMocks, typ: str, name: str) -> str:
    """A made-up address in the stack VPC's first subnet (10.42.0.0/19), the same for the same resource."""
    h = int(digest(m.stack, typ, name, n=4), 16)
    return f"10.42.{h % 31}.{h // 31 % 250 + 4}"


def _eni_extra(m, typ, name, inputs, rid):
    ip = _private_ip(m, typ, name)
    return {"privateIp": ip, "privateIps": [ip], "privateDnsName": f"ip-{ip.replace('.', '-')}.ec2.internal",
            "macAddress": "0e:" + ":".join(digest(name, n=10)[i:i + 2] for i in range(0, 10, 2))}


def _instance_extra(m, typ, name, inputs, rid):
    ip = _private_ip(m, typ, name)
    return {"privateIp": ip, "privateDns": f"ip-{ip.replace('.', '-')}.ec2.internal", "instanceState": "running"}


def _efs(kind: str, prefix: str) -> Handler:
    """An EFS file system, access point or mount target: ``<prefix>-<17 hex>`` and its ARN."""
    def handler(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
        rid = m.hexid(prefix, typ, name)
        out = {"arn": m.arn("elasticfilesystem", f"{kind}/{rid}")}
        if kind == "file-system":
            out["dnsName"] = f"{rid}.efs.{m.region}.amazonaws.com"
        return rid, out
    return handler


def _secretsmanager_secret(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    sname = inputs.get("name") or (inputs.get("namePrefix") or f"{name}-") + digest(m.stack, name, n=8)
    arn = m.arn("secretsmanager", f"secret:{sname}-{digest(sname, n=6)}")
    return arn, {"name": sname, "arn": arn}


def _named(arn_of: Callable[[PreviewMocks, str], str] | None = None, key: str = "name") -> Handler:
    """A resource whose id is its (auto-)name, with an optional ARN."""
    def handler(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
        rname = inputs.get(key) or m.auto_name(typ, name)
        out = {key: rname}
        if arn_of:
            out["arn"] = arn_of(m, rname)
        return rname, out
    return handler


def _dashboard(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    dname = inputs.get("dashboardName") or m.auto_name(typ, name)
    return dname, {"dashboardName": dname, "dashboardArn": m.arn("cloudwatch", f"dashboard/{dname}", region=False)}


def _budget(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    bname = inputs.get("name") or m.auto_name(typ, name)
    return f"{m.account}:{bname}", {"name": bname, "accountId": m.account,
                                     "arn": m.arn("budgets", f"budget/{bname}", region=False)}


def _topic(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    tname = inputs.get("name") or m.auto_name(typ, name)
    arn = m.arn("sns", tname)
    return arn, {"name": tname, "arn": arn}


def _ecr_repository(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    rname = inputs.get("name") or m.auto_name(typ, name, lower=True)
    return rname, {"name": rname, "arn": m.arn("ecr", f"repository/{rname}"), "registryId": m.account,
                   "repositoryUrl": f"{m.account}.dkr.ecr.{m.region}.amazonaws.com/{rname}"}


def _ecr_by(key: str) -> Handler:
    """An ECR registry setting whose id is one of its inputs (a repository name, a prefix)."""
    def handler(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
        return str(inputs.get(key) or name), {"registryId": m.account}
    return handler


def _aws_generic(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    """Any other AWS resource: its (auto-)name as id and an ARN in its service."""
    service = typ.split(":")[1].split("/")[0]
    rid = inputs.get("name") or m.auto_name(typ, name)
    return rid, {"arn": m.arn(service, f"{typ.rsplit(':', 1)[1].lower()}/{rid.lstrip('/')}")}


def _generic(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    return m.auto_name(typ, name), {}


def _zone_id(region: str, letter: str) -> str:
    short = region.split("-")
    return f"{short[0]}{short[1][0]}{short[2]}-az{ord(letter) - ord('a') + 1}" if len(short) == 3 else f"{region}-az1"


_AWS: dict[str, Handler] = {
    "aws:s3/bucket:Bucket": _bucket,
    "aws:s3/bucketV2:BucketV2": _bucket,
    "aws:sqs/queue:Queue": _queue,
    "aws:sqs/queuePolicy:QueuePolicy": _queue_child,
    "aws:sqs/redrivePolicy:RedrivePolicy": _queue_child,
    "aws:sqs/redriveAllowPolicy:RedriveAllowPolicy": _queue_child,
    "aws:kms/key:Key": _kms_key,
    "aws:kms/alias:Alias": _kms_alias,
    "aws:iam/role:Role": _iam_named("role"),
    "aws:iam/instanceProfile:InstanceProfile": _iam_named("instance-profile"),
    "aws:iam/policy:Policy": _iam_named("policy", id_is_arn=True),
    "aws:iam/rolePolicy:RolePolicy": _role_policy,
    "aws:ec2/vpc:Vpc": _with_arn("vpc", "vpc", _vpc_extra),
    "aws:ec2/subnet:Subnet": _with_arn("subnet", "subnet", _subnet_extra),
    "aws:ec2/securityGroup:SecurityGroup": _with_arn("sg", "security-group", _sg_extra),
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": _with_arn("sg", "security-group"),
    "aws:ec2/securityGroupRule:SecurityGroupRule": _with_arn("sgr", "security-group-rule"),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": _with_arn("sgr", "security-group-rule"),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": _with_arn("sgr", "security-group-rule"),
    "aws:ec2/routeTable:RouteTable": _with_arn("rtb", "route-table"),
    "aws:ec2/route:Route": _with_arn("r", "route"),
    "aws:ec2/routeTableAssociation:RouteTableAssociation": _with_arn("rtbassoc", "route-table-association"),
    "aws:ec2/internetGateway:InternetGateway": _with_arn("igw", "internet-gateway"),
    "aws:ec2/natGateway:NatGateway": _with_arn("nat", "natgateway"),
    "aws:ec2/eip:Eip": _with_arn("eipalloc", "elastic-ip", _eip_extra),
    "aws:ec2/vpcEndpoint:VpcEndpoint": _with_arn("vpce", "vpc-endpoint", _endpoint_extra),
    "aws:ec2/launchTemplate:LaunchTemplate": _with_arn("lt", "launch-template", _lt_extra),
    "aws:ec2/flowLog:FlowLog": _with_arn("fl", "vpc-flow-log"),
    "aws:route53/resolverFirewallDomainList:ResolverFirewallDomainList": _resolver("fdl", "firewall-domain-list"),
    "aws:route53/resolverFirewallRuleGroup:ResolverFirewallRuleGroup": _resolver("frg", "firewall-rule-group"),
    "aws:route53/resolverFirewallRule:ResolverFirewallRule": _firewall_rule,
    "aws:route53/resolverFirewallRuleGroupAssociation:ResolverFirewallRuleGroupAssociation": _resolver(
        "frgassoc", "firewall-rule-group-association"),
    "aws:route53/resolverQueryLogConfig:ResolverQueryLogConfig": _resolver("rqlc", "resolver-query-log-config"),
    "aws:route53/resolverQueryLogConfigAssociation:ResolverQueryLogConfigAssociation": _resolver("rqlca", None),
    "aws:ec2/placementGroup:PlacementGroup": _placement_group,
    "aws:ec2/networkInterface:NetworkInterface": _with_arn("eni", "network-interface", _eni_extra),
    "aws:ec2/instance:Instance": _with_arn("i", "instance", _instance_extra),
    "aws:efs/fileSystem:FileSystem": _efs("file-system", "fs"),
    "aws:efs/accessPoint:AccessPoint": _efs("access-point", "fsap"),
    "aws:efs/mountTarget:MountTarget": _efs("mount-target", "fsmt"),
    "aws:secretsmanager/secret:Secret": _secretsmanager_secret,
    "aws:cloudwatch/logGroup:LogGroup": _named(lambda m, n: m.arn("logs", f"log-group:{n}")),
    "aws:cloudwatch/metricAlarm:MetricAlarm": _named(lambda m, n: m.arn("cloudwatch", f"alarm:{n}")),
    "aws:cloudwatch/dashboard:Dashboard": _dashboard,
    "aws:budgets/budget:Budget": _budget,
    "aws:sns/topic:Topic": _topic,
    "aws:lambda/function:Function": _named(lambda m, n: m.arn("lambda", f"function:{n}")),
    "aws:ecr/repository:Repository": _ecr_repository,
    "aws:ecr/lifecyclePolicy:LifecyclePolicy": _ecr_by("repository"),
    "aws:ecr/repositoryPolicy:RepositoryPolicy": _ecr_by("repository"),
    "aws:ecr/pullThroughCacheRule:PullThroughCacheRule": _ecr_by("ecrRepositoryPrefix"),
    "aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate": _ecr_by("prefix"),
    "aws:sns/topicPolicy:TopicPolicy": lambda m, typ, name, inputs: (str(inputs.get("arn", name)), {}),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": lambda m, typ, name, inputs: (
        f"{inputs.get('role', '')}/{inputs.get('policyArn', '')}", {}),
}
for _tok in ("bucketVersioning:BucketVersioning", "bucketVersioningV2:BucketVersioningV2",
             "bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
             "bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
             "bucketLifecycleConfiguration:BucketLifecycleConfiguration",
             "bucketLifecycleConfigurationV2:BucketLifecycleConfigurationV2",
             "bucketLogging:BucketLogging", "bucketLoggingV2:BucketLoggingV2",
             "bucketPublicAccessBlock:BucketPublicAccessBlock", "bucketOwnershipControls:BucketOwnershipControls",
             "bucketPolicy:BucketPolicy"):
    _AWS[f"aws:s3/{_tok}"] = _bucket_child


# --- Azure resources --------------------------------------------------------------------------------
_AZURE_PROVIDER = {
    "resources": "Microsoft.Resources", "storage": "Microsoft.Storage", "compute": "Microsoft.Compute",
    "network": "Microsoft.Network", "managedidentity": "Microsoft.ManagedIdentity",
    "authorization": "Microsoft.Authorization", "insights": "Microsoft.Insights",
    "monitor": "Microsoft.Insights", "operationalinsights": "Microsoft.OperationalInsights",
    "keyvault": "Microsoft.KeyVault", "consumption": "Microsoft.Consumption",
    "costmanagement": "Microsoft.CostManagement", "dashboard": "Microsoft.Portal", "portal": "Microsoft.Portal",
    "containerregistry": "Microsoft.ContainerRegistry", "privatedns": "Microsoft.Network",
    "dnsresolver": "Microsoft.Network",
}
# (name input, path under the resource group) for types whose id nests under a parent resource.
_DNS_POLICY = "dnsResolverPolicies/{dnsResolverPolicyName}"
_AZURE_NESTED = {
    "storage:BlobContainer": ("containerName", "storageAccounts/{accountName}/blobServices/default/containers/{}"),
    "storage:Queue": ("queueName", "storageAccounts/{accountName}/queueServices/default/queues/{}"),
    "storage:ManagementPolicy": ("managementPolicyName", "storageAccounts/{accountName}/managementPolicies/{}"),
    "storage:BlobServiceProperties": ("blobServicesName", "storageAccounts/{accountName}/blobServices/{}"),
    "network:Subnet": ("subnetName", "virtualNetworks/{virtualNetworkName}/subnets/{}"),
    "network:SecurityRule": ("securityRuleName", "networkSecurityGroups/{networkSecurityGroupName}/securityRules/{}"),
    "network:PrivateDnsZoneGroup": ("privateDnsZoneGroupName",
                                    "privateEndpoints/{privateEndpointName}/privateDnsZoneGroups/{}"),
    "privatedns:PrivateZone": ("privateZoneName", "privateDnsZones/{}"),
    "privatedns:VirtualNetworkLink": ("virtualNetworkLinkName", "privateDnsZones/{privateZoneName}/virtualNetworkLinks/{}"),
    "storage:FileShare": ("shareName", "storageAccounts/{accountName}/fileServices/default/shares/{}"),
    "keyvault:Secret": ("secretName", "vaults/{vaultName}/secrets/{}"),
    "dnsresolver:DnsSecurityRule": ("dnsSecurityRuleName", _DNS_POLICY + "/dnsSecurityRules/{}"),
    "dnsresolver:DnsResolverPolicyVirtualNetworkLink": ("dnsResolverPolicyVirtualNetworkLinkName",
                                                        _DNS_POLICY + "/virtualNetworkLinks/{}"),
}
_AZURE_PARENT_NAMES = ("accountName", "virtualNetworkName", "networkSecurityGroupName", "privateEndpointName",
                       "privateZoneName", "vaultName", "dnsResolverPolicyName")
# Types whose name input is not the first input ending in "Name", and the path segments ARM spells irregularly.
_AZURE_NAME_KEY = {"ActionGroup": "actionGroupName", "DiagnosticSetting": "name"}
_AZURE_SEGMENT = {"PublicIPAddress": "publicIPAddresses"}


def _azure_resource(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    _, module, kind = typ.split(":")
    provider = _AZURE_PROVIDER.get(module, f"Microsoft.{module.capitalize()}")
    sub = f"/subscriptions/{m.subscription}"
    nested = _AZURE_NESTED.get(f"{module}:{kind}")
    if kind == "ResourceGroup":
        rname = inputs.get("resourceGroupName") or m.auto_name(typ, name, sep="")
        return f"{sub}/resourceGroups/{rname}", {"name": rname, "location": inputs.get("location", m.region)}
    if kind == "RoleAssignment":  # named by a GUID
        rname = inputs.get("roleAssignmentName") or fake_uuid(m.stack, typ, name)
        tail = f"roleAssignments/{rname}"
    elif kind == "RoleDefinition":  # named by a GUID; ARM reports a custom role's id under its subscription
        rname = inputs.get("roleDefinitionId") or fake_uuid(m.stack, typ, name)
        rid = f"{sub}/providers/Microsoft.Authorization/roleDefinitions/{rname}"
        return rid, {"name": rname, "id": rid, "type": "Microsoft.Authorization/roleDefinitions"}
    elif nested:
        key, path = nested
        rname = inputs.get(key) or m.auto_name(typ, name, sep="", lower=True)
        tail = path.format(rname, **{k: inputs.get(k, "") for k in _AZURE_PARENT_NAMES})
    else:
        given = inputs.get(_AZURE_NAME_KEY[kind]) if kind in _AZURE_NAME_KEY else next(
            (v for k, v in inputs.items() if k.endswith("Name") and k != "resourceGroupName" and isinstance(v, str)),
            None)
        rname = given or m.auto_name(typ, name, sep="", lower=kind == "StorageAccount")
        if kind == "StorageAccount":
            rname = rname.replace("-", "")[:24]
        tail = f"{kind[0].lower()}{kind[1:]}{'' if kind.endswith('s') else 's'}/{rname}"
        tail = tail.replace("ys/", "ies/") if kind.endswith("y") else tail
        tail = f"{_AZURE_SEGMENT[kind]}/{rname}" if kind in _AZURE_SEGMENT else tail
    rg = inputs.get("resourceGroupName")
    scope = f"{sub}/resourceGroups/{rg}" if rg else inputs.get("scope") or inputs.get("resourceUri") or sub
    rid = f"{scope}/providers/{provider}/{tail}"
    out: dict[str, Any] = {"name": rname, "id": rid}
    if kind == "UserAssignedIdentity":
        out.update(clientId=fake_uuid(m.stack, typ, name, "client"),
                   principalId=fake_uuid(m.stack, typ, name, "principal"), tenantId=TENANT_ID)
    elif kind == "StorageAccount":
        out["primaryEndpoints"] = {svc: f"https://{rname}.{svc}.core.windows.net/"
                                   for svc in ("blob", "queue", "table", "file", "dfs")}
    elif kind == "VirtualMachineScaleSet":
        out["uniqueId"] = fake_uuid(m.stack, typ, name)
    elif kind == "Registry":
        out["loginServer"] = f"{rname.lower()}.azurecr.io"
    elif kind == "PrivateEndpoint":
        out["networkInterfaces"] = [{"id": f"{scope}/providers/Microsoft.Network/networkInterfaces/{rname}.nic"}]
    elif kind == "VirtualMachine":
        out["vmId"] = fake_uuid(m.stack, typ, name)
    elif kind == "Secret":  # its URIs; ARM never returns the value
        vault_uri = f"https://{inputs.get('vaultName', '')}.vault.azure.net"
        out["properties"] = {k: v for k, v in (inputs.get("properties") or {}).items() if k != "value"}
        out["properties"].update(vaultUri=vault_uri, secretUri=f"{vault_uri}/secrets/{rname}",
                                 secretUriWithVersion=f"{vault_uri}/secrets/{rname}/{digest(m.stack, name, n=32)}")
    identity = inputs.get("identity")
    if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
        # Given as a list of identity ids; Azure reports a map of id to the identity's client/principal.
        out["identity"] = {**identity, "userAssignedIdentities": {
            uid: {"clientId": fake_uuid(uid, "client"), "principalId": fake_uuid(uid, "principal")}
            for uid in identity["userAssignedIdentities"]}}
    if "location" not in inputs and rg:
        out["location"] = m.region
    return rid, out


# --- Tencent Cloud resources ------------------------------------------------------------------------
def _base36(hex_digest: str, n: int) -> str:
    value, out = int(hex_digest, 16), ""
    for _ in range(n):
        value, r = divmod(value, 36)
        out += "0123456789abcdefghijklmnopqrstuvwxyz"[r]
    return out


def _short(prefix: str, name_key: str | None = None) -> Handler:
    """A resource with a short id (``vpc-1a2b3c4d``), echoing its name input when it has one."""
    def handler(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
        rid = m.tencent_id(prefix, typ, name)
        return rid, ({name_key: inputs.get(name_key) or m.auto_name(typ, name)} if name_key else {})
    return handler


def _numeric(m: PreviewMocks, typ: str, name: str, digits: int = 9) -> str:
    return str(int(digest(m.stack, typ, name, n=12), 16) % 10 ** digits + 10 ** (digits - 1))


def _cos_bucket(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    bucket = inputs.get("bucket") or f"{m.auto_name(typ, name, lower=True)}-{TENCENT_APP_ID}"
    return bucket, {"bucket": bucket, "cosBucketUrl": f"{bucket}.cos.{m.region}.myqcloud.com"}


def _cam_role(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    # CAM role ids are 19-digit numbers (4611686018...); the name is the handle most APIs take.
    rid = "46116860" + _numeric(m, typ, name, 11)
    return rid, {"name": inputs.get("name") or m.auto_name(typ, name), "createTime": "2025-07-01 00:00:00"}


def _cam_numbered(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    return _numeric(m, typ, name), {"name": inputs.get("name") or m.auto_name(typ, name)}


def _uuid_named(key: str) -> Handler:
    def handler(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
        return fake_uuid(m.stack, typ, name), {key: inputs.get(key) or m.auto_name(typ, name)}
    return handler


def _kms_key_tencent(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    key_id = fake_uuid(m.stack, typ, name)
    return key_id, {"keyState": "Enabled" if inputs.get("isEnabled") else "Disabled"}


def _tencent_private_ip(m: PreviewMocks, typ: str, name: str) -> str:
    """A made-up address in the Tencent stack's VPC (10.72.0.0/16), the same for the same resource."""
    h = int(digest(m.stack, typ, name, n=4), 16)
    return f"10.72.{h % 48}.{h // 48 % 250 + 4}"


def _cvm_instance(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    """A CVM: ``ins-`` id, the private IP it was given (or one of the subnet's), running."""
    rid = m.tencent_id("ins", typ, name)
    return rid, {"privateIp": inputs.get("privateIp") or _tencent_private_ip(m, typ, name),
                 "instanceStatus": "RUNNING", "publicIp": "", "createTime": "2025-07-01T00:00:00Z"}


def _cfs_file_system(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    """A CFS file system: ``cfs-`` id (also its fs_id) and its mount target's address."""
    rid = m.tencent_id("cfs", typ, name)
    return rid, {"fsId": rid, "mountIp": inputs.get("mountIp") or _tencent_private_ip(m, typ, name),
                 "createTime": "2025-07-01 00:00:00"}


def _ssm_secret(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    """An SSM secret: its name is its id; the KMS key is the one given (or SSM's default). Never a value."""
    sname = inputs.get("secretName") or m.auto_name(typ, name)
    return sname, {"secretName": sname, "kmsKeyId": inputs.get("kmsKeyId") or "", "status": "Enabled",
                   "secretType": 0}


def _tencent_generic(m: PreviewMocks, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
    """Any other Tencent resource: a short id from its module name (``scf-1a2b3c4d``)."""
    module = typ.split(":")[1].split("/")[0].lower()
    return m.tencent_id(module, typ, name), {}


_TENCENT: dict[str, Handler] = {
    "tencentcloud:Vpc/instance:Instance": _short("vpc"),
    "tencentcloud:Subnet/instance:Instance": _short("subnet"),
    "tencentcloud:Security/group:Group": _short("sg"),
    "tencentcloud:Security/groupRuleSet:GroupRuleSet": lambda m, typ, name, inputs: (
        str(inputs.get("securityGroupId", name)), {}),
    "tencentcloud:Cos/bucket:Bucket": _cos_bucket,
    "tencentcloud:Cos/bucketPolicy:BucketPolicy": lambda m, typ, name, inputs: (str(inputs.get("bucket", name)), {}),
    "tencentcloud:Kms/key:Key": _kms_key_tencent,
    "tencentcloud:Cam/role:Role": _cam_role,
    "tencentcloud:Cam/policy:Policy": _cam_numbered,
    "tencentcloud:Cam/group:Group": _cam_numbered,
    "tencentcloud:Cam/rolePolicyAttachment:RolePolicyAttachment": lambda m, typ, name, inputs: (
        f"{inputs.get('roleId', '')}#{inputs.get('policyId', '')}", {}),
    "tencentcloud:Tcmq/queue:Queue": _short("queue"),
    "tencentcloud:Monitor/alarmNotice:AlarmNotice": lambda m, typ, name, inputs: (
        f"notice-{fake_uuid(m.stack, typ, name)}", {}),
    "tencentcloud:Monitor/alarmPolicy:AlarmPolicy": _short("policy"),
    "tencentcloud:Monitor/policyBindingObject:PolicyBindingObject": lambda m, typ, name, inputs: (
        str(inputs.get("policyId", name)), {}),
    "tencentcloud:Cls/logset:Logset": _uuid_named("logsetName"),
    "tencentcloud:Cls/topic:Topic": _uuid_named("topicName"),
    "tencentcloud:Billing/budget:Budget": lambda m, typ, name, inputs: (
        _numeric(m, typ, name, 12), {"budgetName": inputs.get("budgetName") or m.auto_name(typ, name)}),
    "tencentcloud:Instance/instance:Instance": _cvm_instance,
    "tencentcloud:Cvm/launchTemplate:LaunchTemplate": _short("lt"),
    "tencentcloud:Cfs/fileSystem:FileSystem": _cfs_file_system,
    "tencentcloud:Cfs/accessGroup:AccessGroup": _short("pgroup"),
    "tencentcloud:Cfs/accessRule:AccessRule": _short("rule"),
    "tencentcloud:Ssm/secret:Secret": _ssm_secret,
    "tencentcloud:Ssm/secretVersion:SecretVersion": lambda m, typ, name, inputs: (
        f"{inputs.get('secretName', '')}#{inputs.get('versionId', '')}", {}),
}


def _tencent_types(m: PreviewMocks, args: dict) -> dict:
    """CVM types of the catalog in the filtered families, sold in three zones of the region."""
    families = {v for f in args.get("filters", []) if f.get("name") == "instance-family" for v in f.get("values", [])}
    rows = [row for row in catalog.CATALOG.values() if row.cloud == "tencent"
            and (not families or row.name.split(".")[0] in families)]
    zones = [f"{m.region}-{n}" for n in (2, 3, 4)]
    return {"id": digest(json.dumps(args, sort_keys=True), n=10), "instanceTypes": [
        {"availabilityZone": zone, "instanceType": row.name, "family": row.name.split(".")[0],
         "gpuCoreCount": row.gpus, "cpuCoreCount": row.vcpus, "memorySize": row.memory_gib,
         "instanceChargeType": "POSTPAID_BY_HOUR", "status": "SELL", "cbsConfigs": []}
        for row in rows for zone in zones]}


def _tencent_images(m: PreviewMocks, args: dict) -> dict:
    pattern = (args.get("imageNameRegex") or "gpufleet-gpu-").lstrip("^")
    image_id = "img-" + _base36(digest(m.region, json.dumps(args, sort_keys=True), n=16), 8)
    image = {"imageId": image_id, "imageName": f"{pattern}1.0.0-20250701", "createdTime": "2025-07-01 00:00:00",
             "imageType": "PRIVATE_IMAGE", "imageState": "NORMAL", "imageSource": "CREATE_IMAGE",
             "imageCreator": TENCENT_UIN, "imageDescription": "gpufleet GPU node", "imageSize": 50,
             "architecture": "x86_64", "osName": "Ubuntu Server 22.04 LTS 64bit", "platform": "Ubuntu",
             "snapshots": [], "supportCloudInit": True, "syncPercent": 100}
    return {"id": digest(json.dumps(args, sort_keys=True), n=10), "images": [image]}


# --- invokes ---------------------------------------------------------------------------------------
def _get_ami(m: PreviewMocks, args: dict) -> dict:
    filters = {f.get("name"): f.get("values", []) for f in args.get("filters", [])}
    pattern = (filters.get("name") or ["gpufleet-image"])[0]
    name = pattern.replace("*", "2025-07-01T00-00-00Z")
    image_id = "ami-" + digest(m.region, json.dumps(args, sort_keys=True))
    owner = (args.get("owners") or [m.account])[0]
    return {"id": image_id, "imageId": image_id, "name": name, "architecture": "x86_64",
            "ownerId": m.account if owner == "self" else owner, "rootDeviceName": "/dev/sda1",
            "rootDeviceType": "ebs", "virtualizationType": "hvm", "enaSupport": True,
            "creationDate": "2025-07-01T00:00:00.000Z", "state": "available",
            "arn": f"arn:aws:ec2:{m.region}::image/{image_id}"}


def _policy_document(m: PreviewMocks, args: dict) -> dict:
    """The IAM JSON the provider renders from ``aws.iam.get_policy_document`` statements."""
    def one(values):
        values = list(values)
        return values[0] if len(values) == 1 else values

    statements = []
    for s in args.get("statements", []):
        out: dict[str, Any] = {}
        if s.get("sid"):
            out["Sid"] = s["sid"]
        out["Effect"] = s.get("effect", "Allow")
        for key, field in (("actions", "Action"), ("notActions", "NotAction"),
                           ("resources", "Resource"), ("notResources", "NotResource")):
            if s.get(key):
                out[field] = one(s[key])
        for key, field in (("principals", "Principal"), ("notPrincipals", "NotPrincipal")):
            if s.get(key):
                out[field] = {p["type"]: one(p["identifiers"]) for p in s[key]}
        if s.get("conditions"):
            cond: dict[str, dict] = {}
            for c in s["conditions"]:
                cond.setdefault(c["test"], {})[c["variable"]] = one(c["values"])
            out["Condition"] = cond
        statements.append(out)
    doc = {"Version": args.get("version", "2012-10-17"), "Statement": statements}
    text = json.dumps(doc, indent=2)
    return {"id": digest(text, n=10), "json": text, "minifiedJson": json.dumps(doc, separators=(",", ":"))}


def _zones(m: PreviewMocks, args: dict) -> dict:
    letters = "abc"
    return {"id": m.region, "names": [m.region + x for x in letters],
            "zoneIds": [_zone_id(m.region, x) for x in letters], "state": "available",
            "groupNames": [m.region]}


def _subnet(m: PreviewMocks, args: dict) -> dict:
    sid = args.get("id") or "subnet-" + digest(json.dumps(args, sort_keys=True))
    return {"id": sid, "vpcId": "vpc-" + digest(sid), "availabilityZone": f"{m.region}a",
            "availabilityZoneId": _zone_id(m.region, "a"), "cidrBlock": "10.0.0.0/24",
            "arn": m.arn("ec2", f"subnet/{sid}")}


def _vpc(m: PreviewMocks, args: dict) -> dict:
    vid = args.get("id") or "vpc-" + digest(json.dumps(args, sort_keys=True))
    return {"id": vid, "cidrBlock": "10.0.0.0/16", "arn": m.arn("ec2", f"vpc/{vid}"),
            "mainRouteTableId": "rtb-" + digest(vid), "ownerId": m.account}


def _secret(m: PreviewMocks, args: dict) -> dict:
    """A secret's metadata (never its value); the ARN ends in the six random characters AWS appends."""
    name = args.get("name") or str(args.get("arn", "")).split(":secret:", 1)[-1][:-7]
    arn = m.arn("secretsmanager", f"secret:{name}-{digest(name, n=6)}")
    return {"id": arn, "arn": arn, "name": name, "description": "", "kmsKeyId": "", "policy": "", "tags": {}}


def _azure_client(m: PreviewMocks, args: dict) -> dict:
    return {"clientId": fake_uuid("client", PREVIEW_PRINCIPAL), "objectId": fake_uuid("object", PREVIEW_PRINCIPAL),
            "subscriptionId": m.subscription, "tenantId": TENANT_ID}


_CALLS: dict[str, Callable[[PreviewMocks, dict], dict]] = {
    "aws:ec2/getAmi:getAmi": _get_ami,
    "aws:iam/getPolicyDocument:getPolicyDocument": _policy_document,
    "aws:index/getCallerIdentity:getCallerIdentity": lambda m, a: {
        "id": m.account, "accountId": m.account, "userId": "AIDA" + digest(PREVIEW_PRINCIPAL, n=17).upper(),
        "arn": f"arn:aws:iam::{m.account}:user/{PREVIEW_PRINCIPAL}"},
    "aws:index/getRegion:getRegion": lambda m, a: {
        "id": m.region, "name": m.region, "region": m.region, "description": m.region,
        "endpoint": f"ec2.{m.region}.amazonaws.com"},
    "aws:index/getPartition:getPartition": lambda m, a: {
        "id": "aws", "partition": "aws", "dnsSuffix": "amazonaws.com", "reverseDnsPrefix": "com.amazonaws"},
    "aws:index/getAvailabilityZones:getAvailabilityZones": _zones,
    "aws:ec2/getSubnet:getSubnet": _subnet,
    "aws:ec2/getVpc:getVpc": _vpc,
    "aws:ec2/getSubnets:getSubnets": lambda m, a: {"id": m.region, "ids": [
        "subnet-" + digest(m.region, x) for x in "abc"]},
    "aws:secretsmanager/getSecret:getSecret": _secret,
    "aws:index/getServicePrincipal:getServicePrincipal": lambda m, a: {
        "id": f"{a['serviceName']}.amazonaws.com", "name": f"{a['serviceName']}.amazonaws.com",
        "suffix": "amazonaws.com", "region": a.get("region", m.region)},
    "azure-native:authorization:getClientConfig": _azure_client,
    "azure-native:authorization:getClientToken": lambda m, a: {"token": "preview-token"},
    "tencentcloud:User/getInfo:getInfo": lambda m, a: {
        "id": TENCENT_UIN, "appId": TENCENT_APP_ID, "ownerUin": TENCENT_UIN, "uin": TENCENT_UIN,
        "name": PREVIEW_PRINCIPAL},
    "tencentcloud:Instance/getTypes:getTypes": _tencent_types,
    "tencentcloud:Images/getInstance:getInstance": _tencent_images,
    "azure-native:resources:getResourceGroup": lambda m, a: {
        "id": f"/subscriptions/{m.subscription}/resourceGroups/{a['resourceGroupName']}",
        "name": a["resourceGroupName"], "location": m.region},
}
