"""Embedded Metric Format lines from train's metrics file."""
from __future__ import annotations

import io
import json

import pytest

from trainer.node import metric_names as names
from trainer.node.emf import Emitter, GpuSampler, MetricsTail, record, summarize


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


NODE = names.dimensions("gpufleet-dev-nodes", "i-0123456789abcdef0")


def test_record_layout_publishes_the_group_series_and_the_node_series():
    doc = record("gpufleet/dev", NODE, {names.STEP_TIME: 0.5}, timestamp_ms=1234)
    check_emf(doc)
    assert doc == {"_aws": {"Timestamp": 1234, "CloudWatchMetrics": [{
        "Namespace": "gpufleet/dev", "Dimensions": [["AutoScalingGroupName"], ["AutoScalingGroupName", "InstanceId"]],
        "Metrics": [{"Name": "StepTime", "Unit": "Seconds"}]}]},
        "AutoScalingGroupName": "gpufleet-dev-nodes", "InstanceId": "i-0123456789abcdef0", "StepTime": 0.5}


def test_dimensions_a_node_cannot_tell_are_left_out():
    assert names.dimensions("g", None) == {"AutoScalingGroupName": "g"}
    assert names.dimension_sets({"AutoScalingGroupName": "g"}) == [["AutoScalingGroupName"]]
    assert names.dimension_sets(names.dimensions(None, None)) == [[]]  # off any group: no dimensions
    doc = record("gpufleet/dev", {}, {names.STEPS: 1.0}, timestamp_ms=1)
    assert doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [[]]


def test_only_named_metrics_can_be_emitted():
    with pytest.raises(KeyError):
        record("gpufleet/dev", NODE, {"GPUUtilisation": 1.0})


def test_summarize_means():
    got = summarize(steps(1, 2) + [{**steps(3, 1)[0], "checkpoint_s": 2.5}, {"step": 3, "checkpoint_s": 4.0}])
    # samples/s 100, 200, 100; step time 0.5, 0.6, 0.5; data wait 0, 0.1, 0
    assert abs(got["Throughput"] - 400 / 3) < 1e-9
    assert abs(got["StepTime"] - 1.6 / 3) < 1e-9
    assert abs(got["DataWaitShare"] - 100 * 0.1 / 3) < 1e-9
    assert got["Steps"] == 3.0
    assert got["CheckpointSeconds"] == 4.0  # the slowest save of the interval
    assert summarize([]) == {}
    assert "MFU" not in got and "TokensPerSecond" not in got  # figures absent from the records stay absent


def test_summarize_tokens_mfu_and_peak_memory():
    records = [{**s, "tokens_per_s": 1000.0 * (i + 1), "tokens_per_s_per_gpu": 500.0 * (i + 1), "mfu": 0.4 + 0.1 * i,
                "peak_mem_gib": 10.0 + i} for i, s in enumerate(steps(1, 2))]
    got = summarize(records)
    assert got["TokensPerSecond"] == 1500.0 and got["TokensPerSecondPerGPU"] == 750.0
    assert abs(got["MFU"] - 45.0) < 1e-9
    assert {names.UNITS[k] for k in ("TokensPerSecond", "MFU")} == {"Count/Second", "Percent"}
    assert got["PeakGPUMemory"] == 11.0 * 1024 and names.UNITS["PeakGPUMemory"] == "Megabytes"


def test_tail_emits_one_line_per_interval_and_waits_for_whole_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    out = io.StringIO()
    tail = MetricsTail(path, Emitter("gpufleet/dev", out, NODE))
    tail.flush()  # no file yet: nothing to say
    assert out.getvalue() == ""
    lines = [json.dumps(s) for s in steps(1, 3)]
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])  # third line half-written
    tail.flush()
    with path.open("a") as f:
        f.write(lines[2][10:] + "\n")
    tail.close()
    docs = [json.loads(ln) for ln in out.getvalue().splitlines()]
    for doc in docs:
        check_emf(doc)
        assert doc["InstanceId"] == NODE["InstanceId"] and "GPUUtilization" not in doc
    assert [d["Steps"] for d in docs] == [2, 1]
    assert docs[0]["Throughput"] == 150.0
    assert tail.last_step == 3


def test_gpu_sampler_measures_idle_and_busy_gpus_alike():
    out = io.StringIO()
    readings = iter([0.0, 97.0])
    sampler = GpuSampler(Emitter("gpufleet/dev", out, NODE), gpu=lambda: next(readings))
    sampler.flush()
    sampler.flush()
    docs = [json.loads(ln) for ln in out.getvalue().splitlines()]
    assert [d["GPUUtilization"] for d in docs] == [0.0, 97.0]  # an idle GPU is a measurement, not silence
    for doc in docs:
        check_emf(doc)
        assert doc["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": "GPUUtilization", "Unit": "Percent"}]


def test_no_gpu_no_line():
    out = io.StringIO()
    GpuSampler(Emitter("gpufleet/dev", out), gpu=lambda: None).flush()
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
    MetricsTail(path, Emitter("gpufleet/dev", out, NODE)).close()
    (doc,) = [json.loads(ln) for ln in out.getvalue().splitlines()]
    check_emf(doc)
    assert doc["CheckpointSeconds"] == max(saved.values()) and doc["Steps"] == 5
    assert {"Name": "CheckpointSeconds", "Unit": "Seconds"} in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]


def test_metric_names_is_a_pure_module_the_stack_can_import():
    """infra.metrics imports it in the Pulumi program: no torch, no cloud SDK, nothing of infra."""
    import subprocess
    import sys

    probe = ("import sys, trainer.node.metric_names; "
             "print(sorted(m for m in ('torch', 'boto3', 'botocore', 'azure', 'infra') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
