"""The tencent stack on Pulumi's mock runtime (tests/infra/mock_run.py), and what its machines boot with."""
from __future__ import annotations

import base64
import json

import pytest
import yaml

from infra.tencent.stack import build_tencent
from tests.infra.mock_run import Resource, Run, run_program, stack_config

__all__ = ["Resource", "Run", "run_stack", "tencent_config", "written", "controller_user_data", "controller_file",
           "node_user_data", "node_json", "TWO_PARTITIONS"]

INSTANCE = "tencentcloud:Instance/instance:Instance"
TEMPLATE = "tencentcloud:Cvm/launchTemplate:LaunchTemplate"
# A queue partition of T4 nodes on spot with one on-demand node, and a gang of two A100 nodes on demand.
TWO_PARTITIONS = [
    {"name": "small", "instanceTypes": ["GN7.2XLARGE32", "GN7.10XLARGE160"], "nodes": {"max": 8}, "spot": True,
     "onDemandBase": 1},
    {"name": "big", "instanceTypes": ["GT4.41XLARGE948"], "nodes": {"min": 0, "max": 2}, "gang": True},
]


def run_stack(cfg) -> Run:
    return run_program(build_tencent, cfg)


def tencent_config(**overrides):
    """Pulumi.tencent.yaml, with `gpufleet:<key>` values replaced (None removes the key)."""
    return stack_config("tencent", **overrides)


def two_partitions_config():
    return tencent_config(partitions=TWO_PARTITIONS, mode=None, instanceTypes=None, nodes=None, spot=None)


def written(user_data: str, path: str):
    """A file a cloud-config writes: JSON ones decoded."""
    (file,) = [f for f in yaml.safe_load(user_data)["write_files"] if f["path"] == path]
    return json.loads(file["content"]) if path.endswith(".json") else file["content"]


def controller_user_data(run: Run) -> str:
    return base64.b64decode(run.one(INSTANCE).inputs["userData"]).decode()


def controller_file(run: Run, path: str):
    return written(controller_user_data(run), path)


def node_user_data(run: Run, partition: str = "gpu") -> str:
    (template,) = [t for t in run.of_type(TEMPLATE) if t.inputs["launchTemplateName"].endswith(f"-{partition}-node")]
    return base64.b64decode(template.inputs["userData"]).decode()


def node_json(run: Run, partition: str = "gpu") -> dict:
    return written(node_user_data(run, partition), "/etc/gpufleet/node.json")


@pytest.fixture(scope="session")
def tencent_run() -> Run:
    """The tencent stack as committed, run once for the whole session."""
    return run_stack(tencent_config())


@pytest.fixture(scope="session")
def two_partitions() -> Run:
    """The tencent stack with the `partitions` key: a spot queue partition and an on-demand gang."""
    return run_stack(two_partitions_config())
