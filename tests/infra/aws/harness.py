"""Run the real Pulumi program for a stack on Pulumi's mock runtime and record what it registers.

The mocks answer like AWS would: ids with the real prefixes (vpc-, sg-, lt-, ...), ARNs in the
stack's region and a fixed account, physical names for auto-named resources, so that values built
from other resources' outputs (policies from ARNs, node settings from the queue URL) resolve.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pulumi
import yaml

from infra import config
from infra.aws.policies import SESSION_MANAGER, stay_on_instance
from infra.preview.mocks import PreviewMocks

ROOT = Path(__file__).resolve().parents[3]
ACCOUNT = "123456789012"


@dataclass
class Resource:
    type: str
    name: str
    custom: bool
    inputs: dict
    state: dict
    urn: str
    id: str


class AwsMocks(PreviewMocks):
    """The offline preview's mocks, recording what the program registers and calls."""

    def __init__(self, stack: str, region: str):
        super().__init__(stack, region, ACCOUNT)
        self.calls: list[tuple[str, dict]] = []
        self.registered: list[Resource] = []

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append((args.token, dict(args.args)))
        return super().call(args), []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        rid, state = super().new_resource(args)
        self.registered.append(Resource(args.typ, args.name, bool(args.custom), dict(args.inputs), state, "", rid))
        return rid, state


@dataclass
class Built:
    cfg: config.StackConfig
    resources: list[Resource]
    outputs: dict
    calls: list[tuple[str, dict]]

    def of_type(self, typ: str) -> list[Resource]:
        return [r for r in self.resources if r.type == typ]

    def user_data(self, partition: str = "gpu") -> str:
        """A partition's node user-data (its launch template's)."""
        (lt,) = [r for r in self.of_type("aws:ec2/launchTemplate:LaunchTemplate")
                 if r.name == f"gpufleet-{self.cfg.stack}-{partition}-node"]
        return base64.b64decode(lt.inputs["userData"]).decode()

    def node_json(self, partition: str = "gpu") -> dict:
        """/etc/gpufleet/node.json as a node's cloud-init writes it."""
        return json.loads(_written(self.user_data(partition), "/etc/gpufleet/node.json"))

    def controller_user_data(self) -> str:
        return base64.b64decode(self.one("aws:ec2/instance:Instance").inputs["userDataBase64"]).decode()

    def controller_file(self, path: str):
        """A file the controller's cloud-init writes: JSON ones decoded."""
        text = _written(self.controller_user_data(), path)
        return json.loads(text) if path.endswith(".json") else text

    def one(self, typ: str, name_part: str = "") -> Resource:
        found = [r for r in self.of_type(typ) if name_part in r.name]
        assert len(found) == 1, f"{typ} matching {name_part!r}: {[r.name for r in found]}"
        return found[0]


def _written(user_data: str, path: str) -> str:
    doc = yaml.safe_load(user_data)
    (file,) = [f for f in doc["write_files"] if f["path"] == path]
    return file["content"]


def stack_config(stack: str, overrides: Optional[dict] = None, drop: tuple[str, ...] = ()) -> config.StackConfig:
    """A repository stack's config with keys replaced (overrides) or removed (drop)."""
    raw, secrets = config.read_stack_file(ROOT / f"Pulumi.{stack}.yaml")
    raw = {k: v for k, v in {**raw, **(overrides or {})}.items() if k not in drop}
    return config.parse(raw, stack, secrets)


def build_stack(cfg: config.StackConfig) -> Built:
    from infra import program

    mocks = AwsMocks(cfg.stack, cfg.region)
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
    """No wildcard action; Resource "*" only for Describe calls, namespaced PutMetricData, the ECR login
    token (GetAuthorizationToken takes no resource) and Session Manager's actions held to one VPC (they take none).
    The only Deny statements are the ones that keep instance credentials on their instance."""
    for st in doc["Statement"]:
        if st["Effect"] == "Deny":
            assert st in stay_on_instance(), st
            continue
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
                elif action in SESSION_MANAGER:
                    vpc = st["Condition"]["StringEquals"]["aws:ec2InstanceSourceVPC"]
                    assert list(st["Condition"]) == ["StringEquals"] and isinstance(vpc, str) and vpc, st
                    assert "*" not in vpc and "?" not in vpc, vpc
                else:
                    assert action.split(":")[1].startswith("Describe"), action
