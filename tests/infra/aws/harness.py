"""Run the real Pulumi program for a stack on Pulumi's mock runtime and record what it registers.

The mocks answer like AWS would: ids with the real prefixes (vpc-, sg-, lt-, ...), ARNs in the
stack's region and a fixed account, physical names for auto-named resources, so that values built
from other resources' outputs (policies from ARNs, node settings from the queue URL) resolve.
"""
from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pulumi
import yaml

from infra import config

ROOT = Path(__file__).resolve().parents[3]
ACCOUNT = "123456789012"


def _hex(seed: str, n: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


@dataclass
class Resource:
    type: str
    name: str
    custom: bool
    inputs: dict
    state: dict
    urn: str
    id: str


class AwsMocks(pulumi.runtime.Mocks):
    def __init__(self, region: str):
        self.region = region
        self.calls: list[tuple[str, dict]] = []
        self.registered: list[Resource] = []

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append((args.token, dict(args.args)))
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/ci", "userId": "AIDAEXAMPLE",
                    "id": ACCOUNT}, []
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            names = [f"{self.region}{z}" for z in "abc"]
            return {"names": names, "zoneIds": [f"euw1-az{i}" for i in (1, 2, 3)], "id": self.region}, []
        if args.token == "aws:ec2/getAmi:getAmi":
            image_ids = [v for f in args.args.get("filters", []) if f["name"] == "image-id" for v in f["values"]]
            ami = image_ids[0] if image_ids else "ami-0" + _hex(str(args.args), 16)
            return {"id": ami, "imageId": ami, "name": "gpufleet-gpu-2025-07-01", "architecture": "x86_64",
                    "rootDeviceName": "/dev/sda1", "ownerId": ACCOUNT}, []
        if args.token == "aws:secretsmanager/getSecret:getSecret":
            name = args.args["name"]
            arn = f"arn:aws:secretsmanager:{self.region}:{ACCOUNT}:secret:{name}-{_hex(name, 6)}"
            return {"arn": arn, "id": arn, "name": name}, []
        raise AssertionError(f"unexpected invoke {args.token}")

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        rid, state = self._answer(args)
        self.registered.append(Resource(args.typ, args.name, bool(args.custom), dict(args.inputs), state, "", rid))
        return rid, state

    def _answer(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        typ, name, inputs = args.typ, args.name, dict(args.inputs)
        region, acct = self.region, ACCOUNT
        auto = inputs.get("name") or f"{name}-{_hex(name, 7)}"
        state: dict[str, Any] = dict(inputs)
        rid = f"{name}-id"
        if typ == "aws:kms/key:Key":
            rid = f"{_hex(name, 8)}-{_hex(name + '1', 4)}-{_hex(name + '2', 4)}-{_hex(name + '3', 4)}-{_hex(name + '4', 12)}"
            state.update(arn=f"arn:aws:kms:{region}:{acct}:key/{rid}", keyId=rid)
        elif typ == "aws:s3/bucket:Bucket":
            rid = inputs.get("bucket") or auto
            state.update(bucket=rid, arn=f"arn:aws:s3:::{rid}")
        elif typ == "aws:sqs/queue:Queue":
            rid = f"https://sqs.{region}.amazonaws.com/{acct}/{auto}"
            state.update(name=auto, url=rid, arn=f"arn:aws:sqs:{region}:{acct}:{auto}")
        elif typ == "aws:iam/role:Role":
            rid = auto
            state.update(name=auto, arn=f"arn:aws:iam::{acct}:role/{auto}")
        elif typ == "aws:iam/serviceLinkedRole:ServiceLinkedRole":
            assert inputs["awsServiceName"] == "autoscaling.amazonaws.com", inputs
            path = f"/aws-service-role/{inputs['awsServiceName']}/"
            rid = f"AWSServiceRoleForAutoScaling_{inputs['customSuffix']}"
            state.update(name=rid, path=path, arn=f"arn:aws:iam::{acct}:role{path}{rid}")
        elif typ == "aws:iam/instanceProfile:InstanceProfile":
            rid = auto
            state.update(name=auto, arn=f"arn:aws:iam::{acct}:instance-profile/{auto}")
        elif typ == "aws:cloudwatch/logGroup:LogGroup":
            rid = auto
            state.update(name=auto, arn=f"arn:aws:logs:{region}:{acct}:log-group:{auto}")
        elif typ == "aws:sns/topic:Topic":
            rid = f"arn:aws:sns:{region}:{acct}:{auto}"
            state.update(name=auto, arn=rid)
        elif typ == "aws:autoscaling/group:Group":
            rid = auto
            state.update(name=auto, arn=f"arn:aws:autoscaling:{region}:{acct}:autoScalingGroup:"
                                        f"{_hex(name, 8)}-0000-4000-8000-{_hex(name, 12)}:autoScalingGroupName/{auto}")
        elif typ == "aws:autoscaling/policy:Policy":
            rid = auto
            state.update(name=auto, arn=f"arn:aws:autoscaling:{region}:{acct}:scalingPolicy:{_hex(name, 8)}:"
                                        f"autoScalingGroupName/x:policyName/{auto}")
        elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
            rid = "lt-0" + _hex(name, 16)
            state.update(name=auto, latestVersion=1, defaultVersion=1, arn=f"arn:aws:ec2:{region}:{acct}:launch-template/{rid}")
        elif typ == "aws:ec2/placementGroup:PlacementGroup":
            rid = auto
            state.update(name=auto, arn=f"arn:aws:ec2:{region}:{acct}:placement-group/{auto}")
        elif typ == "aws:ec2/vpcEndpoint:VpcEndpoint":
            rid = "vpce-0" + _hex(name, 16)
            state.update(prefixListId="pl-6da54004" if inputs.get("vpcEndpointType") == "Gateway" else None)
        elif typ == "aws:ecr/repository:Repository":
            rid = auto
            state.update(name=auto, arn=f"arn:aws:ecr:{region}:{acct}:repository/{auto}", registryId=acct,
                         repositoryUrl=f"{acct}.dkr.ecr.{region}.amazonaws.com/{auto}")
        elif typ == "aws:cloudwatch/dashboard:Dashboard":
            rid = inputs["dashboardName"]
        elif typ == "aws:budgets/budget:Budget":
            rid = f"{acct}:{auto}"
            state.update(name=auto)
        elif typ.startswith("aws:ec2/"):
            prefix = {"Vpc": "vpc", "Subnet": "subnet", "SecurityGroup": "sg", "RouteTable": "rtb",
                      "DefaultSecurityGroup": "sg", "RouteTableAssociation": "rtbassoc"}.get(typ.rsplit(":", 1)[1])
            if prefix:
                rid = f"{prefix}-0{_hex(name, 16)}"
        elif typ.startswith("aws:vpc/securityGroup"):
            rid = "sgr-0" + _hex(name, 16)
        if "arn" not in state and args.custom:
            state["arn"] = f"arn:aws:{typ.split(':')[1].split('/')[0]}:{region}:{acct}:{rid}"
        return rid, state


@dataclass
class Built:
    cfg: config.StackConfig
    resources: list[Resource]
    outputs: dict
    calls: list[tuple[str, dict]]

    def of_type(self, typ: str) -> list[Resource]:
        return [r for r in self.resources if r.type == typ]

    def user_data(self) -> str:
        return base64.b64decode(self.one("aws:ec2/launchTemplate:LaunchTemplate").inputs["userData"]).decode()

    def node_json(self) -> dict:
        """/etc/gpufleet/node.json as the node's cloud-init writes it."""
        doc = yaml.safe_load(self.user_data())
        (file,) = [f for f in doc["write_files"] if f["path"] == "/etc/gpufleet/node.json"]
        return json.loads(file["content"])

    def one(self, typ: str, name_part: str = "") -> Resource:
        found = [r for r in self.of_type(typ) if name_part in r.name]
        assert len(found) == 1, f"{typ} matching {name_part!r}: {[r.name for r in found]}"
        return found[0]


def stack_config(stack: str, overrides: Optional[dict] = None) -> config.StackConfig:
    raw, secrets = config.read_stack_file(ROOT / f"Pulumi.{stack}.yaml")
    raw = {**raw, **(overrides or {})}
    return config.parse(raw, stack, secrets)


def build_stack(cfg: config.StackConfig) -> Built:
    from infra import program

    mocks = AwsMocks(cfg.region)
    monitor = pulumi.runtime.mocks.MockMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="gpufleet", stack=cfg.stack, preview=False, monitor=monitor)
    outputs: dict = {}
    pulumi.runtime.mocks.test(lambda: pulumi.Output.from_input(program.build(cfg)).apply(outputs.update))()
    for urn in monitor.resources:
        qualified_type, name = urn.split("::")[2:4]
        for r in mocks.registered:
            if r.name == name and qualified_type.split("$")[-1] == r.type:
                r.urn = urn
    return Built(cfg, mocks.registered, outputs, mocks.calls)


def assert_least_privilege(doc: dict, namespace: str) -> None:
    """No wildcard action; Resource "*" only for Describe calls, namespaced PutMetricData and the ECR login
    token (GetAuthorizationToken takes no resource)."""
    for st in doc["Statement"]:
        assert st["Effect"] == "Allow"
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        assert all("*" not in a for a in actions), actions
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        if "*" in resources:
            for action in actions:
                if action == "cloudwatch:PutMetricData":
                    assert st["Condition"] == {"StringEquals": {"cloudwatch:namespace": namespace}}
                elif action == "ecr:GetAuthorizationToken":
                    assert actions == [action]
                else:
                    assert action.split(":")[1].startswith("Describe"), action


def assert_autoscaling_ebs_grants(doc: dict, role_arn: str) -> None:
    """The key lets the group's service-linked role do what the EC2 Auto Scaling user guide lists for
    EBS volumes encrypted with a customer managed key, wildcards spelled out, and create grants only
    for AWS resources."""
    mine = [st for st in doc["Statement"] if st.get("Principal") == {"AWS": role_arn}]
    assert [st["Sid"] for st in mine] == ["AutoScalingEbsVolumes", "AutoScalingEbsGrants"]
    use, grant = mine
    assert sorted(use["Action"]) == sorted([
        "kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey",
        "kms:GenerateDataKeyWithoutPlaintext", "kms:DescribeKey"])
    assert "Condition" not in use
    assert grant["Action"] == "kms:CreateGrant"
    assert grant.get("Condition") == {"Bool": {"kms:GrantIsForAWSResource": True}}
    for st in mine:
        assert st["Effect"] == "Allow" and st["Resource"] == "*"
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        assert all("*" not in a for a in actions), actions
    # the role appears in no other statement
    assert all(role_arn not in json.dumps(st) for st in doc["Statement"] if st not in mine)
