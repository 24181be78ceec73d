"""Policy pack throughput through the Analyzer gRPC protocol, over the prod stack's resources.

The resources come from the offline preview of Pulumi.prod.yaml; one pack process is started (timed
separately) and analyses the whole stack (Configure, Analyze per resource, AnalyzeStack) several times.
"""
from __future__ import annotations

import time
from pathlib import Path

from infra import config
from infra.preview import runner
from infra.preview.analyzer import PolicyPack

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 5


def run() -> dict:
    raw, secret_keys = config.read_stack_file(REPO / "Pulumi.prod.yaml")
    resources = runner.preview(raw, secret_keys, "prod")["resources"]
    engine = config.to_engine_config(raw)
    started = time.perf_counter()
    with PolicyPack("prod", runner.PROJECT, engine) as pack:
        start_s = time.perf_counter() - started
        pack.analyze(resources)  # warm-up: imports inside the pack, first gRPC calls
        analysed, began = 0, time.perf_counter()
        for _ in range(ROUNDS):
            analysed += pack.analyze(resources)["resources_analyzed"]
        elapsed = time.perf_counter() - began
    return {
        "policy_resources_per_s": {"value": analysed / elapsed, "unit": "res/s",
                                   "target": f">= 100 ({len(resources)} prod resources, {ROUNDS} rounds)"},
        "policy_pack_start_s": {"value": start_s, "unit": "s", "target": "<= 5 (process start to GetPluginInfo)"},
    }
