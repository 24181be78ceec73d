"""The cluster in a box (`python -m infra.demo`), run once with its default sweep.

- demo_requeue_latency_s: from the spot notice to the interrupted job's first step done on the other node
  (notice poll, stop at an agreed step, checkpoint, exit, hand-back, receive, start, resume); no instance
  boots in the demo, so this is the requeue latency excluding instance boot.
- demo_wall_s: the whole demo (preview, moto, provisioning, the sweep, the summary), for information.
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
        "demo_requeue_latency_s": {"value": s["requeue_latency_s"], "unit": "s", "target": "<= 10"},
        "demo_wall_s": {"value": s["wall_s"], "unit": "s", "target": "info (about 120 on 2 cores)"},
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
