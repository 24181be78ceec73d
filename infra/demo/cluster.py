"""The cluster in a box: moto server for the account, the stack's resources created in it from the
preview, and local nodes (a fake instance metadata service each, the real agent) that run jobs from its
queue. Everything listens on 127.0.0.1 and is stopped by ``Cluster.close``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from infra.demo import resources as rs
from infra.demo.imds import FakeImds

REPO = Path(__file__).resolve().parents[2]
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo"}  # moto takes any
AGENT_WAIT_S = 2      # the agents' long poll: short, so that they stop soon when asked
STOP_GRACE_S = 15.0   # how long a stopping process may take before it is killed


def preview_document(stack: str) -> dict:
    """The stack's offline preview document, as ``python -m infra.preview --stack NAME --format json``."""
    from infra import config
    from infra.preview import runner
    from infra.preview.__main__ import stack_file

    raw, secret_keys = config.read_stack_file(stack_file(stack))
    return runner.preview(raw, secret_keys, stack)


def node_settings(r: rs.StackResources, queue_url: str) -> dict:
    """node.json of a demo node: the keys user-data writes on a real node of the stack (no hooks: moto
    has no CompleteLifecycleAction)."""
    from infra import catalog

    return {
        "cloud": "aws", "stack": r.stack, "region": r.region, "mode": "queue", "node_count": 1,
        "bucket": r.bucket_name, "queue_url": queue_url, "asg_name": r.group_name,
        "log_group": f"/gpufleet/{r.stack}", "metric_namespace": f"gpufleet/{r.stack}",
        "instance_types": {t: {"gpus": catalog.CATALOG[t].gpus, "efa": 0, "nvswitch": False}
                           for t in r.instance_types},
        "launch_hook": None, "terminate_hook": None,
    }


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc), children first."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def become_subreaper() -> None:
    """Orphans of our children (a job whose agent died) become our children, so we can stop them too."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


@dataclass
class Node:
    name: str
    instance_id: str
    instance_type: str
    private_ip: str
    dir: Path
    imds: FakeImds
    proc: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def work_dir(self) -> Path:
        return self.dir / "work"

    def metrics_file(self, job: str) -> Path:
        return self.work_dir / "jobs" / job / "metrics.jsonl"


@dataclass
class Cluster:
    stack: str
    dir: Path
    keep_dir: bool = False
    doc: dict = field(default_factory=dict)
    res: rs.StackResources | None = None
    endpoint: str = ""
    queue_url: str = ""
    dlq_url: str = ""
    notes: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    _moto: subprocess.Popen | None = None
    _clients: dict = field(default_factory=dict)
    _others: set[int] = field(default_factory=set)  # processes below this one that the demo did not start

    # --- the account ------------------------------------------------------------------------------

    def __post_init__(self) -> None:
        self._others = set(descendants(os.getpid()))

    def start(self, doc: dict, timeout_s: float = 60.0) -> None:
        """moto server in its own process (its work off this one's interpreter lock), up and answering."""
        self.doc, self.res = doc, rs.stack_resources(doc)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        (self.dir / "tmp").mkdir(exist_ok=True)
        with open(self.dir / "moto.log", "ab") as log:
            self._moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                          env={**os.environ, "TMPDIR": str(self.dir / "tmp")}, stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=2).read()
                return
            except OSError:
                if self._moto.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on {self.endpoint} (see {self.dir / 'moto.log'})")
                time.sleep(0.1)

    def client(self, service: str):
        if service not in self._clients:
            import boto3

            self._clients[service] = boto3.client(
                service, endpoint_url=self.endpoint, region_name=self.res.region,
                aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        return self._clients[service]

    def provision(self) -> None:
        """The stack's key, bucket, queues (names, policies, settings from the preview) and its group."""
        r, kms, s3, sqs = self.res, self.client("kms"), self.client("s3"), self.client("sqs")
        mapping: dict[str, str] = {}
        for op, params in rs.key_requests(r):
            reply = getattr(kms, op)(**rs.substitute(params, mapping))
            if op == "create_key":
                meta = reply["KeyMetadata"]
                mapping.update({r.key_arn: meta["Arn"], r.key["id"]: meta["KeyId"]})
        self.notes.append(f"KMS key {mapping[r.key['id']]}" + (f" ({r.alias})" if r.alias else ""))
        for op, params in rs.bucket_requests(r):
            if op == "put_bucket_policy":
                self._bucket_policy(params["Policy"], mapping)
                continue
            getattr(s3, op)(**rs.substitute(params, mapping))
        self.notes.append(f"bucket {r.bucket_name}: " + ", ".join(
            op.removeprefix("put_").removeprefix("bucket_").replace("_", " ")
            for op, _ in rs.bucket_requests(r)[1:] if op != "put_bucket_policy"))
        for q in (r.dlq, r.jobs):  # the dead-letter queue first: the jobs queue's redrive policy names it
            for op, params in rs.queue_requests(q):
                reply = getattr(sqs, op)(**rs.substitute(params, mapping))
                if op == "create_queue":
                    url = reply["QueueUrl"]
                    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
                    mapping.update({q.mock_url: url, q.mock_arn: arn})
        self.queue_url, self.dlq_url = mapping[r.jobs.mock_url], mapping[r.dlq.mock_url]
        redrive = r.jobs.redrive or {}
        self.notes.append(f"queue {r.jobs.name} (visibility {r.jobs.inputs.get('visibilityTimeoutSeconds')} s, "
                          f"dead letters after {redrive.get('maxReceiveCount')} receives to {r.dlq.name})")

    def _bucket_policy(self, policy: str, mapping: dict[str, str]) -> None:
        policy = rs.substitute(policy, mapping)
        arn = f"arn:aws:s3:::{self.res.bucket_name}"
        if not rs.policy_resources(policy) <= {arn, f"{arn}/*"}:
            raise RuntimeError(f"the bucket policy names resources other than {arn}")
        skipped = rs.unevaluable_denies(policy)
        if not skipped:
            self.client("s3").put_bucket_policy(Bucket=self.res.bucket_name, Policy=policy)
            self.notes.append("bucket policy attached")
            return
        self.notes.append(f"bucket policy not attached: moto takes the conditions of {', '.join(skipped)} "
                          "as always true, so it would deny every request (the policy names only this bucket)")

    def start_group(self, count: int) -> list[tuple[str, str, str]]:
        """The stack's autoscaling group in moto at ``count`` instances: [(id, type, private IP)]."""
        ec2, autoscaling = self.client("ec2"), self.client("autoscaling")
        subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
        template = f"{self.res.group_name}-demo"
        ec2.create_launch_template(LaunchTemplateName=template, LaunchTemplateData={
            "ImageId": self.doc["outputs"]["ami"], "InstanceType": self.res.instance_types[0]})
        autoscaling.create_auto_scaling_group(**rs.group_request(self.res, subnet, template, count))
        group = autoscaling.describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.res.group_name])["AutoScalingGroups"][0]
        ids = [i["InstanceId"] for i in group["Instances"]]
        found = {i["InstanceId"]: i for res in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                 for i in res["Instances"]}
        return [(i, found[i]["InstanceType"], found[i]["PrivateIpAddress"]) for i in ids]

    def protected(self) -> dict[str, bool]:
        ids = [n.instance_id for n in self.nodes]
        found = self.client("autoscaling").describe_auto_scaling_instances(InstanceIds=ids)["AutoScalingInstances"]
        return {i["InstanceId"]: i["ProtectedFromScaleIn"] for i in found}

    def queue_counts(self) -> tuple[int, int]:
        attrs = self.client("sqs").get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])

    def checkpoint_steps(self, job: str) -> list[int]:
        """The steps of the job's checkpoints in the bucket (its default prefix jobs/<job>/)."""
        from trainer.clouds.aws import S3Store
        from trainer.loop.checkpoint import Checkpointer

        return Checkpointer(S3Store(self.res.bucket_name, f"jobs/{job}/", client=self.client("s3")), keep=1).steps()

    def reclaim(self, node: Node) -> None:
        """The spot instance goes: terminate it in the group (desired capacity one less)."""
        self.client("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=node.instance_id, ShouldDecrementDesiredCapacity=True)

    # --- processes --------------------------------------------------------------------------------

    def env(self, imds: FakeImds | None = None) -> dict[str, str]:
        """A child's environment: moto for the account, dummy credentials, the node's metadata service (none:
        metadata disabled), and temporary files under the demo's directory (torch leaves some behind)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(CREDENTIALS, AWS_ENDPOINT_URL=self.endpoint, AWS_DEFAULT_REGION=self.res.region,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // 2)), TMPDIR=str(self.dir / "tmp"))
        if imds is None:
            env["AWS_EC2_METADATA_DISABLED"] = "true"
        else:
            env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.endpoint
        return env

    def add_node(self, name: str, instance: tuple[str, str, str]) -> Node:
        instance_id, instance_type, ip = instance
        imds = FakeImds(instance_id, instance_type, ip, self.res.region).__enter__()
        node = Node(name, instance_id, instance_type, ip, self.dir / name, imds)
        node.work_dir.mkdir(parents=True)
        (node.dir / "node.json").write_text(json.dumps(node_settings(self.res, self.queue_url), indent=2))
        self.nodes.append(node)
        return node

    def start_agent(self, node: Node) -> None:
        node.log = node.dir / "agent.log"
        with open(node.log, "ab") as log:
            node.proc = subprocess.Popen(
                [sys.executable, "-m", "trainer", "agent", "--node-json", str(node.dir / "node.json"),
                 "--work-dir", str(node.work_dir), "--wait", str(AGENT_WAIT_S)],
                env=self.env(node.imds), cwd=node.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True)  # a terminal's Ctrl-C reaches the demo only; it stops the nodes

    def submit(self, job_id: str, sweep: str, train_args: list[str]) -> list[str]:
        """``python -m trainer submit`` of the sweep; returns the queued job ids."""
        proc = subprocess.run(
            [sys.executable, "-m", "trainer", "submit", "--queue-url", self.queue_url, "--job-id", job_id,
             "--sweep", sweep, "--", *train_args],
            env=self.env(), cwd=self.dir, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"submit failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        return [line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("queued ")]

    def stop_agents(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the agents (a running job checkpoints and is handed back), then kill what is left."""
        live = [n.proc for n in self.nodes if n.proc and n.proc.poll() is None]
        for proc in live:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        for proc in live:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill_all(keep_moto=True)

    def kill_all(self, keep_moto: bool = False) -> None:
        """SIGKILL every process the demo started (and theirs; moto too unless kept) and reap them."""
        own = {n.proc.pid: n.proc for n in self.nodes if n.proc}
        if self._moto is not None:
            own[self._moto.pid] = self._moto
        spared = self._others | ({self._moto.pid} if keep_moto and self._moto else set())
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            pids = [p for p in descendants(os.getpid()) if p not in spared]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for pid in pids:
                if pid in own:
                    own[pid].wait()
                    continue
                try:
                    os.waitpid(pid, os.WNOHANG)  # an orphan that came to us as subreaper
                except ChildProcessError:
                    pass  # still its parent's: reaped there, or comes to us when the parent is gone
            time.sleep(0.05)

    def close(self) -> None:
        """Stop every process, the metadata services and moto; remove the directory unless kept."""
        self.kill_all()
        self._moto = None
        for node in self.nodes:
            node.imds.__exit__(None, None, None)
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
