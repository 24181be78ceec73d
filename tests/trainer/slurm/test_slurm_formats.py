"""What Slurm's commands print, read alike from the box's Slurm (Debian's 22.05) and the images' (26.05).

The 22.05 samples were printed on this machine (squeue --json, sinfo, scontrol show node -o of Debian's
slurm-wlm 22.05.8, the box's cluster), trimmed to the fields the client reads. The 23.11+ samples are the same
jobs as Slurm 23.11 and later print them (data_parser v0.0.40 to v0.0.45), written from SchedMD's own sources
(github.com/SchedMD/slurm at tags slurm-23-11-0-1 and slurm-26-05-3-1): src/plugins/data_parser/v0.0.4x/parsers.c
(JOB_INFO: job_state a JOB_STATE flag array, array_job_id/array_task_id UINT32_NO_VAL, submit/start/end_time
TIMESTAMP_NO_VAL, exit_code PROCESS_EXIT_CODE; DUMP_FUNC(UINT32_NO_VAL), DUMP_FUNC(PROCESS_EXIT_CODE),
DUMP_FUNC(SIGNAL)), doc/html/rest_api.shtml (v0.0.45_job_info, v0.0.45_uint32_no_val_struct,
v0.0.45_process_exit_code_verbose) and doc/html/openapi_release_notes/slurm-23.11.html ("Swap job exit codes to
verbose output"). The one-word state 22.05 printed is Slurm's job_state_string() (src/common/slurm_protocol_defs.c).
The 26.05 node line's fields after Reason are those src/api/node_info.c prints at that tag.
"""
from __future__ import annotations

import json
import os
from datetime import datetime

import pytest

from trainer.slurm import client
from trainer.slurm.client import SlurmNode

KEYS = ("job_id", "array_job_id", "array_task_id", "array_task_string", "name", "comment", "job_state",
        "state_reason", "state_description", "exit_code", "restart_cnt", "nodes", "user_name", "partition",
        "submit_time", "start_time", "end_time")


def n(number: int | None = None, infinite: bool = False) -> dict:
    """An integer as 23.11+ prints it."""
    return {"set": number is not None, "infinite": infinite, "number": 0 if number is None else number}


def code(status: str, return_code: int | None = None, signal: int | None = None, name: str = "") -> dict:
    return {"status": [status], "return_code": n(return_code), "signal": {"id": n(signal), "name": name}}


def old(job_id, array_job_id, array_task_id, tasks, state, reason, exit_code, restarts, nodes, comment, times):
    return dict(zip(KEYS, (job_id, array_job_id, array_task_id, tasks, "wrap", comment, state, reason, "", exit_code,
                           restarts, nodes, "root", "gpu", *times)))


# (22.05 as printed here, the same job as 23.11+ prints it)
SAMPLES = {
    "completed": (
        old(1, 0, None, "", "COMPLETED", "None", 0, 0, "gpu-1", "", (1796216898, 1796216924, 1796216924)),
        {"job_state": ["COMPLETED"], "exit_code": code("SUCCESS", 0)}),
    "failed with exit 3": (
        old(2, 0, None, "", "FAILED", "NonZeroExitCode", 768, 0, "gpu-2", "", (1796216898, 1796216924, 1796216924)),
        {"job_state": ["FAILED"], "exit_code": code("ERROR", 3)}),
    "killed by signal 9": (
        old(3, 0, None, "", "FAILED", "JobLaunchFailure", 9, 0, "gpu-1", "", (1796216898, 1796216924, 1796216924)),
        {"job_state": ["FAILED", "LAUNCH_FAILED"], "exit_code": code("SIGNALED", signal=9, name="KILL")}),
    "running": (
        old(4, 0, None, "", "RUNNING", "None", 0, 0, "gpu-2", "gpufleet:key1", (1796216899, 1796216924, 1827752924)),
        {"job_state": ["RUNNING"], "exit_code": code("SUCCESS", 0)}),
    "cancelled": (
        old(5, 0, None, "", "CANCELLED", "None", 15, 0, "gpu-1", "", (1796216899, 1796216926, 1796216931)),
        {"job_state": ["CANCELLED"], "exit_code": code("SIGNALED", signal=15, name="TERM")}),
    "array element running": (
        old(7, 6, 0, "", "RUNNING", "None", 0, 0, "gpu-1", "", (1796216899, 1796216932, 1827752932)),
        {"job_state": ["RUNNING"], "exit_code": code("SUCCESS", 0)}),
    "array elements pending together": (
        old(6, 6, None, "1-2", "PENDING", "Resources", 0, 0, "", "", (1796216899, 1827752932, 6122720168)),
        {"job_state": ["PENDING"], "exit_code": code("SUCCESS", 0)}),
    "requeued, waiting": (
        old(4, 0, None, "", "PENDING", "BeginTime", 0, 1, "", "gpufleet:key1", (1796216935, 1796216946, 6091184182)),
        {"job_state": ["PENDING"], "exit_code": code("SUCCESS", 0)}),
    "last array element pending alone": (
        old(6, 6, 2, "", "PENDING", "Resources", 0, 0, "", "", (1796216899, 0, 0)),
        {"job_state": ["PENDING"], "exit_code": code("SUCCESS", 0), "start_time": n(), "end_time": n()}),
}


def new_shape(sample: dict, changes: dict) -> dict:
    """The 22.05 sample as 23.11+ prints it: integers that may be unset as objects, then the sample's changes."""
    out = dict(sample)
    for key in ("array_job_id", "array_task_id", "submit_time", "start_time", "end_time"):
        out[key] = n(sample[key])
    return {**out, **changes}


@pytest.mark.parametrize("name", SAMPLES)
def test_both_shapes_read_as_22_05_prints_them(name):
    sample, changes = SAMPLES[name]
    newer = new_shape(sample, changes)
    assert client.normalise_job(sample) == sample
    assert {k: client.normalise_job(newer)[k] for k in KEYS} == {**sample, **(
        {"start_time": None, "end_time": None} if name == "last array element pending alone" else {})}


@pytest.mark.parametrize("value, number", [
    (7, 7), (None, None), ({"set": True, "infinite": False, "number": 7}, 7), (n(), None), (n(infinite=True), None),
    ({"set": True, "infinite": True, "number": 0}, None), ("Infinity", None), (True, None),
])
def test_numbers(value, number):
    assert client.number(value) == number


@pytest.mark.parametrize("value, state", [
    ("PENDING", "PENDING"), (["PENDING"], "PENDING"), (["COMPLETED", "COMPLETING"], "COMPLETING"),
    (["RUNNING", "CONFIGURING", "POWER_UP_NODE"], "CONFIGURING"), (["PENDING", "REQUEUE_HOLD"], "REQUEUE_HOLD"),
    (["FAILED", "LAUNCH_FAILED"], "FAILED"), (["CANCELLED", "REQUEUED", "COMPLETING"], "COMPLETING"),
    (["NODE_FAIL", "REQUEUED"], "REQUEUED"), (["OUT_OF_MEMORY"], "OUT_OF_MEMORY"), ([], ""), (None, ""),
])
def test_a_state_list_reads_as_job_state_string_reads_its_bits(value, state):
    assert client.job_state(value) == state


@pytest.mark.parametrize("value, status", [
    (0, 0), (768, 768), (9, 9), (None, None),
    (code("SUCCESS", 0), 0), (code("ERROR", 75), 75 << 8), (code("SIGNALED", signal=15, name="TERM"), 15),
    (code("PENDING"), None), ({"status": ["INVALID"], "return_code": n(), "signal": {"id": n(), "name": ""}}, None),
])
def test_exit_codes_read_as_wait_statuses(value, status):
    assert client.exit_code(value) == status


@pytest.mark.parametrize("task_ids, count", [
    ("", 1), ("0-2", 3), ("1-2", 2), ("5", 1), ("1,3,5-7", 5), ("0-30:3", 11), ("0-9%2", 10), ("0-9999", 10000),
    ("2,4-6%3", 4),
])
def test_an_array_line_counts_its_elements(task_ids, count):
    assert client.array_size(task_ids) == count


def _stub(bin_dir, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.mark.parametrize("shape", ["22.05", "23.11+"])
def test_jobs_through_the_real_client_are_the_same_for_both_shapes(tmp_path, monkeypatch, shape):
    """squeue and scontrol stubs printing either shape: the same SlurmJobs, squeue asked for whole index lists."""
    docs = [s if shape == "22.05" else new_shape(s, c) for s, c in SAMPLES.values()]
    top = {"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "jobs": docs} if shape == "22.05" else {
        "jobs": docs, "last_backfill": n(1796216930), "last_update": n(1796216931), "meta": {}, "errors": [],
        "warnings": []}
    (tmp_path / "squeue.json").write_text(json.dumps(top))
    _stub(tmp_path, "squeue", f'echo "$SLURM_BITSTR_LEN $*" > {tmp_path}/asked\ncat {tmp_path}/squeue.json\n')
    _stub(tmp_path, "scontrol", 'echo "$3"\n')  # show hostnames NAME: one node each here
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    jobs = client.jobs()
    assert (tmp_path / "asked").read_text().split() == ["0", "--json", "--all", "--states=all"]
    got = [(j.id, j.array_job_id, j.array_task_id, j.state, j.reason, j.exit_code, j.restarts, j.nodes, j.comment,
            j.submit_time, j.tasks) for j in jobs]
    assert got == [
        ("1", None, None, "COMPLETED", "None", 0, 0, ("gpu-1",), "", 1796216898.0, 1),
        ("2", None, None, "FAILED", "NonZeroExitCode", 3, 0, ("gpu-2",), "", 1796216898.0, 1),
        ("3", None, None, "FAILED", "JobLaunchFailure", 137, 0, ("gpu-1",), "", 1796216898.0, 1),
        ("4", None, None, "RUNNING", "None", 0, 0, ("gpu-2",), "gpufleet:key1", 1796216899.0, 1),
        ("5", None, None, "CANCELLED", "None", 143, 0, ("gpu-1",), "", 1796216899.0, 1),
        ("6_0", 6, 0, "RUNNING", "None", 0, 0, ("gpu-1",), "", 1796216899.0, 1),
        ("6", 6, None, "PENDING", "Resources", 0, 0, (), "", 1796216899.0, 2),
        ("4", None, None, "PENDING", "BeginTime", 0, 1, (), "gpufleet:key1", 1796216935.0, 1),
        ("6_2", 6, 2, "PENDING", "Resources", 0, 0, (), "", 1796216899.0, 1),
    ]


# --- nodes: sinfo and scontrol show node -o ---------------------------------------------------------------------

STAMP = "2026-12-02T13:16:21"
SINFO_22_05 = """gpu-1|idle~|Unknown|none
gpu-2|down~|2026-12-02T13:16:21|resume failed: InsufficientInstanceCapacity: no p5.48xlarge capacity
gpu-3|down*|2026-12-02T13:20:02|Not responding
gpu-1|idle~|Unknown|none
"""
NODE_22_05 = (
    "NodeName=gpu-2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=6.25 "
    "AvailableFeatures=g6.xlarge,spot ActiveFeatures=g6.xlarge,spot Gres=(null) NodeAddr=gpu-2 NodeHostName=gpu-2 "
    "Port=44678 Version=22.05.8 OS=Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2048 AllocMem=0 "
    "FreeMem=17388 Sockets=1 Boards=1 State=DOWN+CLOUD+POWERED_DOWN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=gpu  BootTime=2026-12-02T13:08:19 SlurmdStartTime=2026-12-02T13:08:19 "
    "LastBusyTime=Unknown CfgTRES=cpu=1,mem=2G,billing=1 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=resume failed: InsufficientInstanceCapacity: "
    f"no p5.48xlarge capacity [root@{STAMP}] Comment=rack 7 slot 3\n")
NODE_26_05 = (
    "NodeName=gpu-2 Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUEfctv=192 CPUTot=192 CPULoad=0.00 "
    "AvailableFeatures=p5.48xlarge,efa,nvswitch ActiveFeatures=p5.48xlarge,efa,nvswitch Gres=gpu:8 NodeAddr=10.0.1.7 "
    "NodeHostName=gpu-2 Version=26.05.3 OS=Linux 6.8.0 RealMemory=2000000 AllocMem=0 FreeMem=N/A Sockets=2 Boards=1 "
    "State=DOWN+CLOUD+POWERED_DOWN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu "
    "BootTime=None SlurmdStartTime=None LastBusyTime=Unknown ResumeAfterTime=None CfgTRES=cpu=192,mem=2000000M "
    "AllocTRES= CurrentWatts=0 AveWatts=0 Reason=held after: resume failed: InsufficientInstanceCapacity : "
    f"ResumeTimeout reached [slurm@{STAMP}] InstanceId=i-0abc InstanceType=p5.48xlarge Topology=default:gpu-2\n")


def local(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_sinfo_nodes_with_their_reason_and_its_time():
    assert client.parse_nodes(SINFO_22_05) == [
        SlurmNode("gpu-1", "idle~", "", None),
        SlurmNode("gpu-2", "down~", "resume failed: InsufficientInstanceCapacity: no p5.48xlarge capacity",
                  local(STAMP)),
        SlurmNode("gpu-3", "down*", "Not responding", local("2026-12-02T13:20:02")),
    ]
    assert client.parse_nodes("big-1|down#|2026-12-02T12:28:08|resume failed: a|b: c\n")[0].reason == \
        "resume failed: a|b: c"  # the reason comes last: a "|" in it is its own


@pytest.mark.parametrize("line, reason, after", [
    (NODE_22_05, f"resume failed: InsufficientInstanceCapacity: no p5.48xlarge capacity [root@{STAMP}]",
     {"Comment": "rack 7 slot 3"}),
    (NODE_26_05, "held after: resume failed: InsufficientInstanceCapacity : ResumeTimeout reached "
     f"[slurm@{STAMP}]", {"InstanceId": "i-0abc", "InstanceType": "p5.48xlarge", "Topology": "default:gpu-2"}),
    ("NodeName=gpu-1 State=IDLE+CLOUD+POWERED_DOWN Partitions=gpu\n", None, {}),
])
def test_a_node_line_with_its_whole_reason_and_the_fields_after_it(line, reason, after):
    fields = client.parse_node_line(line)
    assert fields.get("Reason") == reason
    assert {k: fields[k] for k in after} == after
    assert fields["State"].startswith(("DOWN", "IDLE")) and "NodeName" in fields


def test_nodes_through_the_real_client_ask_for_iso_times(tmp_path, monkeypatch):
    _stub(tmp_path, "sinfo", f'echo "$SLURM_TIME_FORMAT $*" > {tmp_path}/asked\ncat <<EOF\n{SINFO_22_05}EOF\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")  # a user's own setting: not what the client reads
    assert [node.name for node in client.nodes()] == ["gpu-1", "gpu-2", "gpu-3"]
    assert (tmp_path / "asked").read_text().split() == ["standard", "-h", "-N", "-o", client.NODE_FORMAT]
