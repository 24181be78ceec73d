"""Batch scripts (trainer.slurm.batch): exact #SBATCH lines and the srun line from job specs, no Slurm needed.

The script is also checked by bash (`bash -n`) and, where installed, by shellcheck.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess

import pytest

from trainer.jobs.spec import validate
from trainer.slurm import batch
from trainer.slurm.batch import Site, decode, encode, key_of, render, time_limit

SITE8 = Site(bucket="gpufleet-dev-bucket", python="/opt/gpufleet/venv/bin/python", output_dir="/var/lib/gpufleet/out",
             partition="gpu", gpus=8, instance_type="p5.48xlarge")
SITE0 = Site(bucket="gpufleet-dev-bucket", python="/usr/bin/python3", output_dir="/srv/out")
NONCE = "0123abcd"


def job(**fields):
    raw = {"spec": 1, "job_id": "train-1", "kind": "trainer", "args": ["--steps", "10"], **fields}
    return validate(raw)


def sweep(count=3):
    return [job(job_id=f"sweep-a-{i}", args=["--lr", f"0.{i + 1}"],
                array={"id": "sweep-a", "nonce": NONCE, "index": i, "count": count}) for i in range(count)]


def sbatch(script: str) -> list[str]:
    return [ln[len("#SBATCH "):] for ln in script.splitlines() if ln.startswith("#SBATCH ")]


def srun_argv(script: str) -> list[str]:
    return shlex.split(script.splitlines()[-1])


def specs_of(script: str) -> list[dict]:
    """Every spec the script assigns (an array: one per index, in index order); the srun line passes $spec."""
    assert srun_argv(script)[-2:] == ["--spec", "$spec"]
    return [decode(m) for m in re.findall(r"^(?:  \d+\) )?spec=([A-Za-z0-9+/=]+)(?: ;;)?$", script, re.M)]


# --- a single job -----------------------------------------------------------------------------------------------

def test_single_trainer_job_lines():
    script = render([job(nodes=2)], SITE8, key="msg-42")
    assert script.startswith("#!/bin/bash\n")
    assert sbatch(script) == [
        "--job-name=gpufleet.train-1",
        "--comment=gpufleet:msg-42",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--requeue",
        "--open-mode=append",
        "--chdir=/var/lib/gpufleet/out/default",  # each team its own directory
        "--output=/var/lib/gpufleet/out/default/%x-%j.out",
        "--partition=gpu",
        "--exclusive",
        "--gres=gpu:8",
    ]


def test_all_gpus_when_gpus_per_node_is_none():
    lines = sbatch(render([job()], SITE8, key="m"))
    assert "--exclusive" in lines and "--gres=gpu:8" in lines


def test_two_gpus_of_an_eight_gpu_node_share_the_node():
    lines = sbatch(render([job(gpus_per_node=2)], SITE8, key="m"))
    assert "--gres=gpu:2" in lines
    assert "--exclusive" not in lines
    assert srun_argv(render([job(gpus_per_node=2)], SITE8, key="m"))[-4:-2] == ["--gpus", "2"]


def test_more_gpus_than_the_node_has_is_capped_at_the_node():
    assert "--gres=gpu:8" in sbatch(render([job(gpus_per_node=16)], SITE8, key="m"))


def test_zero_gpus_per_node_asks_no_gres():
    lines = sbatch(render([job(gpus_per_node=0)], SITE8, key="m"))
    assert not any(ln.startswith("--gres") for ln in lines) and "--exclusive" not in lines


def test_no_gres_on_a_site_without_gpus():
    script = render([job()], SITE0, key="m")
    lines = sbatch(script)
    assert not any(ln.startswith("--gres") for ln in lines)
    assert "--exclusive" in lines
    assert not any(ln.startswith("--partition") for ln in lines)
    assert srun_argv(script)[-4:-2] == ["--gpus", "0"]


def test_no_time_without_a_timeout():
    assert not any(ln.startswith("--time") for ln in sbatch(render([job()], SITE8, key="m")))


def test_timeout_becomes_time_limit():
    assert "--time=1-01:01:01" in sbatch(render([job(timeout=90061)], SITE8, key="m"))


@pytest.mark.parametrize("seconds,text", [(90061, "1-01:01:01"), (1, "0-00:00:01"), (59, "0-00:00:59"),
                                          (60, "0-00:01:00"), (3600, "0-01:00:00"), (86399, "0-23:59:59"),
                                          (86400, "1-00:00:00"), (10 * 86400 + 5, "10-00:00:05")])
def test_time_limit(seconds, text):
    assert time_limit(seconds) == text


def test_srun_line_runs_the_task_with_the_specs():
    j = job(nodes=2, timeout=600)
    script = render([j], SITE8, key="msg-42")
    assert script.endswith("\n")
    argv = srun_argv(script)
    assert argv[:5] == ["exec", "srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1", "--nodes=$SLURM_JOB_NUM_NODES"]
    assert argv[5:] == ["/opt/gpufleet/venv/bin/python", "-m", "trainer", "task", "--bucket",
                        "gpufleet-dev-bucket", "--gpus", "8", "--spec", "$spec"]
    assert specs_of(script) == [{"spec": j.to_dict(), "first_attempt": 1}]


def test_first_attempt_follows_the_attempt_history():
    j = job(attempts=[{"n": 1, "outcome": "failed", "exit_status": 1}, {"n": 2, "outcome": "preempted"}])
    assert specs_of(render([j], SITE8, key="m")) == [{"spec": j.to_dict(), "first_attempt": 3}]


def test_first_attempts_given():
    j = job()
    assert specs_of(render([j], SITE8, key="m", first_attempts=[5])) == [{"spec": j.to_dict(), "first_attempt": 5}]


def test_specs_round_trip_through_validate():
    j = job(nodes=2, gpus_per_node=4, env={"A": "1"}, timeout=60, retries={"on_error": 2, "on_exit_codes": [3]})
    (entry,) = specs_of(render([j], SITE8, key="m"))
    assert validate(entry["spec"]) == j


def test_encode_decode():
    entry = {"spec": {"job_id": "a b'\"$x"}, "first_attempt": 1}
    assert decode(encode(entry)) == entry
    assert set(encode(entry)) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


def test_no_job_is_an_error():
    with pytest.raises(ValueError, match="no job to render"):
        render([], SITE8, key="m")


# --- a sweep: one job array -------------------------------------------------------------------------------------

def test_sweep_is_one_array():
    jobs = sweep(3)
    script = render(jobs, SITE8, key=key_of(jobs, "msg-1"))
    assert sbatch(script) == [
        "--job-name=gpufleet.sweep-a",
        f"--comment=gpufleet:{NONCE}",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--requeue",
        "--open-mode=append",
        "--chdir=/var/lib/gpufleet/out/default",
        "--output=/var/lib/gpufleet/out/default/%x-%A_%a.out",
        "--partition=gpu",
        "--exclusive",
        "--gres=gpu:8",
        "--array=0-2",
    ]
    assert specs_of(script) == [{"spec": j.to_dict(), "first_attempt": 1} for j in jobs]


def test_sweep_first_attempts():
    jobs = sweep(3)
    assert [s["first_attempt"] for s in specs_of(render(jobs, SITE8, key=NONCE, first_attempts=[1, 2, 4]))] == [
        1, 2, 4]


def test_key_of_single_job_is_its_message_id_and_of_a_sweep_its_nonce():
    assert key_of([job()], "msg-7") == "msg-7"
    assert key_of(sweep(3), "msg-7") == NONCE


def test_single_job_has_no_array():
    script = render([job()], SITE8, key="m")
    assert not any(ln.startswith("--array") for ln in sbatch(script))
    assert "%A_%a" not in script


# --- the script as a shell script -------------------------------------------------------------------------------

SCRIPTS = {
    "single": lambda: render([job(nodes=2, timeout=3600)], SITE8, key="msg-42"),
    "shared-node": lambda: render([job(gpus_per_node=2)], SITE8, key="msg-43"),
    "no-gpus": lambda: render([job()], SITE0, key="msg-44"),
    "sweep": lambda: render(sweep(3), SITE8, key=NONCE),
    "odd-python-path": lambda: render([job()], Site("b", "/opt/my venv/bin/python", "/srv/out"), key="m"),
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_parses_in_bash(name, tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(SCRIPTS[name]())
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_passes_shellcheck(name, tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(SCRIPTS[name]())
    result = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_prefixes():
    assert (batch.COMMENT_PREFIX, batch.NAME_PREFIX) == ("gpufleet:", "gpufleet.")


# --- size -------------------------------------------------------------------------------------------------------



def test_a_sweep_as_large_as_the_schema_allows_keeps_every_argument_small():
    """Each index's spec is in the script's case statement; the srun line carries only $spec."""
    script = render(sweep(400), SITE8, key=NONCE)
    assert max(len(a) for a in srun_argv(script)) < 200 and len(specs_of(script)) == 400
    one = subprocess.run(["bash", "-s"], input=script.replace("exec srun", "echo"), env={"SLURM_ARRAY_TASK_ID": "399",
                         "SLURM_JOB_NUM_NODES": "1", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    assert decode(one.stdout.split()[-1]) == specs_of(script)[399]


def test_the_site_account_is_the_team_the_job_runs_under():
    lines = sbatch(render([job()], dataclasses.replace(SITE8, account="vision"), key="m"))
    assert lines[lines.index("--partition=gpu") + 1] == "--account=vision"
    assert "--output=/var/lib/gpufleet/out/vision/%x-%j.out" in lines  # its output in the team's own directory
    assert not any(ln.startswith("--account") for ln in sbatch(render([job()], SITE8, key="m")))


def test_the_task_and_the_credentials_daemon_read_the_jobs_team_from_its_script():
    from trainer.slurm.batch import team_of

    teamed = render([job()], dataclasses.replace(SITE8, account="nlp"), key="m")
    assert " --team nlp --spec " in teamed.splitlines()[-1] and team_of(teamed) == "nlp"
    plain = render([job()], SITE8, key="m")  # no account: the submitter's default, the default team's records
    assert "--team" not in plain and team_of(plain) == "default"
