"""The real stacks through the offline preview: the shipped stacks are clean, the broken ones fail.

tests/policies/broken/*.yaml are stack files the config validator accepts but the pack rejects;
expected.yaml names the mandatory policies each must trip and the exit status.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.preview.__main__ import main

REPO = Path(__file__).resolve().parents[2]
BROKEN = Path(__file__).resolve().parent / "broken"
EXPECTED = yaml.safe_load((BROKEN / "expected.yaml").read_text())


def preview(tmp_path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "preview.json"
    code = main([*args, "--format", "json", "--out", str(out)])
    return code, json.loads(out.read_text())


def mandatory(doc: dict) -> set[str]:
    return {v["policy"] for v in doc["policy"]["violations"] if v["level"] == "mandatory"}


@pytest.mark.parametrize("stack", ["dev", "prod", "azure", "tencent"])
def test_shipped_stack_has_no_mandatory_violation(tmp_path, stack):
    code, doc = preview(tmp_path, "--stack", stack)
    assert mandatory(doc) == set(), [(v["policy"], v["message"]) for v in doc["policy"]["violations"]]
    assert code == 0
    assert doc["policy"]["pack"] == "gpufleet-guardrails"
    assert doc["policy"]["resources_analyzed"] >= 10


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_broken_stack_fails_with_the_expected_policies(tmp_path, name):
    expected = EXPECTED[name]
    extra = ["--policy-config", str(BROKEN / expected["policy_config"])] if "policy_config" in expected else []
    code, doc = preview(tmp_path, "--config-file", str(BROKEN / name), *extra)
    assert code == expected["exit"]
    assert set(expected["mandatory"]) <= mandatory(doc), sorted(mandatory(doc))
    for v in doc["policy"]["violations"]:
        assert v["remediation"] and v["severity"] and v["urn"] is None or v["urn"].startswith("urn:pulumi:")


def test_every_broken_stack_file_has_expectations():
    assert {p.name for p in BROKEN.glob("*.yaml")} - {"expected.yaml"} == set(EXPECTED)


def test_cli_exit_status_and_one_line_summary():
    proc = subprocess.run([sys.executable, "-m", "infra.preview", "--config-file",
                           str(BROKEN / "gang-over-quota.yaml"), "--format", "json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "preview: 1 mandatory policy violation(s)"
    doc = json.loads(proc.stdout)
    quota = [v for v in doc["policy"]["violations"] if v["policy"] == "aws-slurm-partition-gpu-quota"]
    assert len(quota) == 1 and "128 GPUs, over the quota of 64" in quota[0]["message"]


def test_bad_policy_config_file_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "policy.json"
    bad.write_text('{"aws-slurm-partition-gpu-quota": {"maxGpus": -1}}')
    assert main(["--stack", "dev", "--policy-config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --policy-config aws-slurm-partition-gpu-quota.maxGpus: -1 is not allowed")
    assert "\n" not in err
