"""Container and code-bundle jobs under the agent, against a real Docker daemon (tests/trainer/dockerd.py), moto
server and the fake IMDS: the example script (examples/train.py, in the image examples/Dockerfile builds) is
preempted by a spot notice, checkpoints, exits 75, is requeued and finished by a second agent with every step
done once; the same for a code bundle; a 2-node gang of containers finds its head through the environment; a
cancel stops a container that ignores SIGTERM within its grace; a job's image is pulled from a private registry
(a fake on loopback, basic auth) with the node's login in the job's own docker config."""
from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading

import boto3
import pytest

from tests.conftest import free_port
from tests.trainer.aws import LifecycleStubbed, counts, make_group
from tests.trainer.dockerd import EXAMPLE_IMAGE, ROOT, dockerd, host_python_flags, sandbox_flags  # noqa: F401 (fixture)
from tests.trainer.fake_registry import FakeRegistry
from infra.demo.imds import FakeImds
from tests.trainer.gated import steps, wait_for
from tests.trainer.test_agent_gang import cluster, protected  # noqa: F401 (fixture)
from trainer.clouds.aws import Imds, NodePlatform, SqsJobQueue
from trainer.jobs import api
from trainer.node.agent import Agent, GangAgent
from trainer.node.emf import Emitter
from trainer.node.platform import Platform
from trainer.node.registry import RegistryLogin, image_host
from trainer.node.rendezvous import Board

STEPS = 30


def outcomes(sqs, url) -> list[str]:
    """The attempt history of the one visible message, which stays visible."""
    (m,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    return [a["outcome"] for a in json.loads(m["Body"])["attempts"]]


@pytest.fixture
def aws(moto_endpoint):
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return sqs, url


@pytest.fixture
def docker(dockerd, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DOCKER_HOST", dockerd.host)
    return dockerd


def submit(*argv) -> None:
    proc = subprocess.run([sys.executable, "-m", "trainer", "submit", *argv], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def quiet() -> Emitter:
    return Emitter("gpufleet/test", io.StringIO())


def saved_step(job_id: str) -> int:
    return api.Checkpointer(f"s3://ckpt/jobs/{job_id}/").steps()[0]


def in_thread(agent) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(agent.serve(once=True)))
    thread.start()
    return thread, result


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["image", "code"])
def test_preempted_job_checkpoints_is_requeued_and_resumed_with_no_step_lost(kind, aws, docker, tmp_path,
                                                                             monkeypatch):
    sqs, url = aws
    (instance_id,) = make_group("gpu")
    node = {"asg_name": "gpu", "terminate_hook": "drain", "region": "eu-west-1"}
    out = tmp_path / "out"
    out.mkdir()
    flags = ["--steps", str(STEPS), "--step-sleep", "0.2"]
    if kind == "image":
        submit("--queue-url", url, "--image", EXAMPLE_IMAGE, "--job-id", "ex-1", "--",
               "python", "/app/train.py", *flags, "--metrics", "/out/m.jsonl")
        extra = host_python_flags() + ("--volume", f"{out}:/out")
    else:
        work = tmp_path / "project"
        work.mkdir()
        shutil.copy(ROOT / "examples" / "train.py", work / "train.py")
        submit("--queue-url", url, "--bucket", "ckpt", "--workdir", str(work), "--job-id", "ex-1", "--",
               "python", "train.py", *flags, "--metrics", str(out / "m.jsonl"))
        extra = ()
    metrics = out / "m.jsonl"
    with FakeImds(instance_id=instance_id) as imds:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        autoscaling = LifecycleStubbed()
        autoscaling.expect_complete("gpu", "drain", instance_id, "CONTINUE")
        first = Agent(SqsJobQueue(url), "ckpt", node, tmp_path / "a", wait_s=0, nproc=0, emitter=quiet(),
                      platform=NodePlatform(node, autoscaling=autoscaling), container_extra=extra, watch_s=0.5)
        thread, result = in_thread(first)
        wait_for(lambda: steps(metrics), what="the job's first step")
        imds.spot_interruption()
        thread.join(timeout=300)
        assert result == [75]
        autoscaling.stub.assert_no_pending_responses()  # the terminate hook: CONTINUE once the checkpoint is safe
    assert counts(sqs, url) == (1, 0)  # handed back at once (its history: test_a_cancel_stops_a_container...)
    stopped = steps(metrics)[-1]["step"]
    assert stopped < STEPS and saved_step("ex-1") == stopped
    assert (tmp_path / "a" / "jobs" / "ex-1" / "control" / "stop").exists()  # the stop file, beside the SIGTERM

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    second = Agent(SqsJobQueue(url), "ckpt", {}, tmp_path / "b", wait_s=0, nproc=0, emitter=quiet(),
                   container_extra=extra)
    assert second.serve(once=True) == 0
    assert counts(sqs, url) == (0, 0)
    records = steps(metrics)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # none lost, none done twice
    assert [r["attempt"] for r in records] == [1] * stopped + [2] * (STEPS - stopped)
    assert saved_step("ex-1") == STEPS


@pytest.mark.slow
def test_a_two_node_gang_of_containers_finds_its_head_through_the_environment(cluster, docker, tmp_path,  # noqa: F811
                                                                              monkeypatch):
    sqs, url, ((head_id, head_ip), (worker_id, worker_ip)), node_json = cluster
    out = tmp_path / "out"
    out.mkdir()
    extra = host_python_flags() + ("--volume", f"{out}:/out")
    launch = ("exec python -m torch.distributed.run --nnodes $GPUFLEET_NNODES --node-rank $GPUFLEET_NODE_RANK "
              "--rdzv-endpoint $GPUFLEET_RDZV_ENDPOINT --nproc-per-node $GPUFLEET_NPROC_PER_NODE "
              "/app/train.py --steps 3 --metrics /out/m.jsonl")
    submit("--queue-url", url, "--image", EXAMPLE_IMAGE, "--job-id", "g-1", "--nodes", "2", "--max-nodes", "2",
           "--", "sh", "-c", launch)
    node = json.loads(node_json.read_text())
    port = free_port()
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
    with FakeImds(instance_id=head_id, private_ip=head_ip) as head_imds, \
            FakeImds(instance_id=worker_id, private_ip=worker_ip) as worker_imds:
        def gang_agent(imds, name):
            return GangAgent(SqsJobQueue(url), "ckpt", node, tmp_path / name, Board("ckpt", boto3.client("s3")),
                             port=port, gang_timeout_s=60, poll_s=0.5, wait_s=20, nproc=0, emitter=quiet(),
                             platform=NodePlatform(node, imds=Imds(imds.endpoint)), container_extra=extra)

        worker, worker_result = in_thread(gang_agent(worker_imds, "w"))
        head, head_result = in_thread(gang_agent(head_imds, "h"))
        head.join(timeout=300)
        worker.join(timeout=300)
    assert (head_result, worker_result) == ([0], [0])
    assert counts(sqs, url) == (0, 0)  # done: the head deleted the message
    records = steps(out / "m.jsonl")
    assert [(r["step"], r["world"], r["nnodes"]) for r in records] == [(1, 2, 2), (2, 2, 2), (3, 2, 2)]
    assert saved_step("g-1") == 3
    assert not protected(head_id) and not protected(worker_id)


@pytest.mark.slow
def test_a_cancel_stops_a_container_within_its_grace(aws, docker, tmp_path, caplog):
    """The agent's stop path (SIGTERM to the agent, as `systemctl stop` or a cancel sends it): docker stop with
    the grace, then SIGKILL for a job that ignores SIGTERM; the message is handed back at once."""
    sqs, url = aws
    out = tmp_path / "out"
    out.mkdir()
    submit("--queue-url", url, "--image", EXAMPLE_IMAGE, "--job-id", "stubborn", "--",
           "python", "-c", "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                           "pathlib.Path('/out/started').touch(); time.sleep(600)")
    agent = Agent(SqsJobQueue(url), "ckpt", {}, tmp_path / "a", wait_s=0, nproc=0, emitter=quiet(),
                  container_extra=(*host_python_flags(), "--volume", f"{out}:/out"), stop_grace_s=2)

    def cancel():
        wait_for(lambda: (out / "started").exists(), what="the container to start")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=cancel, daemon=True).start()
    assert agent.serve(once=True) == 75  # in the main thread: the agent's own signal handler
    assert "job stubborn: exited 137 after the stop, not 75" in caplog.text  # SIGKILL once the grace ran out
    assert (tmp_path / "a" / "jobs" / "stubborn" / "control" / "stop").exists()
    assert docker.docker("ps", "-aq").stdout.strip() == ""  # stopped and removed
    assert counts(sqs, url) == (1, 0) and outcomes(sqs, url) == ["preempted"]


class RegistryPlatform(Platform):
    """A node whose identity logs in to the fake registry (as ECR's or ACR's platform does to theirs)."""

    def __init__(self, login: RegistryLogin | None):
        self.login, self.asked = login, []

    def registry_login(self, image: str):
        self.asked.append(image)
        return self.login if self.login and image_host(image) == self.login.host else None


@pytest.mark.slow
@pytest.mark.parametrize("logged_in", [True, False])
def test_a_job_image_is_pulled_from_a_private_registry_with_the_node_login(logged_in, aws, docker, tmp_path,
                                                                          caplog):
    """The agent writes the platform's login into the job's private docker config (DOCKER_CONFIG) and the
    daemon pulls with it; without a login the registry refuses the pull and the job fails."""
    sqs, url = aws
    caplog.set_level(logging.INFO, logger="gpufleet")
    with FakeRegistry("AWS", "node-token") as registry:
        submit("--queue-url", url, "--image", registry.image, "--job-id", f"reg-{logged_in}", "--",
               "/bin/sh", "-c", "echo pulled > /gpufleet/ran")
        platform = RegistryPlatform(RegistryLogin(registry.host, "AWS", "node-token", 2e9) if logged_in else None)
        agent = Agent(SqsJobQueue(url), "ckpt", {}, tmp_path / "a", wait_s=0, nproc=0, emitter=quiet(),
                      platform=platform, container_extra=sandbox_flags())
        rc = agent.serve(once=True)
    job_dir = tmp_path / "a" / "jobs" / f"reg-{logged_in}"
    assert platform.asked == [registry.image]
    manifest_auths = {auth for method, path, auth in registry.seen if "/manifests/" in path}
    if logged_in:
        assert rc == 0, caplog.text
        assert (job_dir / "control" / "ran").read_text() == "pulled\n"  # the image came from the registry and ran
        assert manifest_auths == {registry.auth}  # the daemon sent the node's login for that host
        assert f"registry {registry.host}: logged in with the node's identity (DOCKER_CONFIG={job_dir}/docker)" \
            in caplog.text
        assert not (job_dir / "docker").exists()  # the login does not outlive the container
        assert docker.docker("image", "inspect", registry.image, check=False).returncode == 0
    else:
        assert rc == 1
        assert not (job_dir / "control" / "ran").exists()
        assert registry.auth not in {auth for _, _, auth in registry.seen}
        assert "job reg-False: failed with exit status 125" in caplog.text  # docker: the pull was refused
