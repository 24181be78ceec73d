"""The table format: a tree of resources under their parents, outputs, policy verdicts, cost."""
from __future__ import annotations

from infra.preview import report, runner
from tests.infra.preview import fake_program
from tests.infra.preview.helpers import stack_raw


def test_table_shows_the_tree_ids_outputs_and_verdicts():
    raw, secrets = stack_raw("dev")
    doc = runner.preview(raw, secrets, "dev", program=fake_program.main)
    doc["policy"] = {"pack": "gpufleet", "violations": [
        {"policy": "s3-tls-only", "level": "mandatory", "severity": "high", "message": "bucket allows plain HTTP",
         "urn": "urn:pulumi:dev::gpufleet::gpufleet:test:Storage$aws:s3/bucket:Bucket::data-bucket"},
        {"policy": "tags", "level": "advisory", "severity": "low", "message": "no owner tag", "urn": ""}]}
    text = report.table(doc, width=100)
    lines = text.splitlines()
    custom = sum(r["custom"] for r in doc["resources"])
    assert lines[0] == "Stack dev (aws, eu-west-1): queue mode, 0-4 x g6.xlarge, g5.xlarge, g6.2xlarge, g5.2xlarge (spot)"
    assert lines[1] == f"{custom} resources to create in 2 components"
    assert lines[3].split() == ["TYPE", "NAME", "ID"]
    assert lines[4].startswith("pulumi:pulumi:Stack") and "gpufleet-dev" in lines[4]
    bucket = next(r for r in doc["resources"] if r["name"] == "data-bucket")
    [row] = [line for line in lines if "aws:s3/bucket:Bucket " in line]
    # Children are drawn under their component, with their physical ids.
    assert row.lstrip("│ ").startswith(("├─ aws:s3/bucket:Bucket", "└─ aws:s3/bucket:Bucket"))
    assert row.rstrip().endswith(bucket["id"])
    storage_at = next(i for i, line in enumerate(lines) if "gpufleet:test:Storage" in line)
    assert lines.index(row) > storage_at and row.startswith(("│  ", "   "))
    assert f"  bucket     {bucket['id']}" in lines
    assert "  nodes_max  4" in lines
    assert "Policy (gpufleet): 2 violation(s)" in lines
    assert lines[lines.index("Policy (gpufleet): 2 violation(s)") + 1] == (
        "  [mandatory/high] s3-tls-only data-bucket: bucket allows plain HTTP")
    assert "  [advisory/low] tags stack: no owner tag" in lines
    [cost] = [line for line in lines if line.startswith("Cost per month")]
    assert "max $" in cost and "  budget $3,000.00" in lines  # the line after it, in 100 columns


def test_table_without_policy_pack_or_outputs():
    doc = {"stack": "s", "cloud": "aws", "config": {"region": "eu-west-1", "mode": "gang", "nodes": {"min": 2, "max": 2},
                                                    "instanceTypes": ["p5.48xlarge"], "spot": False},
           "resources": [{"type": "pulumi:pulumi:Stack", "name": "gpufleet-s", "urn": "u", "parent": None,
                          "custom": False, "id": None}],
           "outputs": {}, "policy": {"pack": None, "violations": []}, "cost": {}}
    text = report.table(doc)
    assert "gang mode, 2-2 x p5.48xlarge\n0 resources to create in 0 components" in text
    assert "Policy: no policy pack ran" in text and "Outputs" not in text and "Cost" not in text
