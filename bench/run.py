"""`make bench`: run every bench/bench_*.py module, print one line per figure, write bench/results.json.

Each module exposes `run() -> dict[name, {"value": float, "unit": str, "target": str}]`; ratios are
measured within one run so that the machine's speed cancels out.
"""
from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main(argv: list[str]) -> int:
    only = set(argv)
    results: dict[str, dict] = {}
    failed = []
    for path in sorted(HERE.glob("bench_*.py")):
        if only and path.stem not in only:
            continue
        started = time.perf_counter()
        try:
            figures = importlib.import_module(f"bench.{path.stem}").run()
        except Exception as exc:  # one benchmark failing must not hide the others
            print(f"{path.stem}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr)
            failed.append(path.stem)
            continue
        for name, fig in figures.items():
            results[name] = fig
            print(f"{name:32} {fig['value']:>12.4g} {fig['unit']:10} target {fig['target']}")
        print(f"  ({path.stem}: {time.perf_counter() - started:.1f}s)", file=sys.stderr)
    out = HERE / "results.json"
    previous = json.loads(out.read_text()) if out.exists() and only else {}
    out.write_text(json.dumps({**previous, **results}, indent=2, sort_keys=True) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
