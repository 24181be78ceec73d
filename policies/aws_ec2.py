"""EC2 guardrails: IMDSv2, encrypted EBS, no public IPs, no security group ingress from the internet,
VPC endpoints that pass only the account's own principals and resources, a DNS firewall on the stack's VPC, and
the Slurm controller's hardening.

Launch-template booleans arrive as strings ("true"); `flag` reads both forms.
"""
from __future__ import annotations

from policies.common import (UNKNOWN, Resource, Stack, as_list, aws_managed_key, flag, get, items, json_doc, number,
                             resource_policy, stack_policy, type_chain)
from policies.tokens import (CONTROLLER, DEFAULT_SECURITY_GROUP, DNS_FIREWALL_ASSOCIATION, EBS_VOLUME, EIP,
                            EIP_ASSOCIATION, INSTANCE, LAUNCH_TEMPLATE, NETWORK_INTERFACE, SECURITY_GROUP,
                            SG_INGRESS_RULE, SG_RULE, SUBNET, VPC, VPC_ENDPOINT, VPC_ENDPOINT_POLICY)

WORLD = ("0.0.0.0/0", "::/0")


def check_imdsv2(props: dict, ctx):
    options = props.get("metadataOptions")
    if options is UNKNOWN:
        return
    if get(options, "httpEndpoint") == "disabled":
        return
    tokens = get(options, "httpTokens")
    if tokens is not UNKNOWN and tokens != "required":
        yield f"metadataOptions.httpTokens is {tokens or 'unset'} (IMDSv1 allowed); set it to 'required'"


def _unencrypted(devices, label) -> list[str]:
    return [f"{label} {get(d, 'deviceName') or i}" for i, d in enumerate(devices)
            if d is not UNKNOWN and get(d, "encrypted") is not UNKNOWN and flag(get(d, "encrypted")) is not True]


def check_launch_template_ebs(props: dict, ctx):
    mappings = props.get("blockDeviceMappings")
    if mappings is UNKNOWN:
        return
    ebs = [get(m, "ebs") for m in items(mappings) if get(m, "virtualName") is None]
    if not ebs:
        yield "no blockDeviceMappings: the root volume's encryption is left to the AMI; declare it with encrypted 'true'"
    for where in _unencrypted([e or {} for e in ebs], "block device"):
        yield f"{where} is not encrypted"


def check_instance_ebs(props: dict, ctx):
    devices = [props.get("rootBlockDevice") or {}] + items(props.get("ebsBlockDevices"))
    for where in _unencrypted(devices, "volume"):
        yield f"{where} is not encrypted"


def check_volume(props: dict, ctx):
    if props.get("encrypted") is not UNKNOWN and flag(props.get("encrypted")) is not True:
        yield "EBS volume is not encrypted"


def check_launch_template_public_ip(props: dict, ctx):
    for i, nic in enumerate(items(props.get("networkInterfaces"))):
        if flag(get(nic, "associatePublicIpAddress")) is True:
            yield f"network interface {i} (device {get(nic, 'deviceIndex')}) associates a public IP address"


def check_instance_public_ip(props: dict, ctx):
    if flag(props.get("associatePublicIpAddress")) is True:
        yield "instance associates a public IP address"


def check_subnet_public_ip(props: dict, ctx):
    if flag(props.get("mapPublicIpOnLaunch")) is True:
        yield "subnet maps a public IP to every instance launched in it"


def _world_sources(rule: dict) -> list[str]:
    cidrs = items(rule.get("cidrBlocks")) + items(rule.get("ipv6CidrBlocks"))
    cidrs += [rule.get("cidrIpv4"), rule.get("cidrIpv6")]
    return [c for c in cidrs if c in WORLD]


def _ports(rule: dict) -> str:
    proto = rule.get("protocol", rule.get("ipProtocol"))
    if str(proto) == "-1":
        return "all traffic"
    return f"{proto} {rule.get('fromPort')}-{rule.get('toPort')}"


def check_no_internet_ingress(props: dict, ctx):
    if ctx.resource_type in (SECURITY_GROUP, DEFAULT_SECURITY_GROUP):
        rules = [r for r in items(props.get("ingress")) if isinstance(r, dict)]
    elif ctx.resource_type == SG_RULE:
        rules = [props] if props.get("type") == "ingress" else []
    else:
        rules = [props]
    for rule in rules:
        for cidr in _world_sources(rule):
            yield f"ingress from {cidr} ({_ports(rule)})"


# Condition keys that bind a request to the account's (or organization's) principals and resources.
PRINCIPAL_KEYS = ("aws:principalaccount", "aws:principalorgid", "aws:principalorgpaths")
RESOURCE_KEYS = ("aws:resourceaccount", "aws:resourceorgid", "aws:resourceorgpaths")
_EQUALITY = ("stringequals", "stringequalsignorecase", "stringlike", "forallvalues:stringequals",
             "forallvalues:stringlike", "foranyvalue:stringequals", "foranyvalue:stringlike")


def _anyone(statement: dict) -> bool:
    if statement.get("NotPrincipal") is not None:
        return True
    principal = statement.get("Principal")
    if isinstance(principal, dict):
        return any("*" in as_list(v) for v in principal.values())
    return "*" in as_list(principal)


def _anything(statement: dict) -> bool:
    return statement.get("NotResource") is not None or "*" in as_list(statement.get("Resource"))


def _binds(statement: dict, keys: tuple[str, ...]) -> bool:
    condition = statement.get("Condition")
    if not isinstance(condition, dict):
        return False
    return any(isinstance(pairs, dict) and op.lower() in _EQUALITY and any(k.lower() in keys for k in pairs)
               for op, pairs in condition.items())


def open_statements(doc) -> list[str]:
    """The Allow statements of an endpoint policy that let any principal reach any resource without a
    condition naming the account (or organization) of both."""
    if not isinstance(doc, dict):
        return ["the policy is not a JSON policy document"]
    out = []
    for i, st in enumerate(s for s in as_list(doc.get("Statement")) if isinstance(s, dict)):
        if st.get("Effect") != "Allow" or not (_anyone(st) and _anything(st)):
            continue
        missing = [what for what, keys in (("principals", PRINCIPAL_KEYS), ("resources", RESOURCE_KEYS))
                   if not _binds(st, keys)]
        if missing:
            out.append(f"statement {st.get('Sid') or i} allows any principal on any resource without a condition "
                       f"on the account of its {' and '.join(missing)}")
    return out


def check_endpoint_policy(stack: Stack, ctx):
    """Every endpoint has a policy (inline or an aws.ec2.VpcEndpointPolicy), and every endpoint policy,
    whether or not its endpoint is in this stack, keeps requests to the account's principals and resources."""
    for endpoint in stack.of(VPC_ENDPOINT):
        service = endpoint.props.get("serviceName")
        label = f"VPC endpoint '{endpoint.name}'" + (f" ({service})" if isinstance(service, str) else "")
        inline = endpoint.props.get("policy")
        if inline is None:
            if not stack.referrers(endpoint, [VPC_ENDPOINT_POLICY], "vpcEndpointId"):
                yield (f"{label} has no policy: AWS gives it one that passes any principal to any resource, "
                       f"a way out for data"), endpoint.urn
            continue
        doc = json_doc(inline)
        for problem in [] if doc is UNKNOWN else open_statements(doc):
            yield f"{label}: {problem}", endpoint.urn
    for attached in stack.of(VPC_ENDPOINT_POLICY):
        policy = attached.props.get("policy")
        if policy is None:
            yield f"endpoint policy '{attached.name}' sets no document: the endpoint allows full access", attached.urn
            continue
        doc = json_doc(policy)
        for problem in [] if doc is UNKNOWN else open_statements(doc):
            yield f"endpoint policy '{attached.name}': {problem}", attached.urn


def check_dns_firewall(stack: Stack, ctx):
    """Every VPC the stack creates has a Route 53 Resolver DNS Firewall rule group associated with it. An existing
    VPC (gpufleet:network) is its owner's to firewall: an association filters every workload's DNS in it."""
    for vpc in stack.of(VPC):
        if not stack.referrers(vpc, [DNS_FIREWALL_ASSOCIATION], "vpcId"):
            yield (f"VPC '{vpc.name}' has no DNS firewall rule group association: a job can resolve any name, and "
                   f"tunnel data out through DNS queries"), vpc.urn


# --- the Slurm controller -------------------------------------------------------------------------

def controllers(stack: Stack) -> list[Resource]:
    """The stack's Slurm controller instances: EC2 instances created under a gpufleet:aws:Controller component."""
    return [r for r in stack.of(INSTANCE)
            if stack.under(r, CONTROLLER) is not None or CONTROLLER in type_chain(r.urn)[:-1]]


def metadata_gaps(options) -> list[str]:
    """How an instance's metadataOptions fall short of IMDSv2 with one hop (a disabled endpoint is fine)."""
    if options is UNKNOWN or get(options, "httpEndpoint") == "disabled":
        return []
    gaps = []
    tokens = get(options, "httpTokens")
    if tokens is not UNKNOWN and tokens != "required":
        gaps.append(f"metadataOptions.httpTokens is {tokens or 'unset'}, not 'required' (IMDSv1 allowed)")
    hops = get(options, "httpPutResponseHopLimit")
    if hops is not UNKNOWN and number(hops) != 1:
        # unset, the hop limit is the AMI's default (2 on images marked for IMDSv2): a container could reach it
        shown = f"{number(hops):g}" if number(hops) is not None else "unset"
        gaps.append(f"metadataOptions.httpPutResponseHopLimit is {shown}, not 1")
    return gaps


def volume_gaps(props: dict) -> list[str]:
    """The controller's volumes (root and attached) that are not encrypted under a customer managed key."""
    gaps = []
    devices = [("root volume", props.get("rootBlockDevice"))]
    devices += [(f"volume {get(d, 'deviceName') or i}", d) for i, d in enumerate(items(props.get("ebsBlockDevices")))]
    for label, device in devices:
        if device is UNKNOWN:
            continue
        encrypted, key = get(device, "encrypted"), get(device, "kmsKeyId")
        if encrypted is not UNKNOWN and flag(encrypted) is not True:
            gaps.append(f"{label} is not encrypted")
        elif key is not UNKNOWN and not key:
            gaps.append(f"{label} is encrypted with the AWS managed key (kmsKeyId unset), not the stack's key")
        elif aws_managed_key(key):
            gaps.append(f"{label} is encrypted with the AWS managed key {key}, not the stack's key")
    return gaps


def public_addresses(stack: Stack, instance: Resource) -> list[str]:
    """Ways the controller gets a public IPv4 address: asked for at launch, an Elastic IP on the instance or on one
    of its network interfaces, or a subnet that maps public addresses on launch."""
    props = instance.props
    found = []
    if flag(props.get("associatePublicIpAddress")) is True:
        found.append("associatePublicIpAddress is true")
    nics = stack.targets(instance, [NETWORK_INTERFACE], "networkInterfaces", "primaryNetworkInterface")
    for eip in stack.of(EIP):
        if instance.urn in eip.deps("instance"):
            found.append(f"Elastic IP '{eip.name}' is on the instance")
        for nic in nics:
            if nic.urn in eip.deps("networkInterface"):
                found.append(f"Elastic IP '{eip.name}' is on its network interface '{nic.name}'")
    for assoc in stack.of(EIP_ASSOCIATION):
        if instance.urn in assoc.deps("instanceId"):
            found.append(f"Elastic IP association '{assoc.name}' is on the instance")
        for nic in nics:
            if nic.urn in assoc.deps("networkInterfaceId"):
                found.append(f"Elastic IP association '{assoc.name}' is on its network interface '{nic.name}'")
    # A subnet's public-IP-on-launch gives an address to the primary interface the launch creates, not to an
    # existing interface attached at device 0 (nor when the launch says associatePublicIpAddress false).
    if props.get("subnetId") is not None and flag(props.get("associatePublicIpAddress")) is not False:
        for subnet in stack.targets(instance, [SUBNET], "subnetId"):
            if flag(subnet.props.get("mapPublicIpOnLaunch")) is True:
                found.append(f"it launches into subnet '{subnet.name}', which maps a public IP on launch")
    return found


def check_controller(stack: Stack, ctx):
    for instance in controllers(stack):
        gaps = (public_addresses(stack, instance) + metadata_gaps(instance.props.get("metadataOptions"))
                + volume_gaps(instance.props))
        for gap in gaps:
            yield f"controller '{instance.name}': {gap}", instance.urn


_CIS = ["CIS"]
POLICIES = [
    resource_policy(
        "aws-ec2-launchtemplate-imdsv2",
        "Launch templates require IMDSv2 session tokens for instance metadata.",
        types=[LAUNCH_TEMPLATE], severity="high", frameworks=_CIS, check=check_imdsv2,
        remediation="Set metadataOptions {httpEndpoint: 'enabled', httpTokens: 'required', "
                    "httpPutResponseHopLimit: 2} on the launch template."),
    resource_policy(
        "aws-ec2-instance-imdsv2",
        "EC2 instances require IMDSv2 session tokens for instance metadata.",
        types=[INSTANCE], severity="high", frameworks=_CIS, check=check_imdsv2,
        remediation="Set metadataOptions.httpTokens 'required' on the instance."),
    resource_policy(
        "aws-ec2-launchtemplate-ebs-encrypted",
        "Launch templates declare every EBS volume, root included, as encrypted.",
        types=[LAUNCH_TEMPLATE], severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_launch_template_ebs,
        remediation="Add blockDeviceMappings for the root device (and any data volume) with ebs.encrypted 'true' "
                    "and ebs.kmsKeyId set to the stack's KMS key."),
    resource_policy(
        "aws-ec2-instance-ebs-encrypted",
        "EC2 instances encrypt their root and attached EBS volumes.",
        types=[INSTANCE], severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_instance_ebs,
        remediation="Set rootBlockDevice.encrypted and every ebsBlockDevices[].encrypted to true with a kmsKeyId."),
    resource_policy(
        "aws-ebs-volume-encrypted",
        "EBS volumes are encrypted.",
        types=[EBS_VOLUME], severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_volume,
        remediation="Set encrypted true and kmsKeyId on the volume."),
    resource_policy(
        "aws-ec2-launchtemplate-no-public-ip",
        "Launch template network interfaces do not associate public IP addresses.",
        types=[LAUNCH_TEMPLATE], severity="high", frameworks=_CIS, check=check_launch_template_public_ip,
        remediation="Set associatePublicIpAddress 'false' on every network interface; reach the internet "
                    "through a NAT gateway and AWS services through VPC endpoints."),
    resource_policy(
        "aws-ec2-instance-no-public-ip",
        "EC2 instances do not associate public IP addresses.",
        types=[INSTANCE], severity="high", frameworks=_CIS, check=check_instance_public_ip,
        remediation="Set associatePublicIpAddress false and place the instance in a private subnet."),
    resource_policy(
        "aws-ec2-subnet-no-public-ip-on-launch",
        "Subnets do not assign public IP addresses to instances on launch.",
        types=[SUBNET], severity="medium", frameworks=_CIS, check=check_subnet_public_ip,
        remediation="Set mapPublicIpOnLaunch false; put GPU nodes in private subnets behind a NAT gateway."),
    resource_policy(
        "aws-ec2-securitygroup-no-internet-ingress",
        "Security groups and their rules allow no ingress from 0.0.0.0/0 or ::/0.",
        types=[SECURITY_GROUP, DEFAULT_SECURITY_GROUP, SG_RULE, SG_INGRESS_RULE], severity="critical",
        frameworks=_CIS, check=check_no_internet_ingress,
        remediation="Replace world CIDRs with the security group itself, a peer security group, or the VPC CIDR; "
                    "use SSM Session Manager instead of inbound SSH."),
    stack_policy(
        "aws-ec2-vpcendpoint-restricted-policy",
        "VPC endpoints have a policy that passes only the account's own principals and resources.",
        severity="high", frameworks=["CIS", "GDPR", "HIPAA"], check=check_endpoint_policy,
        remediation="Give every aws.ec2.VpcEndpoint a policy: Allow with Condition StringEquals aws:PrincipalAccount "
                    "and aws:ResourceAccount set to the account (or aws:PrincipalOrgID / aws:ResourceOrgID), and for "
                    "the S3 gateway only the stack's bucket ARNs plus the AWS-owned buckets the nodes need, by name."),
    stack_policy(
        "aws-ec2-vpc-dns-firewall",
        "VPCs of the stack resolve names through a Route 53 Resolver DNS Firewall rule group.",
        severity="medium", frameworks=["CIS", "GDPR", "HIPAA"], check=check_dns_firewall,
        remediation="Associate an aws.route53.ResolverFirewallRuleGroup with the VPC "
                    "(ResolverFirewallRuleGroupAssociation with vpcId of the VPC) that allows the AWS service "
                    "domains the nodes need and blocks every other domain (infra.aws.dns_firewall)."),
    stack_policy(
        "aws-slurm-controller-hardened",
        "The Slurm controller instance is private, takes IMDSv2 tokens only with one hop, and encrypts its volumes "
        "with a customer managed key.",
        severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_controller,
        remediation="Give the controller a network interface in a private subnet and no Elastic IP "
                    "(associatePublicIpAddress false), metadataOptions {httpTokens: 'required', "
                    "httpPutResponseHopLimit: 1}, and rootBlockDevice {encrypted: true, kmsKeyId: the stack key}; "
                    "reach it through SSM Session Manager."),
]
