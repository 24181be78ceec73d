"""The box's account: moto server on 127.0.0.1 with the stack's KMS key, bucket and queues created in it from
the stack's offline preview (``Account``), and the process helpers the box's supervisor uses.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import boto3

from infra import config
from infra.demo import resources as rs
from infra.preview import runner
from infra.preview.__main__ import stack_file

REPO = Path(__file__).resolve().parents[2]
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo"}  # moto takes any
STOP_GRACE_S = 15.0   # how long a stopping process may take before it is killed


def preview_document(stack: str) -> dict:
    """The stack's offline preview document, as ``python -m infra.preview --stack NAME --format json``."""
    raw, secret_keys = config.read_stack_file(stack_file(stack))
    return runner.preview(raw, secret_keys, stack)


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
    """Orphans of our children (daemons that fork: slurmd, slurmstepd) become our children, so we can stop them."""
    ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


@dataclass
class Account:
    stack: str
    dir: Path
    keep_dir: bool = False
    doc: dict = field(default_factory=dict)
    res: rs.StackResources | None = None
    endpoint: str = ""
    queue_url: str = ""
    dlq_url: str = ""
    team_queues: dict[str, str] = field(default_factory=dict)  # each team's queue (moto's URL)
    team_dead_letters: dict[str, str] = field(default_factory=dict)  # and its dead-letter queue
    notes: list[str] = field(default_factory=list)
    _moto: subprocess.Popen | None = None
    _clients: dict = field(default_factory=dict)

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
            self._clients[service] = boto3.client(
                service, endpoint_url=self.endpoint, region_name=self.res.region,
                aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        return self._clients[service]

    def provision(self) -> None:
        """The stack's key, bucket and queues (names, policies, settings from the preview)."""
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
        pairs = list(r.teams.values()) or [(r.jobs, r.dlq)]
        # each dead-letter queue first: its jobs queue's redrive policy names it
        for q in [q for jobs, dlq in pairs for q in (dlq, jobs)]:
            for op, params in rs.queue_requests(q):
                reply = getattr(sqs, op)(**rs.substitute(params, mapping))
                if op == "create_queue":
                    url = reply["QueueUrl"]
                    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
                    mapping.update({q.mock_url: url, q.mock_arn: arn})
        self.queue_url, self.dlq_url = mapping[r.jobs.mock_url], mapping[r.dlq.mock_url]
        self.team_queues = {team: mapping[jobs.mock_url] for team, (jobs, _) in r.teams.items()}
        self.team_dead_letters = {team: mapping[dlq.mock_url] for team, (_, dlq) in r.teams.items()}
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

    def close(self) -> None:
        """Stop moto; remove the directory unless kept."""
        if self._moto is not None:
            self._moto.terminate()
            try:
                self._moto.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._moto.kill()
                self._moto.wait()
            self._moto = None
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
