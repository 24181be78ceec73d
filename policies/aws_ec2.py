"""EC2 guardrails: IMDSv2, encrypted EBS, no public IPs, no security group ingress from the internet.

Launch-template booleans arrive as strings ("true"); `flag` reads both forms.
"""
from __future__ import annotations

from policies.common import UNKNOWN, flag, get, items, resource_policy
from policies.tokens import (DEFAULT_SECURITY_GROUP, EBS_VOLUME, INSTANCE, LAUNCH_TEMPLATE, SECURITY_GROUP,
                            SG_INGRESS_RULE, SG_RULE, SUBNET)

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
]
