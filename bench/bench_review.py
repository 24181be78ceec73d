"""PR-review report speed on the prod stack.

- preview_markdown_s: wall time of `python -m infra.preview --stack prod --format markdown` (a fresh process,
  as CI runs it: imports, mock-runtime program, policy pack, cost, render).
- diff_render_ms: in-process `diff.compute` + `markdown.render` of the prod preview (its `--format json`
  document) against itself: what the review adds on top of the preview.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _preview(fmt: str) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "infra.preview", "--stack", "prod", "--format", fmt]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    if proc.returncode not in (0, 1):  # 1: mandatory policy violations, still a full report
        raise RuntimeError(f"{' '.join(cmd[1:])} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return elapsed, proc.stdout


def run() -> dict[str, dict]:
    from infra.preview import diff, markdown

    markdown_s, text = _preview("markdown")
    if not text.startswith("## gpufleet preview: `prod`"):
        raise RuntimeError("the markdown preview did not print a report")
    _, out = _preview("json")
    doc = json.loads(out)
    started = time.perf_counter()
    doc["diff"] = diff.compute(doc, doc)
    markdown.render(doc)
    render_ms = (time.perf_counter() - started) * 1000
    return {
        "preview_markdown_s": {"value": round(markdown_s, 3), "unit": "s", "target": "<= 10"},
        "diff_render_ms": {"value": round(render_ms, 2), "unit": "ms", "target": "<= 100"},
    }
