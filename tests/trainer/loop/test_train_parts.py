"""Loop parts: LR schedule, precision plan, built-in data, user factories, mixed precision, profiler."""
from __future__ import annotations

import io
import json
import math
import sysconfig

import pytest
import torch

from tests.trainer.trainer_hooks import one_torch_thread  # noqa: F401 (autouse fixture)
from trainer.__main__ import main
from trainer.loop.checkpoint import Checkpointer, from_bytes
from trainer.loop.config import TrainConfig
from trainer.loop.data import build_dataset, build_model, default_workers, stdlib_sources
from trainer.loop.metrics import MetricsFile, Progress
from trainer.loop.storage import LocalStore
from trainer.loop.optim import lr_factor
from trainer.loop.train import native_bf16, precision_plan


def test_lr_warms_up_linearly_then_decays_by_cosine_to_a_tenth():
    factors = [lr_factor(s, warmup=4, total=14) for s in range(14)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0
    assert factors[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a > b for a, b in zip(factors[4:], factors[5:]))
    assert lr_factor(14, 4, 14) == pytest.approx(0.1) and lr_factor(99, 4, 14) == pytest.approx(0.1)
    assert lr_factor(0, 0, 10) == 1.0


@pytest.mark.parametrize("precision,device,bf16,expected", [
    ("fp32", "cuda", True, (None, False)),
    ("bf16", "cpu", False, (torch.bfloat16, False)),
    ("bf16", "cuda", True, (torch.bfloat16, False)),   # Ampere and newer
    ("bf16", "cuda", False, (torch.float16, True)),    # V100, T4: fp16 with a GradScaler
    ("fp16", "cuda", True, (torch.float16, True)),
    ("fp16", "cpu", False, (torch.float16, True)),
])
def test_precision_plan(precision, device, bf16, expected):
    assert precision_plan(precision, device, bf16) == expected


def test_default_workers():
    assert default_workers(torch.device("cpu")) == 0
    assert 0 <= default_workers(torch.device("cuda", 0)) <= 4


def test_text_corpus_is_the_standard_library():
    data = stdlib_sources(200_000)
    assert len(data) == 200_000
    assert sysconfig.get_paths()["stdlib"]
    assert b"def " in data and b"import " in data


def test_builtin_datasets_fit_the_model():
    model = build_model(TrainConfig(model="gpt-tiny"))
    for name in ("text", "synthetic"):
        x, y = build_dataset(TrainConfig(dataset=name), model)[5]
        assert x.shape == y.shape == (model.block_size,) and x.dtype == torch.int64
        assert torch.equal(x[1:], y[:-1])  # y is x shifted by one byte


def test_gpt_learns_python_source(tmp_path):
    metrics = tmp_path / "m.jsonl"
    assert main(["train", "--model", "gpt-tiny", "--steps", "40", "--batch-size", "16", "--lr", "3e-3",
                 "--warmup-steps", "5", "--checkpoint-uri", str(tmp_path / "ck"), "--metrics-file", str(metrics)]) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert records[0]["loss"] == pytest.approx(math.log(256), rel=0.05)  # uniform over bytes at first
    assert records[-1]["loss"] < 0.75 * records[0]["loss"]
    assert set(records[0]) >= {"step", "loss", "step_time_s", "samples_per_s", "data_wait_frac", "lr"}
    assert all(0 <= r["data_wait_frac"] <= 1 and r["samples_per_s"] > 0 for r in records)


def test_user_model_and_dataset_factories(tmp_path):
    metrics = tmp_path / "m.jsonl"
    assert main(["train", "--model", "tests.trainer.trainer_hooks:regression_model",
                 "--dataset", "tests.trainer.trainer_hooks:regression_data", "--steps", "60", "--batch-size", "32",
                 "--lr", "0.2", "--warmup-steps", "0", "--clip-grad", "0", "--checkpoint-uri", str(tmp_path / "ck"),
                 "--metrics-file", str(metrics)]) == 0
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    assert losses[-1] < 0.2 * losses[0]
    _, parts = Checkpointer(LocalStore(tmp_path / "ck"), 3).load_latest()
    assert set(from_bytes(parts["model.pt"])) == {"linear.weight", "linear.bias"}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_cpu(tmp_path, precision):
    metrics = tmp_path / "m.jsonl"
    assert main(["train", "--model", "gpt-tiny", "--steps", "2", "--batch-size", "4", "--precision", precision,
                 "--checkpoint-uri", str(tmp_path / "ck"), "--metrics-file", str(metrics)]) == 0
    assert all(math.isfinite(json.loads(line)["loss"]) for line in metrics.read_text().splitlines())
    _, parts = Checkpointer(LocalStore(tmp_path / "ck"), 3).load_latest()
    scaler = from_bytes(parts["optim.pt"])["scaler"]
    assert ("scale" in scaler) == (precision == "fp16")  # the GradScaler's state travels with the checkpoint


def test_profile_steps_writes_a_trace(tmp_path):
    assert main(["train", "--model", "gpt-tiny", "--steps", "4", "--batch-size", "4", "--profile-steps", "2",
                 "--profile-dir", str(tmp_path / "prof"), "--checkpoint-uri", str(tmp_path / "ck")]) == 0
    trace = json.loads((tmp_path / "prof" / "trace-rank0.json").read_text())
    steps = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#1", "ProfilerStep#2"}  # step 0 is the warmup


class Terminal(io.StringIO):
    def isatty(self):
        return True


def record(step):
    return {"step": step, "loss": 2.5, "lr": 1e-3, "step_time_s": 0.05, "samples_per_s": 640.0}


def test_progress_plain_lines_in_logs():
    out = io.StringIO()
    progress = Progress(total=25, every=10, stream=out)
    for step in range(1, 26):
        progress.update(record(step))
    lines = out.getvalue().splitlines()
    assert lines == [f"step {s}/25 loss 2.5000 lr 1.00e-03 50 ms/step 640 samples/s" for s in (10, 20, 25)]


def test_progress_bar_on_a_terminal():
    out = Terminal()
    progress = Progress(total=4, every=10, stream=out)
    for step in range(1, 5):
        progress.update(record(step))
    progress.close()
    text = out.getvalue()
    assert text.startswith("\r[") and "\n" not in text[:-1]  # redrawn in place
    assert "[##############################] step 4/4" in text and text.endswith("\n")


def test_metrics_file_lines_are_visible_at_once_and_appended(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    first = MetricsFile(str(path))
    first.write({"step": 1})
    assert path.read_text() == '{"step": 1}\n'  # a follower (the task's EMF tail) sees each step as it ends
    first.close()
    resumed = MetricsFile(str(path))
    resumed.write({"step": 2})
    resumed.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 1}, {"step": 2}]


def test_stop_notice_survives_a_second_signal_at_any_point_of_the_first():
    """A signal handler runs between any two bytecodes of the main thread, also inside another handler:
    set() interrupted at each of its lines by a nested set() must finish (a lock there deadlocked)."""
    import sys
    import threading

    from trainer.loop.stop import StopNotice

    lines = set()

    def probe():
        """Collect the lines of StopNotice.set, then interrupt each one in turn with a nested set()."""
        def trace(frame, event, arg):
            if frame.f_code is StopNotice.set.__code__ and event == "line":
                lines.add(frame.f_lineno)
            return trace
        sys.settrace(trace)
        StopNotice().set("first")
        sys.settrace(None)
        for line in sorted(lines):
            notice, nested = StopNotice(), []

            def interrupt(frame, event, arg, line=line, notice=notice, nested=nested):
                if frame.f_code is StopNotice.set.__code__ and event == "line" and frame.f_lineno == line \
                        and not nested:
                    nested.append(line)
                    notice.set("second")
                return interrupt
            sys.settrace(interrupt)
            notice.set("first")
            sys.settrace(None)
            assert notice.is_set() and notice.reason in ("first", "second")
            done.append(line)

    done: list[int] = []
    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), f"set() deadlocked when interrupted at line {sorted(lines - set(done))}"
    assert done and set(done) == lines


def test_emulated_bf16_is_not_bf16_support(monkeypatch):
    """A V100 (Tencent GN10Xp) answers torch's default bf16 check with yes, by emulation; train must use fp16."""
    seen = []

    def is_bf16_supported(including_emulation=True):  # torch's answers on a Volta GPU
        seen.append(including_emulation)
        return including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert native_bf16(torch.device("cuda", 0)) is False and seen == [False]
    assert native_bf16(torch.device("cpu")) is False
    assert precision_plan("bf16", "cuda", native_bf16(torch.device("cuda", 0))) == (torch.float16, True)
