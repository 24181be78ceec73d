"""The cluster in a box on its real Slurm (`python -m infra.demo`), run once with its defaults: a 2-node DDP job
and a sweep of three (one job array) of the built-in GPT, a spot notice to the node of the job left running alone.

- demo_requeue_latency_s: from the spot notice to the interrupted job's first step done on the other node
  (the watcher's 2 s poll, drain and `scontrol requeue`, the stop step's checkpoint and exit, Slurm's
  cred_expire of 10 s, the batch script on the other node, Python and torch starting, the checkpoint loaded); no
  instance boots in the box, so this is the requeue latency excluding instance boot.
- demo_steps_lost, demo_steps_redone: over every job of the demo (target 0: the notice checkpoints the stop step).
- demo_wall_s: the whole demo (preview, box up, the jobs, the summary, box down), for information.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        summary = Path(tmp) / "summary.json"
        proc = subprocess.run([sys.executable, "-m", "infra.demo", "--summary-json", str(summary)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError((proc.stderr or proc.stdout).strip().splitlines()[-1])
        s = json.loads(summary.read_text())
    return {
        "demo_requeue_latency_s": {"value": s["requeue_latency_s"], "unit": "s",
                                   "target": "<= 30 (notice to the first step resumed elsewhere)"},
        "demo_steps_lost": {"value": s["steps_lost"], "unit": "steps", "target": "0"},
        "demo_steps_redone": {"value": s["steps_redone"], "unit": "steps", "target": "0"},
        "demo_wall_s": {"value": s["wall_s"], "unit": "s", "target": "info (about 220 on 2 cores)"},
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
