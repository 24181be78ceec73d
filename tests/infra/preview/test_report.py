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
    assert lines[0] == "Stack dev (aws, eu-west-1): partition gpu 0-4 x g6.xlarge, g5.xlarge, g6.2xlarge, g5.2xlarge (spot);"
    assert lines[1] == "  controller m6i.large"
    assert lines[2] == f"{custom} resources to create in 2 components"
    assert lines[4].split() == ["TYPE", "NAME", "ID"]
    assert lines[5].startswith("pulumi:pulumi:Stack") and "gpufleet-dev" in lines[5]
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
    # the dev stack idle (the controller and the fixed items) and at full size (tests/infra/review/test_review_cost)
    assert cost == "Cost per month (list prices of 2025-07-01): idle $319.38 / full $1,323.33; budget $3,000.00"
    narrow = report.table(doc, width=60).splitlines()
    at = narrow.index("Cost per month (list prices of 2025-07-01): idle $319.38 /")
    assert narrow[at + 1:at + 3] == ["  full $1,323.33", "  budget $3,000.00"]  # wrapped, the budget on its own


def test_cost_line_in_cny_and_the_diff_cost_in_its_currency():
    cost = {"currency": "CNY", "price_date": "2025-07-01", "monthly_usd": {"idle": 641.0, "full": 167302.6},
            "budget": {"monthly_usd": 300000.0}}
    assert report._cost(cost, 120) == [
        "Cost per month in CNY (list prices of 2025-07-01): idle ¥641.00 / full ¥167,302.60; budget ¥300,000.00"]
    out = report._diff({"cost": {"delta_monthly_usd": {"idle": 0.0, "full": 83330.8}, "currency": "CNY"}}, 100)
    assert out[-1] == "  cost per month: idle +0.00 CNY / full +83,330.80 CNY"


def test_table_without_policy_pack_or_outputs():
    doc = {"stack": "s", "cloud": "aws", "config": {"region": "eu-west-1", "mode": "gang", "nodes": {"min": 2, "max": 2},
                                                    "instanceTypes": ["p5.48xlarge"], "spot": False},
           "resources": [{"type": "pulumi:pulumi:Stack", "name": "gpufleet-s", "urn": "u", "parent": None,
                          "custom": False, "id": None}],
           "outputs": {}, "policy": {"pack": None, "violations": []}, "cost": {}}
    text = report.table(doc)
    assert "gang mode, 2-2 x p5.48xlarge\n0 resources to create in 0 components" in text
    assert "Policy: no policy pack ran" in text and "Outputs" not in text and "Cost" not in text
