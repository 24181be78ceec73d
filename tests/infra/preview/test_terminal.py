"""The preview on a fresh machine: regions that do not exist, a --diff base of another stack, a table that
fits a 100-column terminal with the diff and each violation's remediation."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from infra import regions
from infra.preview import report, runner
from tests.infra.preview.helpers import REPO


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.preview", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_regions_come_from_botocore_and_the_project_list():
    assert regions.check("aws", "eu-west-1") is None and regions.check("aws", "cn-north-1") is None  # aws-cn
    assert regions.check("aws", "us-gov-west-1") is None
    told = regions.check("aws", "mars-north-9")
    assert told.startswith("not a region in botocore ") and "partition data" in told
    assert regions.check("aws", "eu-wst-1").endswith("(a region newer than botocore: upgrade it)")
    assert regions.check("azure", "westeurope") is None and regions.check("azure", "swedencentral") is None
    assert regions.check("azure", "West Europe") == "write the location name 'westeurope' (lower case, no spaces)"
    assert regions.check("azure", "marsnorth").startswith("not an Azure location; known: australiacentral, ")
    from infra.config import EU_REGIONS

    assert all(regions.check(cloud, r) is None for cloud, names in EU_REGIONS.items() for r in names)


@pytest.mark.parametrize("base, key, value, message", [
    ("dev", "aws:region", "mars-north-9", "error: aws:region: 'mars-north-9' is not allowed; not a region in botocore"),
    ("azure", "azure-native:location", "West Europe",
     "error: azure-native:location: 'West Europe' is not allowed; write the location name 'westeurope'"),
])
def test_a_region_that_does_not_exist_is_a_config_error(base, key, value, message, write_stack):
    proc = cli("--config-file", str(write_stack(base, **{key: value})))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(message), proc.stderr


def test_base_warnings_name_another_stack_or_cloud():
    doc = {"stack": "dev", "cloud": "aws"}
    assert runner.base_warnings({"stack": "dev", "cloud": "aws"}, doc) == []
    assert runner.base_warnings({"stack": "azure", "cloud": "azure"}, doc) == [
        "--diff: the base is a preview of stack 'azure', not 'dev': the diff shows how the two stacks differ, "
        "not a change to 'dev'",
        "--diff: the base is a preview of cloud 'azure', not 'aws': the diff shows how the two clouds differ, "
        "not a change to 'aws'"]


def test_the_real_table_fits_100_columns_with_the_diff_and_warns_of_another_stack(tmp_path):
    base = tmp_path / "prod.json"
    assert cli("--stack", "prod", "--format", "json", "--out", str(base)).returncode in (0, 1)
    proc = cli("--stack", "dev", "--diff", str(base), env={"COLUMNS": "100"})
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    changes = next(line for line in lines if line.startswith("Changes against the base: "))
    assert " to add, " in changes and " to update, " in changes
    assert any(line.startswith(("  + ", "  - ", "  ~ ", "  ! ")) for line in lines)
    assert "  --diff: the base is a preview of stack 'prod', not 'dev': the diff shows how the two stacks" in lines
    assert any(len(line) == 100 or "…" in line for line in lines)  # something was long enough to elide or wrap


def test_violations_show_their_remediation_wrapped_to_the_width():
    long_id = "arn:aws:iam::123456789012:role/" + "x" * 120 + "-tail"
    doc = {"stack": "s", "cloud": "aws", "config": {"region": "eu-west-1", "mode": "queue", "nodes": {"min": 0, "max": 2},
                                                    "instanceTypes": ["g5.xlarge"], "spot": True},
           "resources": [{"type": "pulumi:pulumi:Stack", "name": "gpufleet-s", "urn": "u", "parent": None,
                          "custom": False, "id": None},
                         {"type": "aws:iam/role:Role", "name": "node-role", "urn": "r", "parent": "u",
                          "custom": True, "id": long_id}],
           "outputs": {"role": long_id},
           "policy": {"pack": "gpufleet", "violations": [
               {"policy": "imdsv2-required", "level": "mandatory", "severity": "high", "urn": "a::node-lt",
                "message": "the launch template lets instances use IMDSv1, which any SSRF in a workload can abuse "
                           "to read the node role's credentials",
                "remediation": "Set metadataOptions {httpEndpoint: 'enabled', httpTokens: 'required'} on the "
                               "launch template."}]},
           "cost": {}}
    text = report.table(doc, width=60)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 60, max(lines, key=len)
    at = lines.index("  [mandatory/high] imdsv2-required node-lt: the launch")
    fix = [line for line in lines[at:] if line.startswith("      fix: ")]
    assert fix == ["      fix: Set metadataOptions {httpEndpoint: 'enabled',"]
    assert "httpTokens: 'required'} on the launch template." in " ".join(lines[at:]).replace("  ", " ")
    [row] = [line for line in lines if "node-role" in line]
    assert row.endswith("-tail") and "…" in row  # the id's start and end, elided in the middle
    assert report.elide("abcdefghij", 5) == "ab…ij" and report.elide("abc", 5) == "abc"
