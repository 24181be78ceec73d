"""Gang mode: agents on two nodes of one autoscaling group (moto server, real HTTP) run one job together.

Each node is an agent process with its own fake IMDS (instance id, private IP); the group's private IPs
are loopback addresses, so the head's torchrun store is reachable here. The jobs are real 2-node torchrun
runs (one CPU process per node, gloo).
"""
from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import subprocess
import sys
import threading

import boto3
import pytest

from tests.conftest import free_port
from tests.trainer.aws import LifecycleStubbed, counts, send
from infra.demo.imds import FakeImds
from tests.trainer.gated import DIE, GATE, ROOT, TRAIN, steps, wait_for
from trainer.node.agent import GangAgent, gang_command
from trainer.loop.checkpoint import Checkpointer, from_bytes
from trainer.node.emf import Emitter
from trainer.clouds.aws import NodePlatform, SqsJobQueue
from trainer.node.rendezvous import ASSIGNMENT_KEY, MARK_PREFIX, Assignment, Board, Gang, RendezvousError
from trainer.loop.storage import open_store

STEPS = 3


def outcomes(sqs, url) -> list[str]:
    """The attempt history of the one visible message, which stays visible."""
    (m,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    return [a["outcome"] for a in json.loads(m["Body"])["attempts"]]


def test_gang_command_and_assignment_format():
    gang = Gang(("10.0.0.9", "10.0.0.10"), 1)
    assert gang_command(["--steps", "2"], gang, "j-1-abc", 29401, 8, 90)[1:] == [
        "-m", "trainer.node.launch", "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static",
        "--rdzv-endpoint", "10.0.0.9:29401", "--rdzv-id", "j-1-abc", "--rdzv-conf", "timeout=90",
        "--nproc-per-node", "8", "-m", "trainer", "train", "--steps", "2"]
    a = Assignment("j-1", ["--steps", "2"], 2, "10.0.0.9", 29401, "abc")
    assert Assignment.parse(a.to_json()) == a and a.run_id == "j-1-abc"
    with pytest.raises(RendezvousError, match="not an assignment object"):
        Assignment.parse(b'{"job_id": "j-1"}')
    with pytest.raises(RendezvousError, match="bad nnodes"):
        Assignment.parse(a.to_json().replace(b'"nnodes": 2', b'"nnodes": "2"'))


def test_board_polls_the_assignment_with_its_etag(moto_endpoint, caplog):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    status = []
    s3.meta.events.register("after-call.s3.GetObject",
                            lambda http_response, **_: status.append(http_response.status_code))
    board = Board("ckpt", s3)
    first = Assignment("j-1", ["--steps", "2"], 2, "10.0.0.9", 29400, "g1")
    assert board.read() is None
    board.publish(first)
    assert board.read() == first and board.read() == first
    second = Assignment("j-1", ["--steps", "2"], 2, "10.0.0.9", 29400, "g2")
    board.publish(second)
    assert board.read() == second
    s3.put_object(Bucket="ckpt", Key=ASSIGNMENT_KEY, Body=b"[]")
    assert board.read() is None and "gang/assignment.json: gang assignment: not an assignment object" in caplog.text
    board.clear()
    assert board.read() is None
    assert status == [404, 200, 304, 200, 200, 404]  # an unchanged object is not sent again
    # end marks: the first part's stands; the next assignment clears the marks of earlier runs
    assert board.mark_of("g2") is None
    assert board.mark("g2", 1, 75) is True and board.mark("g2", 0, 1) is False
    assert board.mark_of("g2") == {"node_rank": 1, "exit_status": 75} and board.mark_of("g1") is None
    board.publish(Assignment("j-2", [], 2, "10.0.0.9", 29400, "g3"))
    assert board.mark_of("g2") is None


@pytest.mark.parametrize("settings, flags, message", [
    ({"asg_name": "gang"}, [], "node.json: mode 'gang' needs asg_name and node_count (an integer >= 1), "
                               "got asg_name='gang' node_count=None"),
    ({"asg_name": "gang", "node_count": 2, "cloud": "azure"}, [], "mode 'gang' with cloud 'azure' is not run"),
    ({"asg_name": "gang", "node_count": 2}, ["--rdzv-port", "0"], "--rdzv-port: 0 is not allowed"),
    ({"mode": "ring"}, [], "node.json: node.mode: 'ring' is not one of queue, gang"),
])
def test_cli_bad_gang_settings_are_one_line(settings, flags, message, tmp_path):
    node = tmp_path / "node.json"
    node.write_text(json.dumps({"mode": "gang", "queue_url": "http://127.0.0.1:1/q", "bucket": "ckpt", **settings}))
    proc = subprocess.run([sys.executable, "-m", "trainer", "agent", "--node-json", str(node), *flags],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


@pytest.fixture
def cluster(moto_endpoint, tmp_path):
    return gang_cluster(tmp_path)


def gang_cluster(tmp_path):
    """A job queue, a bucket and a fixed-size group of two InService instances on loopback addresses;
    node.json in gang mode. Returns (sqs, queue url, [(instance id, private ip)] head first, node.json)."""
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    ec2 = boto3.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.0.1.0/24", AvailabilityZone="eu-west-1a")["Subnet"]
    image = ec2.describe_images()["Images"][0]["ImageId"]
    ec2.create_launch_template(LaunchTemplateName="gang", LaunchTemplateData={"ImageId": image,
                                                                               "InstanceType": "p5.48xlarge"})
    boto3.client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName="gang", MinSize=2, MaxSize=2, DesiredCapacity=2,
        LaunchTemplate={"LaunchTemplateName": "gang"}, VPCZoneIdentifier=subnet["SubnetId"])
    nodes = sorted(((i["InstanceId"], i["PrivateIpAddress"]) for r in ec2.describe_instances()["Reservations"]
                    for i in r["Instances"]), key=lambda n: tuple(int(x) for x in n[1].split(".")))
    node_json = tmp_path / "node.json"
    node_json.write_text(json.dumps({
        "cloud": "aws", "stack": "test", "region": "eu-west-1", "mode": "gang", "node_count": 2,
        "bucket": "ckpt", "queue_url": url, "asg_name": "gang", "log_group": "/gpufleet/test",
        "metric_namespace": "gpufleet/test", "launch_hook": None, "terminate_hook": "drain"}))
    return sqs, url, nodes, node_json


def protected(instance_id) -> bool:
    got = boto3.client("autoscaling").describe_auto_scaling_instances(InstanceIds=[instance_id])
    return got["AutoScalingInstances"][0]["ProtectedFromScaleIn"]


def assignment() -> Assignment | None:
    return Board("ckpt", boto3.client("s3")).read()


def start_agent(node_json, imds: FakeImds, work_dir, *flags, env=None) -> subprocess.Popen:
    """`python -m trainer agent --once` as the node whose metadata ``imds`` serves."""
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "false", "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
           **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "trainer", "agent", "--once", "--node-json", str(node_json),
                             "--work-dir", str(work_dir), "--wait", "20", "--visibility", "30", *flags],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err


def saved(job_id: str) -> tuple[int, dict]:
    """The newest checkpoint of the job in its default place: (step, trainer state)."""
    step, parts = Checkpointer(open_store(f"s3://ckpt/jobs/{job_id}/"), keep=1).load_latest()
    return step, from_bytes(parts["trainer.pt"])


@pytest.mark.slow
def test_two_agents_run_one_job_as_a_two_node_gang(cluster, tmp_path):
    sqs, url, ((head_id, head_ip), (worker_id, worker_ip)), node_json = cluster
    gate = tmp_path / "gate"
    send(sqs, url, "llm-1", [*TRAIN, "--steps", str(STEPS)])
    port = free_port()
    with FakeImds(instance_id=head_id, private_ip=head_ip) as head_imds, \
            FakeImds(instance_id=worker_id, private_ip=worker_ip) as worker_imds:
        flags = ["--rdzv-port", str(port), "--gang-timeout", "60"]
        env = {GATE: f"{gate}:1"}  # every rank waits at its first forward pass until the gate opens
        worker = start_agent(node_json, worker_imds, tmp_path / "w", *flags, env=env)
        head = start_agent(node_json, head_imds, tmp_path / "h", *flags, env=env)
        try:
            wait_for(lambda: protected(head_id) and protected(worker_id), what="both nodes to run their part")
            a = assignment()
            assert (a.job_id, a.nnodes, a.head, a.port) == ("llm-1", 2, head_ip, port)
            assert a.args == [*TRAIN, "--steps", str(STEPS)]
            assert counts(sqs, url) == (0, 1)  # the head holds the message
        finally:
            gate.touch()
            (head_rc, head_err), (worker_rc, worker_err) = finish(head), finish(worker)
    assert (head_rc, worker_rc) == (0, 0), head_err + worker_err
    assert f"joining run {a.run_id} as node 1 of 2 (head {head_ip})" in worker_err
    assert "job llm-1: done; message deleted" in head_err
    assert counts(sqs, url) == (0, 0)
    assert assignment() is None  # cleared
    assert not protected(head_id) and not protected(worker_id)
    step, state = saved("llm-1")
    assert (step, state["world"]) == (STEPS, 2)  # one job over 2 nodes x 1 process
    assert [r["step"] for r in steps(tmp_path / "h" / "jobs" / "llm-1" / "metrics.jsonl")] == [1, 2, 3]
    assert not (tmp_path / "w" / "jobs" / "llm-1" / "metrics.jsonl").exists()  # global rank 0 is the head


def test_worker_without_an_assignment_exits_cleanly_and_leaves_the_queue_alone(cluster, tmp_path):
    sqs, url, (_, (worker_id, worker_ip)), node_json = cluster
    send(sqs, url, "llm-2", ["--steps", "1"])
    with FakeImds(instance_id=worker_id, private_ip=worker_ip) as imds:
        proc = start_agent(node_json, imds, tmp_path / "w", "--wait", "1")
        rc, err = finish(proc)
    assert rc == 0, err
    assert "no gang assignment within 1s" in err
    assert counts(sqs, url) == (1, 0)  # only the head receives


def test_worker_that_cannot_reach_the_head_fails_with_one_line(cluster, tmp_path):
    _, _, ((_, head_ip), (worker_id, worker_ip)), node_json = cluster
    port = free_port()  # nothing listens there
    Board("ckpt", boto3.client("s3")).publish(Assignment("llm-3", ["--steps", "1"], 2, head_ip, port, "g1"))
    with FakeImds(instance_id=worker_id, private_ip=worker_ip) as imds:
        proc = start_agent(node_json, imds, tmp_path / "w", "--gang-timeout", "1")
        rc, err = finish(proc)
    assert rc == 1
    assert err.strip().splitlines()[-1].startswith(
        f"error: gang: cannot reach the rendezvous head {head_ip}:{port} within 1s")
    assert not protected(worker_id)


@pytest.mark.slow
def test_notice_on_a_worker_stops_the_gang_and_hands_the_job_back(cluster, tmp_path, monkeypatch):
    """The worker node gets the spot notice; the head's ranks stop at the same step through the
    collective; the head hands the message back at once; the worker completes its terminate hook."""
    sqs, url, ((head_id, head_ip), (worker_id, worker_ip)), node_json = cluster
    gate = tmp_path / "gate"
    send(sqs, url, "llm-4", [*TRAIN, "--steps", "1000"])
    port = free_port()
    with FakeImds(instance_id=head_id, private_ip=head_ip) as head_imds, \
            FakeImds(instance_id=worker_id, private_ip=worker_ip) as worker_imds:
        monkeypatch.setenv(GATE, f"{gate}:3")
        head = start_agent(node_json, head_imds, tmp_path / "h", "--rdzv-port", str(port), "--gang-timeout", "60")
        # The worker runs in this process (its train processes see its metadata through this environment),
        # with a Stubber for the lifecycle call that moto lacks.
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", worker_imds.endpoint)
        autoscaling = LifecycleStubbed()
        autoscaling.expect_complete("gang", "drain", worker_id, "CONTINUE")
        node = json.loads(node_json.read_text())
        worker = GangAgent(SqsJobQueue(url), "ckpt", node, tmp_path / "w", Board("ckpt", boto3.client("s3")),
                           port=port, gang_timeout_s=60, poll_s=0.5, wait_s=20, nproc=0,
                           platform=NodePlatform(node, autoscaling=autoscaling), emitter=Emitter("gpufleet/test", io.StringIO()))
        result = []
        thread = threading.Thread(target=lambda: result.append(worker.serve(once=True)))
        thread.start()
        try:
            metrics = tmp_path / "h" / "jobs" / "llm-4" / "metrics.jsonl"
            wait_for(lambda: steps(metrics), what="the job's first step")
            worker_imds.spot_interruption()
            seen = len(worker_imds.gets)
            wait_for(lambda: "meta-data/spot/instance-action" in worker_imds.gets[seen:],
                     what="the worker's watcher to read the notice")
        finally:
            gate.touch()
            thread.join(timeout=120)
            head_rc, head_err = finish(head)
        autoscaling.stub.assert_no_pending_responses()  # the worker's terminate hook: CONTINUE
    assert result == [75] and head_rc == 75, head_err
    assert "job llm-4: stopped after a checkpoint; message handed back" in head_err
    assert counts(sqs, url) == (1, 0)  # visible again at once: a fresh message with its history
    assert outcomes(sqs, url) == ["handed back"]  # the head itself is not going away
    assert assignment() is None
    assert not protected(head_id)  # the head is not going away: it may take the job again
    stopped = steps(metrics)[-1]["step"]
    assert stopped < 1000 and saved("llm-4")[0] == stopped


def objects(prefix: str) -> list[str]:
    return [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ckpt", Prefix=prefix).get("Contents", [])]


def the_mark() -> dict:
    """The one end mark on the board."""
    (key,) = objects(MARK_PREFIX)
    return json.loads(boto3.client("s3").get_object(Bucket="ckpt", Key=key)["Body"].read())


@pytest.mark.slow
def test_a_failed_part_stops_the_other_nodes_part_and_the_job_fails_as_a_whole(cluster, tmp_path):
    """Node 1's rank exits 3 at its first step; the head's rank waits at a gate (as a rank in a collective with
    a dead peer waits): the head sees node 1's failure mark, stops its own part and fails the job, which
    counts against its retries (the message is left for redelivery, not handed back)."""
    sqs, url, ((head_id, head_ip), (worker_id, worker_ip)), node_json = cluster
    send(sqs, url, "llm-5", [*TRAIN, "--steps", "1000"])
    port = free_port()
    with FakeImds(instance_id=head_id, private_ip=head_ip) as head_imds, \
            FakeImds(instance_id=worker_id, private_ip=worker_ip) as worker_imds:
        flags = ["--rdzv-port", str(port), "--gang-timeout", "60"]
        env = {GATE: f"{tmp_path / 'never'}:1", DIE: "1:1:3"}  # the gate never opens: only a stop ends rank 0
        worker = start_agent(node_json, worker_imds, tmp_path / "w", *flags, env=env)
        head = start_agent(node_json, head_imds, tmp_path / "h", *flags, env=env)
        (head_rc, head_err), (worker_rc, worker_err) = finish(head), finish(worker)
    a_run = next(ln for ln in head_err.splitlines() if "assigned to the gang" in ln)
    assert (head_rc, worker_rc) == (1, 1), head_err + worker_err
    assert "job llm-5: this node's part failed with exit status 1" in worker_err
    assert "job llm-5: node 1's part failed (exit status 1): stopping this node's part" in head_err, a_run
    assert "job llm-5: node 1's part failed with exit status 1; this node's part stopped" in head_err
    assert "job llm-5: failed with exit status 1" in head_err
    assert "stopped after a checkpoint" not in head_err  # a failure, not a preemption
    assert counts(sqs, url) == (0, 1)  # left for redelivery and the dead-letter queue
    assert assignment() is None  # the head cleared the assignment; the mark stays for parts still running
    assert the_mark() == {"node_rank": 1, "exit_status": 1}
    assert not protected(head_id) and not protected(worker_id)


@pytest.mark.slow
def test_a_preempted_nodes_replacement_joins_the_next_attempt_which_resumes_from_the_checkpoint(cluster, tmp_path):
    """Attempt 1: a spot notice on the worker; the gang checkpoints and hands the job back (no failure mark). The
    group replaces the worker; attempt 2 runs on the head and the replacement from the agreed checkpoint to the
    end, every step once."""
    sqs, url, ((head_id, head_ip), (worker_id, worker_ip)), node_json = cluster
    # no terminate hook: completing one is a call moto lacks (the notice test above stubs it)
    node_json.write_text(json.dumps({**json.loads(node_json.read_text()), "terminate_hook": None}))
    gate = tmp_path / "gate"
    send(sqs, url, "llm-6", [*TRAIN, "--steps", "6"])
    flags = ["--rdzv-port", str(free_port()), "--gang-timeout", "60"]
    with FakeImds(instance_id=head_id, private_ip=head_ip) as head_imds, \
            FakeImds(instance_id=worker_id, private_ip=worker_ip) as worker_imds:
        env = {GATE: f"{gate}:3"}  # every rank waits at its third forward pass until the gate opens
        worker = start_agent(node_json, worker_imds, tmp_path / "w1", *flags, env=env)
        head = start_agent(node_json, head_imds, tmp_path / "h1", *flags, env=env)
        try:
            metrics = tmp_path / "h1" / "jobs" / "llm-6" / "metrics.jsonl"
            wait_for(lambda: steps(metrics), what="the job's first step")
            worker_imds.spot_interruption()
            seen = len(worker_imds.gets)
            wait_for(lambda: "meta-data/spot/instance-action" in worker_imds.gets[seen:],
                     what="the worker's trainer to read the notice")
        finally:
            gate.touch()
            (head_rc, head_err), (worker_rc, worker_err) = finish(head), finish(worker)
    assert (head_rc, worker_rc) == (75, 75), head_err + worker_err
    assert "message handed back" in head_err  # a preemption, not a failure
    assert the_mark()["exit_status"] == 75
    stopped = saved("llm-6")[0]
    assert 1 <= stopped < 6

    autoscaling = boto3.client("autoscaling")
    autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=worker_id, ShouldDecrementDesiredCapacity=False)
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gang"])["AutoScalingGroups"][0]
    (new_id,) = {i["InstanceId"] for i in group["Instances"] if i["LifecycleState"] == "InService"} - {head_id}
    new_ip = boto3.client("ec2").describe_instances(InstanceIds=[new_id])["Reservations"][0]["Instances"][0][
        "PrivateIpAddress"]
    assert new_id != worker_id
    flags = ["--rdzv-port", str(free_port()), "--gang-timeout", "60"]
    with FakeImds(instance_id=head_id, private_ip=head_ip) as head_imds, \
            FakeImds(instance_id=new_id, private_ip=new_ip) as new_imds:
        replacement = start_agent(node_json, new_imds, tmp_path / "w2", *flags)
        head = start_agent(node_json, head_imds, tmp_path / "h2", *flags)
        (head_rc, head_err), (new_rc, new_err) = finish(head), finish(replacement)
    assert (head_rc, new_rc) == (0, 0), head_err + new_err
    leader_err = head_err if ipaddress.ip_address(head_ip) < ipaddress.ip_address(new_ip) else new_err
    assert "job llm-6: done; message deleted" in leader_err and counts(sqs, url) == (0, 0)
    step, state = saved("llm-6")
    assert (step, state["world"]) == (6, 2)
    leader = "h2" if leader_err is head_err else "w2"
    resumed = steps(tmp_path / leader / "jobs" / "llm-6" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == list(range(stopped + 1, 7))  # from the agreed checkpoint, none twice


# --- user code over the gang: one part's stop or failure reaches the others through the run's end mark --------

HOLD = """import os, pathlib, signal, sys, time
out, rank = pathlib.Path(OUT), os.environ["GPUFLEET_NODE_RANK"]
def stop(*_):
    (out / f"stopped-{rank}").touch()
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
(out / f"started-{rank}").touch()
if os.environ.get("FAIL_RANK") == rank:  # once every part has started
    while not all((out / f"started-{r}").exists() for r in range(int(os.environ["GPUFLEET_NNODES"]))):
        time.sleep(0.05)
    sys.exit(3)
while True:
    time.sleep(0.1)
"""


@contextlib.contextmanager
def user_code_gang(cluster, tmp_path, monkeypatch, job_id: str, env: dict | None = None):
    """A 2-node code job whose parts wait until SIGTERM (then exit 75), run by two in-process gang agents on
    their own fake IMDS; yields (out dir, head imds, worker imds, {"head": [rc], "worker": [rc]}) while they run,
    and joins them on leaving."""
    from trainer.clouds.aws import Imds
    from trainer.jobs import bundle
    from trainer.jobs.records import RecordStore
    from trainer.jobs.spec import Job

    sqs, url, ((head_id, head_ip), (worker_id, worker_ip)), node_json = cluster
    out, src = tmp_path / "out", tmp_path / "src"
    out.mkdir()
    src.mkdir()
    (src / "main.py").write_text(HOLD.replace("OUT", repr(str(out))))
    uri, _ = bundle.upload(bundle.pack(src), "ckpt")
    spec = Job(job_id, "code", code=uri, command=("python", "main.py"), nodes=2, env=env or {}).to_dict()
    RecordStore.of_bucket("ckpt").create(spec)
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(spec))
    node = {**json.loads(node_json.read_text()), "terminate_hook": None}
    port = free_port()
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
    with FakeImds(instance_id=head_id, private_ip=head_ip) as head_imds, \
            FakeImds(instance_id=worker_id, private_ip=worker_ip) as worker_imds:
        results: dict[str, list] = {"head": [], "worker": []}
        threads = []
        for name, imds in (("worker", worker_imds), ("head", head_imds)):
            agent = GangAgent(SqsJobQueue(url), "ckpt", node, tmp_path / name, Board("ckpt", boto3.client("s3")),
                              port=port, gang_timeout_s=60, poll_s=0.5, wait_s=20, nproc=0, watch_s=0.5,
                              stop_grace_s=10, emitter=Emitter("gpufleet/test", io.StringIO()),
                              platform=NodePlatform(node, imds=Imds(imds.endpoint)))
            threads.append(threading.Thread(target=lambda a=agent, r=results[name]: r.append(a.serve(once=True))))
            threads[-1].start()
        try:
            yield out, head_imds, worker_imds, results
        finally:
            for t in threads:
                t.join(timeout=120)


def started(out) -> bool:
    return (out / "started-0").exists() and (out / "started-1").exists()


@pytest.mark.slow
def test_a_cancel_stops_every_nodes_part_of_a_user_code_gang_at_a_checkpoint(cluster, tmp_path, monkeypatch):
    """The head reads the cancel and marks the run stopped before its SIGTERM; the worker's part, which the
    head's cancel never reaches directly, gets its SIGTERM from the mark instead of waiting in a collective."""
    from trainer.jobs import commands

    sqs, url, *_ = cluster
    with user_code_gang(cluster, tmp_path, monkeypatch, "gc-1") as (out, _, _, results):
        wait_for(lambda: started(out), what="both parts to start")
        told = commands.cancel(commands.Target("ckpt", url), "gc-1")
        assert told.startswith("job gc-1 is running")
    assert results == {"head": [0], "worker": [75]}
    assert (out / "stopped-0").exists() and (out / "stopped-1").exists()  # each part had its SIGTERM and grace
    assert the_mark() == {"node_rank": 0, "exit_status": 75}
    rec = commands.Target("ckpt", url).records().get("gc-1")
    assert rec["state"] == "cancelled" and rec["attempts"][0]["reason"] == "cancel"
    assert counts(sqs, url) == (0, 0)  # the message deleted


@pytest.mark.slow
def test_a_notice_on_a_worker_stops_the_heads_user_code_and_the_job_is_handed_back(cluster, tmp_path,
                                                                                   monkeypatch, caplog):
    """A spot notice on the worker: its agent marks the run stopped and stops its part; the head stops its own
    part at a checkpoint and hands the job back (a preemption, not a failure that counts against retries)."""
    sqs, url, *_ = cluster
    with user_code_gang(cluster, tmp_path, monkeypatch, "gc-2") as (out, _, worker_imds, results):
        wait_for(lambda: started(out), what="both parts to start")
        worker_imds.spot_interruption()
    assert results == {"head": [75], "worker": [75]}
    assert (out / "stopped-0").exists() and (out / "stopped-1").exists()
    assert the_mark() == {"node_rank": 1, "exit_status": 75}
    assert "job gc-2: node 1's part stopped at a checkpoint: stopping this node's part at one" in caplog.text
    assert counts(sqs, url) == (1, 0) and outcomes(sqs, url) == ["handed back"]


@pytest.mark.slow
def test_when_the_heads_part_fails_the_workers_part_is_stopped_too(cluster, tmp_path, monkeypatch, caplog):
    """The head's own part exits 3: its mark reaches the worker although the head has cleared the assignment."""
    sqs, url, *_ = cluster
    with user_code_gang(cluster, tmp_path, monkeypatch, "gc-3", env={"FAIL_RANK": "0"}) as (out, _, _, results):
        pass
    assert results == {"head": [1], "worker": [1]}
    assert (out / "stopped-1").exists() and not (out / "stopped-0").exists()
    assert the_mark() == {"node_rank": 0, "exit_status": 3}
    assert "job gc-3: node 0's part failed (exit status 3): stopping this node's part" in caplog.text
    assert counts(sqs, url) == (0, 1)  # a failure: left for redelivery and the dead-letter queue
