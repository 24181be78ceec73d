"""`python -m trainer train` input handling: config file + flags, and one line + exit 2 for bad input."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.__main__ import main
from trainer.loop.config import FIELDS, TrainConfig, parse_args

ROOT = Path(__file__).resolve().parents[3]


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.err
    return lines[0]


@pytest.mark.parametrize("argv,expected", [
    (["--steps", "0"], "--steps: '0' is not allowed; expected an integer >= 1"),
    (["--steps", "ten"], "--steps: 'ten' is not allowed; expected an integer >= 1"),
    (["--precision", "fp8"], "--precision: 'fp8' is not allowed; expected one of fp32, bf16, fp16"),
    (["--lr", "-1"], "--lr: '-1' is not allowed; expected a number > 0.0"),
    (["--dropout", "1"], "--dropout: '1' is not allowed; expected a number >= 0.0 and < 1.0"),
    (["--grad-accum", "1.5"], "--grad-accum: '1.5' is not allowed; expected an integer >= 1"),
    (["--frobnicate", "3"], "unrecognized arguments: --frobnicate 3"),
    (["--steps"], "argument --steps: expected one argument"),
])
def test_bad_flags(capsys, argv, expected):
    assert one_line_error(capsys, ["train", *argv]) == f"error: {expected}"


def test_bad_values_found_after_parsing(capsys, tmp_path):
    ck = ["--checkpoint-uri", str(tmp_path / "ck")]
    line = one_line_error(capsys, ["train", "--model", "gpt-huge", *ck])
    assert line == ("error: --model: 'gpt-huge' is not allowed; "
                    "expected one of gpt-tiny, gpt-small, gpt-base, gpt-350m, gpt-1.3b or module:factory")
    line = one_line_error(capsys, ["train", "--dataset", "imagenet", *ck])
    assert line == ("error: --dataset: 'imagenet' is not allowed; expected text, synthetic, module:factory, "
                    "s3://bucket/prefix or a directory of shards (a path with '/')")
    line = one_line_error(capsys, ["train", "--dataset", "no_such_module_xyz:make", *ck])
    assert line.startswith("error: --dataset: cannot load 'no_such_module_xyz:make': ModuleNotFoundError")
    line = one_line_error(capsys, ["train", "--checkpoint-uri", "gs://bucket/run"])
    assert "unsupported scheme 'gs'" in line and "s3://bucket/prefix" in line
    line = one_line_error(capsys, ["train", "--model", "gpt-tiny", "--batch-size", "9000000", *ck])
    assert line.startswith("error: --batch-size: a global batch of 9000000 samples") and "exceeds" in line


@pytest.mark.parametrize("content,expected", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object of flag values, got list"),
    ('{"stepz": 3}', "unknown key 'stepz'; allowed: steps, batch_size"),
    ('{"steps": "many"}', "key 'steps': 'many' is not allowed; expected an integer >= 1"),
    ('{"pin-memory": "yes"}', "key 'pin-memory': 'yes' is not allowed; expected true or false (or null)"),
    ('{"batch_size": true}', "key 'batch_size': True is not allowed; expected an integer >= 1"),
])
def test_bad_config_file(capsys, tmp_path, content, expected):
    path = tmp_path / "train.json"
    path.write_text(content)
    line = one_line_error(capsys, ["train", "--config", str(path)])
    assert line.startswith(f"error: --config {path}: ") and expected in line


def test_missing_config_file(capsys, tmp_path):
    line = one_line_error(capsys, ["train", "--config", str(tmp_path / "nope.json")])
    assert line == f"error: --config {tmp_path / 'nope.json'}: cannot read: No such file or directory"


def test_unknown_command(capsys):
    line = one_line_error(capsys, ["fly"])
    assert line == ("error: unknown command 'fly'; expected one of train, convert, preflight, submit, shards, "
                    "controller, nodes, task, setup, credentials, container, dns")


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"steps": 50, "batch-size": 8, "precision": "bf16", "pin_memory": False,
                                "metrics_file": None}))
    cfg = parse_args(["--config", str(path), "--steps", "60", "--no-persistent-workers"])
    assert cfg == dataclasses.replace(TrainConfig(), steps=60, batch_size=8, precision="bf16", pin_memory=False,
                                      persistent_workers=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.steps = 1


def test_every_config_field_has_a_flag():
    assert list(FIELDS) == [f.name for f in dataclasses.fields(TrainConfig)]


def test_the_process_prints_one_line_and_exits_2():
    proc = subprocess.run([sys.executable, "-m", "trainer", "train", "--precision", "fp64"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == "error: --precision: 'fp64' is not allowed; expected one of fp32, bf16, fp16\n"
    assert proc.stdout == ""


def test_no_command(capsys):
    assert one_line_error(capsys, []).startswith("error: no command; usage: python -m trainer {train,")
