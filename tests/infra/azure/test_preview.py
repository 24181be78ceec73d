"""Pulumi.azure.yaml through the offline preview and the policy pack: complete, resolved, no mandatory violation."""
from __future__ import annotations

import json

import pytest

from infra import config
from infra.preview import runner
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def doc():
    raw, secrets = config.read_stack_file(ROOT / "Pulumi.azure.yaml")
    return runner.preview(raw, secrets, "azure")


def test_every_cloud_resource_is_resolved_and_inside_a_component(doc):
    assert doc["cloud"] == "azure" and runner.UNKNOWN not in json.dumps(doc)
    by_urn = {r["urn"]: r for r in doc["resources"]}
    custom = [r for r in doc["resources"] if r["custom"]]
    assert custom and all(r["type"].startswith("azure-native:") for r in custom)
    assert all(by_urn[r["parent"]]["type"].startswith("gpufleet:azure:") for r in custom)


def test_controller_waits_for_its_roles_and_shares(doc):
    by_name = {r["name"]: r for r in doc["resources"]}
    deps = set(by_name["controller-vm"]["dependencies"])
    for name in ("identity-controller-blob", "identity-controller-queue-0", "identity-controller-queue-1",
                 "identity-controller-launch", "identity-controller-subnet", "identity-controller-assign-identity",
                 "vault-munge-keeper-assignment",  # its rights
                 "shared-fs-home", "shared-fs-slurm-state", "shared-fs-dns-records",  # its file systems, by name
                 "partition-gpu-vmss"):  # what nodes.json names
        assert by_name[name]["urn"] in deps, name


def test_policy_pack_finds_no_mandatory_violation(doc):
    assert doc["policy"]["pack"] and doc["policy"]["resources_analyzed"] >= 40
    assert runner.mandatory_violations(doc) == []


def test_outputs_resolve_to_the_emitted_endpoints(doc):
    out = doc["outputs"]
    assert out["queueUrl"] == f"https://{out['storageAccount']}.queue.core.windows.net/jobs"
    assert out["containerUrl"] == f"https://{out['storageAccount']}.blob.core.windows.net/checkpoints"
    assert out["mungeKeySecret"] == f"https://{out['keyVault']}.vault.azure.net/secrets/slurm-munge-key"
    assert out["controllerAddress"] == "10.64.16.4"
