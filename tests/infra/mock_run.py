"""Run a cloud's program on Pulumi's mock runtime with the preview's provider mocks; collect what it registers.

The stack test packages (tests/infra/azure, tests/infra/tencent) build their session fixtures from this.
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi.runtime.mocks import MockMonitor

from infra import config
from infra.preview.mocks import PreviewMocks
from tests.conftest import ROOT


@dataclass
class Resource:
    type: str
    name: str
    urn: str
    inputs: dict
    id: str

    @property
    def parent_type(self) -> str | None:
        chain = self.urn.split("::")[2].split("$")
        return chain[-2] if len(chain) > 1 else None


class Recording(PreviewMocks):
    """The preview's mocks, keeping each resource's inputs and id and every invoke."""

    def __init__(self, stack: str, region: str):
        super().__init__(stack, region)
        self.inputs: dict[tuple[str, str], dict] = {}
        self.ids: dict[tuple[str, str], str] = {}
        self.calls: list[tuple[str, dict]] = []

    def new_resource(self, args):
        self.inputs[(args.typ, args.name)] = dict(args.inputs)
        rid, state = super().new_resource(args)
        self.ids[(args.typ, args.name)] = rid
        identity = state.get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
            # ARM answers the identity list given on input as a map {resource id: {clientId, principalId}}.
            state = {**state, "identity": {**identity, "userAssignedIdentities": {
                i: {} for i in identity["userAssignedIdentities"]}}}
        return rid, state

    def call(self, args):
        self.calls.append((args.token, dict(args.args)))
        return super().call(args)


@dataclass
class Run:
    resources: list[Resource]
    outputs: dict
    calls: list

    def of_type(self, typ: str) -> list[Resource]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str, name: str | None = None) -> Resource:
        found = [r for r in self.of_type(typ) if name is None or r.name == name]
        assert len(found) == 1, f"{typ} {name or ''}: {len(found)} resources"
        return found[0]


def run_program(build, cfg: config.StackConfig) -> Run:
    """``build(cfg)`` (a cloud's stack function returning its outputs) on the mock runtime."""
    mocks = Recording(cfg.stack, cfg.region)
    monitor = MockMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="gpufleet", stack=cfg.stack, preview=False, monitor=monitor)
    outputs: dict = {}

    @pulumi.runtime.test
    def program():
        result = build(cfg)
        return pulumi.Output.all(**{k: pulumi.Output.from_input(v) for k, v in result.items()}).apply(outputs.update)

    program()
    resources = []
    for urn in monitor.get_registered_resources():
        typ, name = urn.split("::")[2].split("$")[-1], urn.split("::")[3]
        resources.append(Resource(typ, name, urn, mocks.inputs[(typ, name)], mocks.ids[(typ, name)]))
    return Run(resources, outputs, mocks.calls)


def stack_config(stack: str, **overrides) -> config.StackConfig:
    """Pulumi.<stack>.yaml, with `gpufleet:<key>` values replaced (None removes the key)."""
    raw, secrets = config.read_stack_file(ROOT / f"Pulumi.{stack}.yaml")
    raw = dict(raw)
    for key, value in overrides.items():
        full = key if ":" in key else f"gpufleet:{key}"
        if value is None:
            raw.pop(full, None)
        else:
            raw[full] = value
    return config.parse(raw, stack, secrets)
