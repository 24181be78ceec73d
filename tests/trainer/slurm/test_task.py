"""One node's part of a job (trainer.slurm.task), run in this process as the batch script's srun runs it, with
Slurm's variables as a one-node job has them: the derivations (train's flags, torchrun's command, Slurm's
environment), then real jobs against moto server: a code bundle's environment and secrets (SSM on moto, Key Vault
on the fakes of tests/trainer/fake_azure_identity.py), a secret that cannot be read, a stop that comes before the
job's process exists, a command the OS refuses, the built-in trainer's progress and output in the bucket, the
node's metric dimensions; and containers on a real Docker daemon (tests/trainer/dockerd.py): the example stopped
and resumed with no step lost, a container that ignores the stop, an image pulled with the node's login.

The box (tests/infra/box) runs the same task under a real Slurm: a sweep, a 2-node job, cancels, retries, a spot
notice's requeue."""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

import boto3
import pytest

from infra.demo.imds import FakeImds
from tests.infra.test_jobs_cli import gpufleet
from tests.trainer.dockerd import EXAMPLE_IMAGE, dockerd, host_python_flags, sandbox_flags  # noqa: F401 (fixture)
from tests.trainer.fake_azure_identity import FakeAzureIdentity
from tests.trainer.fake_registry import FakeRegistry
from tests.trainer.gated import TRAIN, steps, wait_for
from tests.trainer.clouds.test_registry import azure_platform
from trainer import EXIT_PREEMPTED
from trainer.clouds.aws import Imds, NodePlatform
from trainer.errors import UsageError
from trainer.jobs import api, bundle, logs, records
from trainer.jobs.layout import team_base
from trainer.jobs.records import RecordStore
from trainer.jobs.spec import Job
from trainer.node import metric_names
from trainer.node.platform import Platform
from trainer.node.registry import RegistryLogin, image_host
from trainer.slurm import task as task_module
from trainer.slurm.task import Task, open_emitter, slurm_facts, trainer_args, trainer_command

SLURM_ENV = {"SLURM_JOB_ID": "101", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_RESTART_COUNT": "0",
             "SLURM_JOB_NODELIST": "gpu-1", "SLURMD_NODENAME": "gpu-1"}
STEPS = 30


def one_node(restarts: int = 0) -> dict:
    return slurm_facts({**SLURM_ENV, "SLURM_RESTART_COUNT": str(restarts)})


def make_task(job: Job, tmp_path, attempt: int = 1, **kw) -> Task:
    kw.setdefault("platform", Platform())
    return Task(job, attempt, one_node(attempt - 1), "ckpt", 0, tmp_path / "node", **kw)


def job_dir(tmp_path, job_id: str):
    return tmp_path / "node" / "jobs" / job_id


# --- derivations -----------------------------------------------------------------------------------------------

def test_train_flags_default_to_the_jobs_own_prefix_and_metrics_file():
    args, uri, metrics = trainer_args(Job("j1", args=("--steps", "5")), "s3://ckpt/jobs/j1/", "/w/m.jsonl")
    assert args == ["--steps", "5", "--checkpoint-uri", "s3://ckpt/jobs/j1/", "--metrics-file", "/w/m.jsonl"]
    assert (uri, metrics) == ("s3://ckpt/jobs/j1/", "/w/m.jsonl")
    own = ["--checkpoint-uri", "s3://mine/x/", "--metrics-file", "/m.jsonl"]
    assert trainer_args(Job("j1", args=tuple(own)), "s3://ckpt/jobs/j1/", "/w/m.jsonl") == (own, "s3://mine/x/",
                                                                                            "/m.jsonl")


def test_the_trainer_is_one_process_without_gpus_and_torchrun_with_slurms_ranks_otherwise():
    assert trainer_command(["--steps", "1"], 0, 1, 0, "127.0.0.1:20101", "101-0")[1:] == [
        "-m", "trainer", "train", "--steps", "1"]
    assert trainer_command(["--steps", "1"], 8, 1, 0, "127.0.0.1:20101", "101-0")[1:] == [
        "-m", "trainer.node.launch", "--standalone", "--nproc-per-node", "8", "-m", "trainer", "train", "--steps", "1"]
    assert trainer_command(["--steps", "1"], 0, 2, 1, "10.0.0.7:20101", "101-2")[1:] == [
        "-m", "trainer.node.launch", "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static",
        "--rdzv-endpoint", "10.0.0.7:20101", "--rdzv-id", "101-2", "--rdzv-conf", "timeout=600",
        "--nproc-per-node", "1", "-m", "trainer", "train", "--steps", "1"]


def test_slurms_environment_and_a_task_outside_slurm_is_one_line():
    facts = slurm_facts({**SLURM_ENV, "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "3",
                         "SLURM_RESTART_COUNT": "2"})
    assert facts == {"job_id": 100, "own_id": 101, "index": 3, "nnodes": 1, "node_rank": 0, "restarts": 2,
                     "nodelist": "gpu-1", "node": "gpu-1"}
    with pytest.raises(UsageError, match="^task: not inside a Slurm job"):
        slurm_facts({})


# --- jobs in this process, against moto server -----------------------------------------------------------------

@pytest.fixture
def bucket(moto_endpoint):
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return "ckpt"


def code_job(tmp_path, job_id: str, main: str, **fields) -> Job:
    work = tmp_path / f"src-{job_id}"
    work.mkdir()
    (work / "main.py").write_text(main)
    uri, _ = bundle.upload(bundle.pack(work), team_base("ckpt", None))
    return Job(job_id, "code", code=uri, command=("python", "main.py"), **fields)


def test_a_code_job_runs_in_its_work_dir_with_the_job_environment_and_its_secrets(bucket, tmp_path, monkeypatch):
    for key, value in SLURM_ENV.items():  # what slurmd gives the task
        monkeypatch.setenv(key, value)
    boto3.client("ssm").put_parameter(Name="/gpufleet/dev/hf", Value="s3cr3t", Type="SecureString")
    dump = tmp_path / "env.json"
    main = ("import json, os, sys\n"
            "open(os.path.join(os.environ['GPUFLEET_SCRATCH'], 'left-behind'), 'w').write('x')\n"
            f"json.dump({{'env': dict(os.environ), 'cwd': os.getcwd()}}, open({str(dump)!r}, 'w'))\n")
    job = code_job(tmp_path, "env-1", main, env={"MODE": "fast", "HF_TOKEN": {"ssm": "/gpufleet/dev/hf"}})
    node = {"region": "eu-west-1", "stack": "dev"}
    assert make_task(job, tmp_path, attempt=2, node=node, platform=NodePlatform(node))() == 0
    seen = json.loads(dump.read_text())
    ours = {k: v for k, v in seen["env"].items()
            if k.startswith("GPUFLEET_") and "LOOPBACK" not in k}  # not the loopback guard's
    scratch = Path(ours.pop("GPUFLEET_SCRATCH"))  # the attempt's own, also its TMPDIR; removed when it ended
    assert scratch.parent == job_dir(tmp_path, "env-1") and seen["env"]["TMPDIR"] == str(scratch)
    assert scratch.name.startswith("scratch-2-") and not scratch.exists()
    assert ours == {
        "GPUFLEET_JOB_ID": "env-1", "GPUFLEET_ATTEMPT": "2", "GPUFLEET_CHECKPOINT_URI": "s3://ckpt/teams/default/jobs/env-1/",
        "GPUFLEET_NNODES": "1", "GPUFLEET_NODE_RANK": "0", "GPUFLEET_NPROC_PER_NODE": "1",
        "GPUFLEET_RDZV_ENDPOINT": "127.0.0.1:20101",
        "GPUFLEET_STOP_FILE": str(job_dir(tmp_path, "env-1") / "control" / "stop")}
    assert (seen["env"]["MODE"], seen["env"]["HF_TOKEN"]) == ("fast", "s3cr3t")
    assert seen["env"]["SLURM_JOB_ID"] == "101"  # Slurm's own stay
    assert seen["cwd"] == str(job_dir(tmp_path, "env-1") / "code")
    assert seen["env"]["PATH"].split(":")[0] == os.path.dirname(sys.executable)  # the node image's Python first


def test_a_missing_ssm_parameter_is_one_line_naming_the_stacks_path(bucket, tmp_path):
    job = code_job(tmp_path, "ssm-1", "print('never')\n", env={"HF_TOKEN": {"ssm": "/gpufleet/dev/nope"}})
    node = {"region": "eu-west-1", "stack": "dev"}
    with pytest.raises(UsageError) as err:
        make_task(job, tmp_path, node=node, platform=NodePlatform(node))()
    assert str(err.value) == ("env: ssm:/gpufleet/dev/nope: ParameterNotFound: no such SSM parameter; create it "
                              "below /gpufleet/dev/ (aws ssm put-parameter --type SecureString)")


def test_key_vault_secrets_reach_a_job_and_an_unreadable_one_is_one_line(bucket, tmp_path):
    dump = tmp_path / "env.json"
    main = f"import json, os\njson.dump(dict(os.environ), open({str(dump)!r}, 'w'))\n"
    with FakeAzureIdentity() as fake:
        fake.secrets["hf-token"] = "hf_abc"
        missing = code_job(tmp_path, "kv-1", main, env={"HF_TOKEN": {"keyvault": "nope"}})
        with pytest.raises(UsageError) as err:
            make_task(missing, tmp_path, platform=azure_platform(fake))()
        readable = code_job(tmp_path, "kv-2", main, env={"HF_TOKEN": {"keyvault": "hf-token"}})
        assert make_task(readable, tmp_path, platform=azure_platform(fake))() == 0
    assert str(err.value) == ("env: keyvault:nope: HTTP 404: no secret 'nope' in Key Vault gpufleet-kv; create it "
                              "there (az keyvault secret set)")
    assert json.loads(dump.read_text())["HF_TOKEN"] == "hf_abc"


def test_a_stop_that_comes_while_the_job_is_set_up_is_applied_when_it_starts(bucket, tmp_path, monkeypatch):
    """Slurm's SIGTERM while the bundle is fetched or the image pulled, before the job's process exists: the job is
    stopped as soon as it starts, not left to run to its end, and the attempt counts as stopped (75)."""
    t = make_task(code_job(tmp_path, "early", "import time\ntime.sleep(600)\n"), tmp_path)
    real_start = t.start

    def start(*args):
        t.stop()  # what the SIGTERM handler does, with no process to stop yet
        return real_start(*args)

    monkeypatch.setattr(t, "start", start)
    assert t() == EXIT_PREEMPTED
    assert (job_dir(tmp_path, "early") / "control" / "stop").exists()


def test_a_command_the_os_refuses_is_a_failed_job_not_a_crash(bucket, tmp_path, monkeypatch, caplog):
    # one argument over MAX_ARG_STRLEN, as a node whose own environment is huge would make: Popen raises E2BIG
    monkeypatch.setattr(task_module, "trainer_command", lambda *a: [sys.executable, "-c", "pass", "x" * 200_000])
    with caplog.at_level(logging.ERROR, logger="gpufleet.task"):
        assert make_task(Job("e2big", args=("--steps", "1")), tmp_path)() == 1
    assert "job e2big: cannot start: [Errno 7] Argument list too long" in caplog.text


@pytest.mark.slow
def test_node_rank_0_writes_the_progress_and_the_output_outlives_the_node(bucket, tmp_path, monkeypatch):
    """The record as the bridge leaves it when Slurm starts the job (running, one attempt); the task writes the
    train run's progress into it (with the node's GPU utilisation: NVML's reading, stubbed here, no GPU), and its
    output is in the bucket for `gpufleet jobs logs`; all of it under the job's team's prefix (its --team)."""
    monkeypatch.setattr("trainer.node.emf.gpu_utilisation", lambda: 87.5)
    job = Job("done-1", args=(*TRAIN, "--steps", "4"))
    rs = RecordStore.of_bucket("ckpt", "nlp")
    rs.create(job.to_dict())
    rs.update("done-1", lambda r: records.claim(r, {"nodes": ["gpu-1"], "gpus": 0}, 0.0))
    assert make_task(job, tmp_path, team="nlp")() == 0
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ckpt")["Contents"]]
    assert keys and all(k.startswith("teams/nlp/") for k in keys), keys  # record and index, checkpoint, logs
    assert any(k.startswith("teams/nlp/jobs/done-1/step-000000004/") for k in keys)
    rec = rs.get("done-1")
    assert (rec["progress"]["step"], rec["progress"]["total"]) == (4, 4) and rec["progress"]["loss"] > 0
    assert rec["progress"]["gpu_util"] == 87.5
    shipped = b"".join(data for node, data in logs.read(rs.store, "done-1", 1) if node == "gpu-1")
    local = (job_dir(tmp_path, "done-1") / "output-1-gpu-1.log").read_bytes()
    assert shipped == local and b"step 4/4" in shipped  # the whole output, in order, from the bucket
    proc = gpufleet("jobs", "logs", "--bucket", "ckpt", "--team", "nlp", "done-1")  # no node, no node's files
    assert proc.returncode == 0 and "step 4/4" in proc.stdout, proc.stderr


def test_an_aws_nodes_metrics_carry_its_group_and_itself(tmp_path, monkeypatch):
    node = {"cloud": "aws", "asg_name": "gpufleet-test-nodes", "metric_namespace": "gpufleet/test",
            "region": "eu-west-1"}
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    with FakeImds(instance_id="i-0feedface0000001") as imds:
        dimensions = NodePlatform(node, imds=Imds(imds.endpoint)).metric_dimensions()
    emitter = open_emitter(str(tmp_path / "metrics.log"), node, dimensions)
    emitter.emit({metric_names.GPU_UTILIZATION: 0.0})
    (doc,) = [json.loads(ln) for ln in (tmp_path / "metrics.log").read_text().splitlines()]
    assert doc["GPUUtilization"] == 0.0 and doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "gpufleet/test"
    assert doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["AutoScalingGroupName"],
                                                                 ["AutoScalingGroupName", "InstanceId"]]
    assert (doc["AutoScalingGroupName"], doc["InstanceId"]) == ("gpufleet-test-nodes", "i-0feedface0000001")
    assert open_emitter(str(tmp_path / "nowhere" / "metrics.log"), node, dimensions) is None  # the job runs without


# --- containers on a real Docker daemon ------------------------------------------------------------------------

@pytest.fixture
def docker(dockerd, bucket, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DOCKER_HOST", dockerd.host)
    return dockerd


def in_thread(t: Task) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(t()))
    thread.start()
    return thread, result


@pytest.mark.slow
def test_a_stopped_container_checkpoints_exits_75_and_the_next_attempt_resumes_with_no_step_lost(docker, tmp_path):
    """The example (examples/train.py in the image examples/Dockerfile builds) stopped as Slurm stops a job it
    requeues after a notice: SIGTERM through `docker stop` and the stop file; the requeued attempt resumes."""
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)  # the container runs as nobody when the tests run as root
    extra = host_python_flags() + ("--volume", f"{out}:/out")
    job = Job("ex-1", "image", image=EXAMPLE_IMAGE, command=("python", "/app/train.py", "--steps", str(STEPS),
                                                             "--step-sleep", "0.2", "--metrics", "/out/m.jsonl"))
    first = make_task(job, tmp_path, container_extra=extra)
    thread, result = in_thread(first)
    wait_for(lambda: steps(out / "m.jsonl"), what="the job's first step")
    first.stop()  # Slurm's SIGTERM
    thread.join(timeout=300)
    assert result == [EXIT_PREEMPTED]
    stopped = steps(out / "m.jsonl")[-1]["step"]
    assert stopped < STEPS and api.Checkpointer("s3://ckpt/teams/default/jobs/ex-1/").steps()[0] == stopped
    assert (job_dir(tmp_path, "ex-1") / "control" / "stop").exists()  # the stop file, beside the SIGTERM

    assert make_task(job, tmp_path, attempt=2, container_extra=extra)() == 0
    done = steps(out / "m.jsonl")
    assert [r["step"] for r in done] == list(range(1, STEPS + 1))  # none lost, none done twice
    assert [r["attempt"] for r in done] == [1] * stopped + [2] * (STEPS - stopped)


@pytest.mark.slow
def test_a_container_that_ignores_the_stop_is_killed_after_its_grace(docker, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)  # the container runs as nobody when the tests run as root
    monkeypatch.setattr(task_module, "stop_grace", lambda cloud: 2)
    job = Job("stubborn", "image", image=EXAMPLE_IMAGE, command=(
        "python", "-c", "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                        "pathlib.Path('/out/started').touch(); time.sleep(600)"))
    t = make_task(job, tmp_path, container_extra=(*host_python_flags(), "--volume", f"{out}:/out"))
    thread, result = in_thread(t)
    wait_for(lambda: (out / "started").exists(), what="the container to start")
    t.stop()
    thread.join(timeout=120)
    assert result == [EXIT_PREEMPTED]  # stopped: Slurm requeues or ends it as its stop meant
    assert docker.docker("ps", "-aq").stdout.strip() == ""  # killed and removed


HOSTILE = """
import json, os, pathlib
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
def can(act):
    try:
        act()
        return True
    except OSError:
        return False
seen = {"user": [os.getuid(), os.getgid()], "groups": os.getgroups(),
        **{k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")},
        "env": [os.environ[k] for k in ("HOME", "TMPDIR", "GPUFLEET_SCRATCH")],
        "write_etc": can(lambda: open("/etc/owned", "w")), "chown": can(lambda: os.chown("/mnt/scratch", 0, 0)),
        "mknod": can(lambda: os.mknod("/mnt/scratch/mem", 0o20600, os.makedev(1, 1))),
        "setuid_root": can(lambda: os.setuid(0))}
pathlib.Path("/mnt/scratch/left-behind").write_text("x")
os.symlink("/etc/passwd", "/mnt/scratch/link")
pathlib.Path("/gpufleet/seen.json").write_text(json.dumps(seen))
"""


@pytest.mark.slow
def test_a_hostile_container_runs_unprivileged_in_a_scratch_of_its_own_that_is_removed_after(docker, tmp_path):
    """Issue 23: jobs never run as root or with capabilities. A job script tries what a hostile one would; the
    container runs as the task's user (nobody where the task is root), with no capability, no new privileges
    and Docker's default seccomp profile, in a scratch directory of its own (HOME, TMPDIR) removed when it ends
    (through no link it left there)."""
    job = Job("hostile", "image", image=EXAMPLE_IMAGE, command=("python", "-c", HOSTILE))
    assert make_task(job, tmp_path, container_extra=host_python_flags())() == 0
    seen = json.loads((job_dir(tmp_path, "hostile") / "control" / "seen.json").read_text())
    want = list(task_module.container_user(os.getuid(), os.getgid()))
    assert seen["user"] == want and want[0] != 0 and 0 not in seen["groups"]
    assert (seen["CapEff"], seen["CapPrm"], seen["CapBnd"]) == ("0" * 16,) * 3
    assert (seen["NoNewPrivs"], seen["Seccomp"]) == ("1", "2")  # 2: a seccomp filter (Docker's default profile)
    assert seen["env"] == ["/mnt/scratch"] * 3
    assert not (seen["write_etc"] or seen["chown"] or seen["mknod"] or seen["setuid_root"]), seen
    assert list(job_dir(tmp_path, "hostile").glob("scratch-*")) == []  # removed with what the job left
    assert Path("/etc/passwd").exists()  # the link it left was removed, not followed


class RegistryPlatform(Platform):
    """A node whose identity logs in to the fake registry (as ECR's or ACR's platform does to theirs)."""

    def __init__(self, login: RegistryLogin | None):
        self.login, self.asked = login, []

    def registry_login(self, image: str):
        self.asked.append(image)
        return self.login if self.login and image_host(image) == self.login.host else None


@pytest.mark.slow
@pytest.mark.parametrize("logged_in", [True, False])
def test_a_job_image_is_pulled_from_a_private_registry_with_the_node_login(logged_in, docker, tmp_path, capfd):
    """The task hands the platform's login to the container launcher, which pulls with it from a docker config of
    its own (removed before the container starts, never in the job's directories); without a login the registry
    refuses the pull and the job fails."""
    logins = set(Path(tempfile.gettempdir()).glob("gpufleet-login-*"))
    with FakeRegistry("AWS", "node-token") as registry:
        job = Job(f"reg-{logged_in}", "image", image=registry.image, env={"DB_PASS": "hunter2"},
                  command=("/bin/sh", "-c", "echo pulled-$DB_PASS > /gpufleet/ran"))
        platform = RegistryPlatform(RegistryLogin(registry.host, "AWS", "node-token", 2e9) if logged_in else None)
        rc = make_task(job, tmp_path, platform=platform, container_extra=sandbox_flags())()
    where = job_dir(tmp_path, f"reg-{logged_in}")
    assert platform.asked == [registry.image]
    manifest_auths = {auth for method, path, auth in registry.seen if "/manifests/" in path}
    said = capfd.readouterr().err  # the launcher's log
    assert set(Path(tempfile.gettempdir()).glob("gpufleet-login-*")) == logins  # the login outlives no pull
    assert not (where / "docker").exists()
    if logged_in:
        assert rc == 0, said
        assert (where / "control" / "ran").read_text() == "pulled-hunter2\n"  # the image came from the registry and ran
        assert "--env DB_PASS " in said and "hunter2" not in said  # a value under any name: not logged
        assert manifest_auths == {registry.auth}  # the daemon sent the node's login for that host
        assert f"pulling {registry.image} with the job's registry login" in said
        assert docker.docker("image", "inspect", registry.image, check=False).returncode == 0
    else:
        assert rc == 125  # docker: the pull was refused
        assert not (where / "control" / "ran").exists()
        assert registry.auth not in {auth for _, _, auth in registry.seen}

