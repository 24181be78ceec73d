"""`make bench`: run every bench/bench_*.py module, print one line per figure, write bench/results.json.

Each module exposes `run() -> dict[name, {"value": float, "unit": str, "target": str}]`; ratios are
measured within one run so that the machine's speed cancels out. A figure that misses its target is
marked MISSED; the exit status is 1 only when a benchmark itself failed.
"""
from __future__ import annotations

import importlib
import json
import operator
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

_COMPARE = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq,
            "=": operator.eq, "≤": operator.le, "≥": operator.ge}
# An optional comparison, a number, then the end or a note after a space ("< 50 (Azurite)", "0 when ...").
_TARGET = re.compile(r"\s*(<=|>=|==|=|<|>|≤|≥)?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?=\s|$)")


def parse_target(text: str) -> tuple[str, float] | None:
    """``"<= 2.0"`` -> ``("<=", 2.0)``; a bare number means equal; ``"info"``, ``""`` or prose: no target."""
    m = _TARGET.match(text or "")
    if m is None:
        return None
    op = m.group(1) or "=="
    return ("<=" if op == "≤" else ">=" if op == "≥" else "==" if op == "=" else op), float(m.group(2))


def missed(value: float, target: str) -> bool:
    """Whether ``value`` misses ``target`` (never for a figure without one)."""
    parsed = parse_target(target)
    return parsed is not None and not _COMPARE[parsed[0]](value, parsed[1])


def line(name: str, fig: dict) -> str:
    mark = "  MISSED" if missed(fig["value"], fig["target"]) else ""
    return f"{name:32} {fig['value']:>12.4g} {fig['unit']:10} target {fig['target'] or '-'}{mark}"


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
            print(line(name, fig))
        print(f"  ({path.stem}: {time.perf_counter() - started:.1f}s)", file=sys.stderr)
    out = HERE / "results.json"
    previous = json.loads(out.read_text()) if out.exists() and only else {}
    out.write_text(json.dumps({**previous, **results}, indent=2, sort_keys=True) + "\n")
    misses = sorted(n for n, f in results.items() if missed(f["value"], f["target"]))
    print(f"{len(results)} figures, {len(misses)} missed their target{': ' + ', '.join(misses) if misses else ''}"
          f"{'; failed: ' + ', '.join(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
