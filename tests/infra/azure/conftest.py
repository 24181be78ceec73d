"""The azure stack on Pulumi's mock runtime (tests/infra/mock_run.py), and what its machines boot with."""
from __future__ import annotations

import base64
import json

import pytest
import yaml

from infra.azure.stack import build_azure
from tests.infra.mock_run import Resource, Run, run_program, stack_config

__all__ = ["Resource", "Run", "run_stack", "azure_config", "written", "controller_user_data", "controller_file",
           "nodes_json", "node_user_data", "node_json", "TWO_PARTITIONS", "partitions_config"]

VM = "azure-native:compute:VirtualMachine"
# A queue partition of A100 nodes on spot with one on-demand node, and a gang of four H100 nodes on demand (an
# availability set takes no spot VMs).
TWO_PARTITIONS = [
    {"name": "small", "instanceTypes": ["Standard_ND96asr_v4"], "nodes": {"max": 8}, "spot": True,
     "onDemandBase": 1},
    {"name": "big", "instanceTypes": ["Standard_ND96isr_H100_v5"], "nodes": {"min": 0, "max": 4}, "gang": True},
]


def run_stack(cfg) -> Run:
    return run_program(build_azure, cfg)


def azure_config(**overrides):
    """Pulumi.azure.yaml, with `gpufleet:<key>` values replaced (None removes the key)."""
    return stack_config("azure", **overrides)


def partitions_config(partitions=None, **overrides):
    """Pulumi.azure.yaml with `partitions` in place of the single group's keys."""
    return azure_config(partitions=partitions or TWO_PARTITIONS, mode=None, instanceTypes=None, nodes=None,
                        spot=None, **overrides)


def written(user_data: str, path: str) -> str:
    """A file a cloud-config writes."""
    (file,) = [f for f in yaml.safe_load(user_data)["write_files"] if f["path"] == path]
    return file["content"]


def controller_user_data(run: Run) -> str:
    return base64.b64decode(run.one(VM).inputs["osProfile"]["customData"]).decode()


def controller_file(run: Run, path: str):
    """A file the controller's cloud-init writes: JSON ones decoded."""
    text = written(controller_user_data(run), path)
    return json.loads(text) if path.endswith(".json") else text


def nodes_json(run: Run) -> dict:
    return controller_file(run, "/etc/gpufleet/nodes.json")


def node_user_data(run: Run, partition: str = "gpu") -> str:
    """A partition's node cloud-config, as nodes.json hands it to the node provider (base64)."""
    return base64.b64decode(nodes_json(run)["partitions"][partition]["custom_data"]).decode()


def node_json(run: Run, partition: str = "gpu") -> dict:
    return json.loads(written(node_user_data(run, partition), "/etc/gpufleet/node.json"))


@pytest.fixture(scope="session")
def azure_run() -> Run:
    """The azure stack as committed, run once for the whole session."""
    return run_stack(azure_config())


@pytest.fixture(scope="session")
def two_partitions() -> Run:
    """The azure stack with a queue and a gang partition."""
    return run_stack(partitions_config())
