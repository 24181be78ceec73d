"""Embedded Metric Format lines from train's metrics file."""
from __future__ import annotations

import io
import json

from trainer.node.emf import Emitter, MetricsTail, record, summarize


def steps(first: int, n: int) -> list[dict]:
    return [{"step": first + i, "loss": 1.0, "step_time_s": 0.5 + 0.1 * i, "samples_per_s": 100.0 * (i + 1),
             "data_wait_frac": 0.1 * i} for i in range(n)]


def check_emf(doc: dict) -> None:
    """The structural rules CloudWatch applies to an EMF document."""
    meta = doc["_aws"]
    assert isinstance(meta["Timestamp"], int)
    for directive in meta["CloudWatchMetrics"]:
        for dims in directive["Dimensions"]:
            assert all(isinstance(doc[d], str) for d in dims)
        for m in directive["Metrics"]:
            assert isinstance(doc[m["Name"]], (int, float))


def test_record_layout():
    doc = record("gpufleet/dev", {"JobId": "j1"}, {"StepTime": (0.5, "Seconds")}, timestamp_ms=1234)
    check_emf(doc)
    assert doc == {"_aws": {"Timestamp": 1234, "CloudWatchMetrics": [{
        "Namespace": "gpufleet/dev", "Dimensions": [["JobId"]],
        "Metrics": [{"Name": "StepTime", "Unit": "Seconds"}]}]}, "JobId": "j1", "StepTime": 0.5}


def test_summarize_means():
    got = summarize(steps(1, 2) + [{**steps(3, 1)[0], "checkpoint_s": 2.5}, {"step": 3, "checkpoint_s": 4.0}])
    # samples/s 100, 200, 100; step time 0.5, 0.6, 0.5; data wait 0, 0.1, 0
    assert abs(got["Throughput"][0] - 400 / 3) < 1e-9 and got["Throughput"][1] == "Count/Second"
    assert abs(got["StepTime"][0] - 1.6 / 3) < 1e-9
    assert abs(got["DataWaitShare"][0] - 100 * 0.1 / 3) < 1e-9
    assert got["Steps"] == (3.0, "Count")
    assert got["CheckpointSeconds"] == (4.0, "Seconds")  # the slowest save of the interval
    assert summarize([]) == {}


def test_tail_emits_one_line_per_interval_and_waits_for_whole_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    out = io.StringIO()
    tail = MetricsTail(path, Emitter("gpufleet/dev", out, {"JobId": "j1"}), gpu=lambda: 87.5)
    tail.flush()  # no file yet: GPU utilisation only
    lines = [json.dumps(s) for s in steps(1, 3)]
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])  # third line half-written
    tail.flush()
    with path.open("a") as f:
        f.write(lines[2][10:] + "\n")
    tail.close()
    docs = [json.loads(ln) for ln in out.getvalue().splitlines()]
    for doc in docs:
        check_emf(doc)
        assert doc["JobId"] == "j1" and doc["GPUUtilization"] == 87.5
    assert "Steps" not in docs[0]
    assert [d["Steps"] for d in docs[1:]] == [2, 1]
    assert docs[1]["Throughput"] == 150.0
    assert tail.last_step == 3


def test_no_gpu_no_steps_no_line(tmp_path):
    out = io.StringIO()
    MetricsTail(tmp_path / "none.jsonl", Emitter("gpufleet/dev", out), gpu=lambda: None).flush()
    assert out.getvalue() == ""


def test_train_records_checkpoint_seconds_and_the_emf_line_carries_them(tmp_path):
    from trainer.__main__ import main

    path = tmp_path / "metrics.jsonl"
    assert main(["train", "--model", "gpt-tiny", "--batch-size", "2", "--steps", "5", "--checkpoint-every", "2",
                 "--checkpoint-uri", str(tmp_path / "ck"), "--metrics-file", str(path)]) == 0
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5]  # still one record per step
    saved = {r["step"]: r["checkpoint_s"] for r in lines if "checkpoint_s" in r}
    assert list(saved) == [2, 4, 5] and all(s > 0 for s in saved.values())  # periodic saves and the final one
    out = io.StringIO()
    MetricsTail(path, Emitter("gpufleet/dev", out, {"JobId": "j1"}), gpu=lambda: None).close()
    (doc,) = [json.loads(ln) for ln in out.getvalue().splitlines()]
    check_emf(doc)
    assert doc["CheckpointSeconds"] == max(saved.values()) and doc["Steps"] == 5
    assert {"Name": "CheckpointSeconds", "Unit": "Seconds"} in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
