"""Markdown rendering of a fixed preview document, checked against golden files.

Regenerate the golden files after an intended change with:
    GPUFLEET_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/infra/review/test_review_markdown.py
"""
from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

import pytest

from infra.config import parse
from infra.preview import cost, diff, markdown

HERE = Path(__file__).parent
FIXTURES, GOLDEN = HERE / "fixtures", HERE / "golden"


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("GPUFLEET_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with GPUFLEET_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def _head_with_diff() -> dict:
    head = _load("dev_head.json")
    head["diff"] = diff.compute(_load("dev_base.json"), head)
    return head


def test_report_matches_golden():
    _check_golden("dev_base.md", markdown.render(_load("dev_base.json")))


def test_report_with_diff_matches_golden():
    _check_golden("dev_head_diff.md", markdown.render(_head_with_diff()))


def test_output_does_not_depend_on_resource_or_violation_order():
    doc = _head_with_diff()
    shuffled = copy.deepcopy(doc)
    rng = random.Random(7)
    rng.shuffle(shuffled["resources"])
    rng.shuffle(shuffled["policy"]["violations"])
    assert markdown.render(shuffled) == markdown.render(doc)


def test_mandatory_verdicts_come_first_with_severity_and_remediation():
    text = markdown.render(_load("dev_head.json"))
    rows = [line for line in text.splitlines() if line.startswith(("| ❌", "| ⚠️"))]
    assert rows[0].startswith("| ❌ mandatory | high | `aws-s3-bucket-public-access-block` | dev-checkpoints |")
    assert rows[0].endswith("| Add an aws.s3.BucketPublicAccessBlock with all four flags true. |")
    assert rows[1].startswith("| ⚠️ advisory | low |")
    assert "❌ 1 mandatory, 1 advisory" in text


def test_cost_table_has_a_row_per_partition_idle_and_full_with_the_price_date():
    text = markdown.render(_load("dev_base.json"))
    assert "· cost: $297.48/month idle, $1,301.43 at full size\n" in text
    assert "List prices of us-east-1 as of 2025-07-01, 730 h/month (stack region eu-west-1)." in text
    table = text.split("| partition | nodes always on / max | on-demand | spot | idle | full |", 1)[1].splitlines()
    # see test_review_cost: the controller and fixed items 297.48; 4 spot nodes 4 x (0.3219 x 730 + 16) = 1003.95
    assert table[2:6] == [
        "| `gpu` (spot) | 0 / 4 | `g6.xlarge` $0.8048/h | `g6.xlarge` $0.3219/h | $0.00 | $1,003.95 |",
        "| controller and fixed items | | | | $297.48 | $297.48 |",
        "| **this stack** | | | | **$297.48** | **$1,301.43** |", ""]
    bullets = [line for line in text.split("### Monthly cost", 1)[1].split("###", 1)[0].splitlines()
               if line.startswith("- ")]
    assert bullets[0] == ("- `gpu`: spot at the cheapest of the listed types (planning ratio to on-demand); each "
                          "node also carries its root volume 200 GiB gp3 at $16.00/month")
    assert bullets[1].startswith("- controller and fixed items per month: controller m6i.large (on-demand) 1 × "
                                 "$70.08 = $70.08; controller root volume 50 GiB gp3 1 × $4.00 = $4.00; ")
    assert bullets[1].endswith("; interface VPC endpoints (10 services × 3 AZ) 30 × $7.30 = $219.00")
    assert bullets[2] == "- usage-based, not in the totals: EFS Standard storage (shared file system) $0.30 per GB-month"
    # 1301.43 of 3000: 43.4 %, headroom 1698.57
    assert bullets[3] == ("- budget $3,000.00/month: ✅ within budget at full size (43.4% used at full size, "
                          "headroom +$1,698.57)")
    assert bullets[4].startswith("- not included: usage-based charges: ")


def _estimate(raw: dict) -> dict:
    base = {"aws:region": "eu-west-1", "gpufleet:cloud": "aws", "gpufleet:dataClassification": "internal",
            "gpufleet:image": {"name": "gpufleet-gpu-*"}}
    return cost.estimate(parse({**base, **raw}, "t"))


def _cost_text(est: dict) -> str:
    doc = {**_load("dev_base.json"), "cost": est}
    return markdown.render(doc).split("### Monthly cost", 1)[1].split("\n### ", 1)[0]


def test_two_partitions_two_rows_with_their_own_prices_and_base():
    est = _estimate({"gpufleet:budgetMonthlyUsd": 90000, "gpufleet:partitions": [
        {"name": "train", "instanceTypes": ["p5.48xlarge"], "nodes": {"min": 0, "max": 2}, "gang": True},
        {"name": "dev", "instanceTypes": ["g5.xlarge", "g6.xlarge"], "nodes": {"min": 1, "max": 3}, "spot": True,
         "onDemandBase": 1}]})
    text = _cost_text(est)
    # the figures of test_review_cost.test_aws_partitions_each_priced_by_their_own_types_base_and_purchase
    assert ("| `train` (on-demand) | 0 / 2 | `p5.48xlarge` $55.04/h | `p5.48xlarge` $33.024/h | $0.00 | "
            "$80,390.40 |\n| `dev` (spot) | 1 / 3 | `g5.xlarge` $1.006/h | `g6.xlarge` $0.3219/h | $750.38 | "
            "$1,252.35 |\n| controller and fixed items | | | | $319.38 | $319.38 |\n"
            "| **this stack** | | | | **$1,069.76** | **$81,962.13** |") in text
    assert "- `train`: on-demand at the primary type; each node also carries" in text
    assert ("- `dev`: the first 1 node(s) on-demand at the primary type, the rest spot at the cheapest of the "
            "listed types (planning ratio to on-demand); each node") in text
    assert "- budget $90,000.00/month: ✅ within budget at full size (91.1% used at full size, headroom +$8,037.87)" \
        in text


@pytest.mark.parametrize("budget,state", [
    (1000, "❌ over budget when idle"),                # idle 1069.76 > 1000
    (50000, "⚠️ over budget at full size"),            # idle within, full 81962.13 over
])
def test_budget_line_says_when_the_stack_is_over(budget, state):
    est = _estimate({"gpufleet:budgetMonthlyUsd": budget, "gpufleet:partitions": [
        {"name": "train", "instanceTypes": ["p5.48xlarge"], "nodes": {"min": 0, "max": 2}, "gang": True},
        {"name": "dev", "instanceTypes": ["g5.xlarge", "g6.xlarge"], "nodes": {"min": 1, "max": 3}, "spot": True,
         "onDemandBase": 1}]})
    assert f"/month: {state} (" in _cost_text(est)


def test_a_cny_stack_shows_yuan_and_its_usage_price():
    raw = {"tencentcloud:region": "ap-shanghai", "gpufleet:cloud": "tencent", "gpufleet:mode": "queue",
           "gpufleet:instanceTypes": ["GN10Xp.20XLARGE320"], "gpufleet:nodes": {"min": 0, "max": 2},
           "gpufleet:spot": True, "gpufleet:dataClassification": "internal", "gpufleet:budgetMonthlyCny": 100000,
           "gpufleet:image": {"id": "img-0a1b2c3d"}}
    doc = {**_load("dev_base.json"), "cost": cost.estimate(parse(raw, "tc"))}
    text = markdown.render(doc)
    section = text.split("### Monthly cost", 1)[1].split("\n### ", 1)[0]
    assert "$" not in section and "List prices in CNY of ap-guangzhou" in section
    assert "· cost: ¥641.00/month idle, ¥83,971.80 at full size" in text
    assert "| **this stack** | | | | **¥641.00** | **¥83,971.80** |" in section
    assert ("- usage-based, not in the totals: CFS Standard storage (2 file systems: home, slurm state) "
            "¥0.35 per GiB-month") in section


def test_an_old_cost_document_renders_no_cost_section():
    doc = _load("dev_base.json")
    doc["cost"] = {"currency": "USD", "monthly_usd": {"min": 1.0, "desired": 1.0, "max": 2.0}, "rows": {}}
    text = markdown.render(doc)
    assert "### Monthly cost" not in text and "cost:" not in text.splitlines()[2]


def test_mermaid_graph_links_components_through_dependencies():
    doc = _load("dev_base.json")
    owner = markdown.components(doc)
    by_name = {markdown._component_label(doc, c): c for c in set(owner.values())}
    edges = {(markdown._component_label(doc, a).split()[0], markdown._component_label(doc, b).split()[0])
             for a, b in markdown.links(doc, owner)}
    assert edges == {("dev-compute", "dev-network"), ("dev-monitoring", "dev-queue"),
                     ("dev-monitoring", "dev-storage"), ("dev-queue", "dev-storage")}
    assert len(by_name) == 5
    # the provider resource belongs to no component and is not counted
    assert not any(urn.split("::")[2].startswith("pulumi:providers:") for urn in owner)


def test_diff_section_marks_replacements_and_renames():
    text = markdown.render(_head_with_diff())
    assert "1 to add, 1 to remove, 4 to update, 1 to replace, 1 renamed; cost per month ±$0.00 idle, " \
           "+$501.97 at full size." in text  # 2 more spot nodes at full size: 2 x (0.3219 x 730 + 16)
    assert "| 🔁 replace | `aws:ec2/vpc:Vpc` | dev-vpc | `cidrBlock`: `10.20.0.0/16` → `10.24.0.0/16` " \
           "(forces replacement) |" in text
    assert "| ✏️ update | `aws:ec2/launchTemplate:LaunchTemplate` | dev-nodes |" in text
    assert "| 🏷️ rename | `aws:cloudwatch/logGroup:LogGroup` | dev-logs → dev-log-group |" in text


def test_self_diff_renders_no_changes():
    doc = _load("dev_base.json")
    doc["diff"] = diff.compute(doc, copy.deepcopy(doc))
    section = markdown.render(doc).split("### Changes against the base branch", 1)[1].split("###", 1)[0]
    assert "No changes." in section and "| change |" not in section


def test_policy_pack_that_did_not_run_is_not_reported_as_clean():
    doc = _load("dev_base.json")
    doc["policy"] = {"violations": [], "error": "policies/__main__.py exited with status 1"}
    text = markdown.render(doc)
    assert "policy: ⚠️ not run" in text
    assert "The policy pack did not run: policies/__main__.py exited with status 1" in text
    assert "No policy violations" not in text


@pytest.mark.parametrize("x,text", [(0.8048, "$0.8048"), (55.04, "$55.04"), (12.2386, "$12.2386"), (1.0, "$1.00")])
def test_hourly_rates_keep_catalog_precision(x, text):
    assert markdown.rate(x) == text


def test_missing_policy_analyzer_is_not_reported_as_clean():
    doc = _load("dev_base.json")
    doc["policy"] = {"pack": None, "violations": []}
    text = markdown.render(doc)
    assert "policy: ⚠️ not run" in text and "no policy analyzer in this checkout" in text


def test_the_same_change_on_many_resources_is_one_row(monkeypatch):
    base = _load("dev_base.json")
    head = copy.deepcopy(base)
    for res in head["resources"]:
        if "tags" in res["inputs"]:
            res["inputs"]["tags"] = {**res["inputs"]["tags"], "team": "research-infra"}
    head["diff"] = diff.compute(base, head)
    assert len(head["diff"]["changed"]) == 11
    rows = [line for line in markdown.render(head).splitlines() if line.startswith("| ✏️ update")]
    assert rows == ["| ✏️ update | 10 types | dev-nodes, dev-logs, dev-dlq-not-empty, dev-nodes-sg, dev-private-a, "
                    "dev-vpc, dev-s3, dev-jobs, dev-jobs-dlq, dev-key, dev-checkpoints | "
                    "`tags.team`: `ml-platform` → `research-infra` |"]
    monkeypatch.setattr(markdown, "MAX_NAMES", 3)
    assert "| dev-nodes, dev-logs, dev-dlq-not-empty, … and 8 more |" in markdown.render(head)


def test_program_warnings_are_listed():
    doc = _load("dev_base.json")
    doc["warnings"] = ["b: second", "a: first"]
    text = markdown.render(doc)
    assert "<details><summary>⚠️ 2 program warnings</summary>\n\n- a: first\n- b: second\n" in text
