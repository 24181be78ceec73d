"""bench/run.py: targets parsed from their text, misses marked, exit 1 only for a failing benchmark."""
from __future__ import annotations

import json
import sys
import types

import pytest

from bench import run


@pytest.mark.parametrize("text, parsed", [
    ("<= 2.0", ("<=", 2.0)),
    (">= 100", (">=", 100.0)),
    ("< 5", ("<", 5.0)),
    ("> 5 (Azurite)", (">", 5.0)),
    ("<= 5 (process start to GetPluginInfo)", ("<=", 5.0)),
    (">= 100 (71 prod resources, 20 rounds)", (">=", 100.0)),
    ("0", ("==", 0.0)),
    ("0 when the notice comes >= one checkpoint-time before the end", ("==", 0.0)),
    ("== 1", ("==", 1.0)),
    ("≤ 1.03", ("<=", 1.03)),
    ("<0.25", ("<", 0.25)),
    ("< 1e3", ("<", 1000.0)),
    ("info", None),
    ("info (SDK import cost alone)", None),
    ("", None),
    ("baseline: checkpoint every 10 steps, no notice", None),
    ("2x faster", None),
])
def test_parse_target(text, parsed):
    assert run.parse_target(text) == parsed


@pytest.mark.parametrize("value, target, missed", [
    (6.8, "<= 2.0", True), (2.0, "<= 2.0", False), (5.0, "< 5", True), (4.99, "< 5", False),
    (99.9, ">= 100", True), (334.0, ">= 100 (71 prod resources)", False), (6.0, "> 5 (Azurite)", False),
    (0.0, "0 when the notice comes early", False), (1.0, "0", True), (1e9, "info", False), (1e9, "", False),
])
def test_missed(value, target, missed):
    assert run.missed(value, target) is missed
    assert run.line("fig", {"value": value, "unit": "s", "target": target}).endswith("MISSED") is missed


def test_misses_are_marked_and_only_a_failing_benchmark_fails_the_run(tmp_path, monkeypatch, capsys):
    figures = {"fast_s": {"value": 1.0, "unit": "s", "target": "<= 2"},
               "slow_s": {"value": 3.0, "unit": "s", "target": "<= 2"},
               "size": {"value": 7.0, "unit": "MiB", "target": "info"}}

    def broken():
        raise RuntimeError("emulator did not start")

    monkeypatch.setattr(run, "HERE", tmp_path)
    for name, fn in {"bench_a": lambda: figures, "bench_b": broken}.items():
        (tmp_path / f"{name}.py").write_text("")
        monkeypatch.setitem(sys.modules, f"bench.{name}", types.SimpleNamespace(run=fn))

    assert run.main(["bench_a"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[:3]] == ["fast_s", "slow_s", "size"]
    assert [line.endswith("MISSED") for line in out[:3]] == [False, True, False]
    assert out[3] == "3 figures, 1 missed their target: slow_s"
    assert json.loads((tmp_path / "results.json").read_text()) == figures

    assert run.main([]) == 1
    captured = capsys.readouterr()
    assert "bench_b: FAILED RuntimeError: emulator did not start" in captured.err
    assert captured.out.splitlines()[-1] == "3 figures, 1 missed their target: slow_s; failed: bench_b"
