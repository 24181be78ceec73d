"""Node boot configuration figures.

- userdata_render_ms: in-process `render_node_user_data` of the prod (p5 gang) Slurm node, mean over 200 renders.
- userdata_ec2_limit_frac: bytes of the largest stack's node user-data over EC2's 16 KiB user-data limit.
"""
from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run() -> dict[str, dict]:
    from infra.userdata import AWS_USER_DATA_LIMIT, render_node_user_data
    from tests.infra.test_userdata import SLURM, _stack_nodes

    nodes = {stack: {"slurm": {**SLURM, "munge": f"gpufleet-{stack}-munge"}, **node}
             for stack, node in _stack_nodes()}  # a stack's own slurm object wins
    rounds = 200
    started = time.perf_counter()
    for _ in range(rounds):
        render_node_user_data(nodes["prod"])
    render_ms = (time.perf_counter() - started) / rounds * 1000
    largest = max(len(render_node_user_data(n).encode()) for n in nodes.values())
    return {
        "userdata_render_ms": {"value": render_ms, "unit": "ms", "target": "< 5"},
        "userdata_ec2_limit_frac": {"value": largest / AWS_USER_DATA_LIMIT, "unit": "ratio", "target": "< 0.25"},
    }
