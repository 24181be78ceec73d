"""Offline preview speed: `python -m infra.preview --stack X --format json` as a user runs it.

- preview_dev_s, preview_prod_s: wall time of the whole command (best of ROUNDS), policy pack included.
- preview_overhead_ratio: prod preview time over a bare `python -c "import pulumi, pulumi_aws"`,
  both measured in this run, interleaved, so that the machine's speed cancels out.
- preview_import_floor_ratio: a process that only imports the pulumi_aws modules a prod preview loads
  (the SDK loads every module of a service package, e.g. all of `pulumi_aws.ec2`, on first use), over
  the same bare import: the part of the preview's time that is the SDK's import cost, not the preview's.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 3
_LOADED = """
import json, sys
from infra.preview.__main__ import main
main(["--stack", "prod", "--format", "json", "--out", "/dev/null"])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("pulumi_aws."))))
"""


def _wall(argv: list[str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    if proc.returncode not in (0, 1):  # 1: mandatory policy violations, still a whole preview
        raise RuntimeError(f"{' '.join(argv[1:])} exited {proc.returncode}: {proc.stderr.strip()}")
    return elapsed


def _sdk_modules() -> list[str]:
    proc = subprocess.run([sys.executable, "-c", _LOADED], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=True)
    return json.loads(proc.stdout.splitlines()[-1])


def run() -> dict:
    py = sys.executable
    commands = {
        "bare": [py, "-c", "import pulumi, pulumi_aws"],
        "dev": [py, "-m", "infra.preview", "--stack", "dev", "--format", "json"],
        "prod": [py, "-m", "infra.preview", "--stack", "prod", "--format", "json"],
        "floor": [py, "-W", "ignore", "-c", "import pulumi, " + ", ".join(_sdk_modules())],
    }
    best = {name: float("inf") for name in commands}
    for _ in range(ROUNDS):
        for name, argv in commands.items():
            best[name] = min(best[name], _wall(argv))
    return {
        "preview_dev_s": {"value": round(best["dev"], 3), "unit": "s", "target": "info"},
        "preview_prod_s": {"value": round(best["prod"], 3), "unit": "s", "target": "info"},
        "preview_overhead_ratio": {"value": round(best["prod"] / best["bare"], 2), "unit": "x",
                                   "target": "<= 2.0"},
        "preview_import_floor_ratio": {"value": round(best["floor"] / best["bare"], 2), "unit": "x",
                                       "target": "info (SDK import cost alone)"},
    }


if __name__ == "__main__":
    for key, fig in run().items():
        print(f"{key:28} {fig['value']:>8} {fig['unit']}  target {fig['target']}")
