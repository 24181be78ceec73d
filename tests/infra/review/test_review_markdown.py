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

from infra.preview import diff, markdown

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


def test_cost_table_has_min_desired_max_on_demand_and_spot_with_the_price_date():
    text = markdown.render(_load("dev_base.json"))
    assert "List prices of us-east-1 as of 2025-07-01, 730 h/month" in text
    table = text.split("| nodes | count | on-demand | spot |", 1)[1].splitlines()[2:5]
    assert table == ["| min | 0 | $0.00 | $0.00 | **$179.20** |",
                     "| desired | 0 | $0.00 | $0.00 | **$179.20** |",
                     "| max | 4 | $2,414.02 | $1,003.95 | **$1,183.15** |"]


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
    assert "1 to add, 1 to remove, 4 to update, 1 to replace, 1 renamed; cost per month ±$0.00 at min, " \
           "±$0.00 at desired, +$501.97 at max." in text  # 2 more spot nodes: 2 x (0.3219 x 730 + 16)
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
