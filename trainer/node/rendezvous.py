"""Gang mode: every node of the autoscaling group finds the same head and its own node rank.

The members are the group's InService instances; the head is the one with the lowest private IP,
so every node picks it without talking to the others. Node count comes from node.json.
The agent (`trainer.node.agent`, gang mode) publishes the job it runs as an :class:`Assignment` object in
the bucket (:class:`Board`); the other nodes poll it and start their part with :meth:`Gang.launch_args`.
By hand, `python -m trainer rendezvous --job-id ID` prints this node's torchrun flags, for
`torchrun $(python -m trainer rendezvous --job-id ID) -m trainer train ...` on every node.
"""
from __future__ import annotations

import functools
import ipaddress
import json
import logging
import socket
import sys
import time
from dataclasses import asdict, dataclass

from trainer.errors import ArgumentParser, UsageError
from trainer.node import node_schema

log = logging.getLogger("gpufleet.rendezvous")

C10D_PORT = 29400
ASSIGNMENT_KEY = "gang/assignment.json"
MARK_PREFIX = "gang/ended/"  # + <generation>.json: the first part of that run to end otherwise than 0


class RendezvousError(Exception):
    """The gang cannot form: one line saying why."""


@dataclass(frozen=True)
class Gang:
    members: tuple[str, ...]   # private IPs, head first
    node_rank: int

    @property
    def head(self) -> str:
        return self.members[0]

    @property
    def nnodes(self) -> int:
        return len(self.members)

    def torchrun_args(self, job_id: str, port: int = C10D_PORT) -> list[str]:
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.head}:{port}", "--rdzv-id", job_id]

    def launch_args(self, run_id: str, port: int, timeout_s: float) -> list[str]:
        """torchrun flags with this gang's node rank (static rendezvous): global rank 0 is on the head,
        whose torchrun hosts the store; the others wait up to ``timeout_s`` for it."""
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--rdzv-backend", "static", "--rdzv-endpoint", f"{self.head}:{port}", "--rdzv-id", run_id,
                "--rdzv-conf", f"timeout={max(1, int(timeout_s))}"]


@dataclass(frozen=True)
class Assignment:
    """The job the gang runs now, as the head published it."""

    job_id: str
    args: list[str]   # the job's own train flags; each node adds its defaults
    nnodes: int
    head: str
    port: int
    generation: str   # new on every claim: a rerun of the job is a new rendezvous
    spec: dict | None = None  # the whole job (trainer.jobs.spec); None in assignments written before the spec
    attempt: int = 1          # the head's receive count of the message

    @property
    def run_id(self) -> str:
        return f"{self.job_id}-{self.generation}"

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes) -> "Assignment":
        try:
            raw = json.loads(data)
            a = cls(**raw)
        except (ValueError, TypeError) as exc:
            raise RendezvousError(f"gang assignment: not an assignment object ({exc})") from None
        types = {"job_id": str, "nnodes": int, "head": str, "port": int, "generation": str, "spec": (dict, type(None)),
                 "attempt": int}
        bad = [k for k, t in types.items() if not isinstance(getattr(a, k), t)]
        if bad or not isinstance(a.args, list) or not all(isinstance(x, str) for x in a.args):
            raise RendezvousError(f"gang assignment: bad {', '.join(bad) or 'args'} in {raw}")
        return a


class Board:
    """The gang's assignment object in the bucket. The head writes it in one PUT (a reader sees all of it
    or nothing) and deletes it when the job ends; the others poll it with If-None-Match on its ETag,
    so an unchanged object costs a 304 without a body.

    The end mark: the first node whose part of a run ends otherwise than 0 writes ``gang/ended/<generation>.json``
    ({node_rank, exit_status}; a conditional create, so the first stands: the cause, not the parts that stopped
    because of it). Every node polls the mark of the run it is in. 75 (that part stopped at a checkpoint: a notice,
    a cancel) stops the others at a checkpoint too and the run is handed back; anything else is a failure, and the
    others stop within a grace (fail-fast) instead of hanging in a collective. A mark stays after the run, for
    parts still running, until the head publishes the next assignment."""

    def __init__(self, bucket: str, s3, key: str = ASSIGNMENT_KEY):
        self.bucket, self.s3, self.key = bucket, s3, key
        self._etag: str | None = None
        self._last: Assignment | None = None

    def publish(self, assignment: Assignment) -> None:
        self.clear_marks()
        self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=assignment.to_json(),
                           ContentType="application/json")

    def clear(self) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=self.key)

    @functools.cached_property
    def _marks(self):
        """The end marks, as a store (trainer.clouds.aws.S3Store) on their prefix of the bucket."""
        from trainer.clouds.aws import S3Store

        return S3Store(self.bucket, MARK_PREFIX, client=self.s3)

    def mark(self, generation: str, node_rank: int, rc: int) -> bool:
        """Say that this node's part of run ``generation`` ended with ``rc`` (not 0); False if another part's
        mark was there first (it stands)."""
        try:
            self._marks.create(f"{generation}.json", json.dumps({"node_rank": node_rank, "exit_status": rc}).encode())
        except FileExistsError:
            return False
        return True

    def mark_of(self, generation: str) -> dict | None:
        """The end mark of the run ``generation`` ({node_rank, exit_status}), or None."""
        try:
            mark = json.loads(self._marks.read_bytes(f"{generation}.json"))
            return {"node_rank": int(mark["node_rank"]), "exit_status": int(mark["exit_status"])}
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError):
            return {"node_rank": -1, "exit_status": -1}  # a mark it cannot read still means the run failed

    def clear_marks(self) -> None:
        """Delete the end marks of earlier runs."""
        marks = self._marks
        for key in marks.list():
            marks.delete(key)

    def read(self) -> Assignment | None:
        """The current assignment, or None (none, or not a valid one: logged)."""
        from botocore.exceptions import ClientError

        conditional = {"IfNoneMatch": self._etag} if self._etag else {}
        try:
            resp = self.s3.get_object(Bucket=self.bucket, Key=self.key, **conditional)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("304", "NotModified"):
                return self._last
            if code in ("404", "NoSuchKey"):
                self._etag = self._last = None
                return None
            raise
        self._etag = resp["ETag"]
        try:
            self._last = Assignment.parse(resp["Body"].read())
        except RendezvousError as exc:
            log.warning("s3://%s/%s: %s", self.bucket, self.key, exc)
            self._last = None
        return self._last


def order(ips: list[str]) -> tuple[str, ...]:
    """Private IPs in numeric order (10.0.0.9 before 10.0.0.10): the head is first."""
    return tuple(sorted(set(ips), key=ipaddress.ip_address))


def form(ips: list[str], my_ip: str, nnodes: int) -> Gang:
    """The gang of the first ``nnodes`` members in IP order, as seen from ``my_ip``."""
    members = order(ips)
    if len(members) < nnodes:
        raise RendezvousError(f"gang: {len(members)} of {nnodes} nodes in service")
    members = members[:nnodes]
    if my_ip not in members:
        raise RendezvousError(f"gang: this node ({my_ip}) is not among the first {nnodes} nodes {list(members)}")
    return Gang(members, members.index(my_ip))


def in_service_ips(asg_name: str, autoscaling, ec2) -> list[str]:
    """Private IPs of the group's InService instances (autoscaling, then EC2 for the addresses)."""
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])["AutoScalingGroups"]
    if not groups:
        raise RendezvousError(f"gang: autoscaling group {asg_name!r} not found")
    ids = [i["InstanceId"] for i in groups[0]["Instances"] if i["LifecycleState"] == "InService"]
    if not ids:
        return []
    pages = ec2.get_paginator("describe_instances").paginate(InstanceIds=ids)
    return [inst["PrivateIpAddress"] for page in pages for r in page["Reservations"]
            for inst in r["Instances"] if inst.get("PrivateIpAddress")]


def discover(asg_name: str, my_ip: str, nnodes: int, autoscaling, ec2,
             timeout_s: float = 600.0, poll_s: float = 10.0) -> Gang:
    """Wait until ``nnodes`` instances are InService, then form the gang."""
    deadline = time.monotonic() + timeout_s
    while True:
        ips = in_service_ips(asg_name, autoscaling, ec2)
        try:
            return form(ips, my_ip, nnodes)
        except RendezvousError as exc:
            if time.monotonic() >= deadline:
                raise RendezvousError(f"{exc} after {timeout_s:.0f}s") from None
            log.info("%s; waiting", exc)
        time.sleep(poll_s)


def wait_for_head(host: str, port: int = C10D_PORT, timeout_s: float = 300.0, poll_s: float = 2.0) -> None:
    """Return once the head accepts TCP connections; otherwise fail with one line."""
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=min(poll_s, 5.0)):
                return
        except OSError as exc:
            last = exc
        time.sleep(poll_s)
    raise RendezvousError(f"gang: cannot reach the rendezvous head {host}:{port} within {timeout_s:.0f}s ({last})")


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m trainer rendezvous", description="Print this node's torchrun flags.")
    p.add_argument("--job-id", required=True, help="the rendezvous id: the same on every node")
    p.add_argument("--node-json", default=node_schema.PATH, help="node settings (default %(default)s)")
    p.add_argument("--port", type=int, default=C10D_PORT)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the nodes and the head")
    args = p.parse_args(argv)
    from trainer.node.platform import open_platform

    node = node_schema.load(args.node_json)
    if "node_count" not in node:
        raise UsageError(f"--node-json: {args.node_json}: node_count is missing; the gang needs its size")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port: {args.port} is not allowed; expected 1 to 65535")
    if not args.timeout > 0:
        raise UsageError(f"--timeout: {args.timeout:g} is not allowed; expected a number of seconds > 0")
    try:
        gang = open_platform(node).form_gang(node["node_count"], args.timeout)
        if gang.node_rank:
            wait_for_head(gang.head, args.port, timeout_s=args.timeout)
    except RendezvousError as exc:  # the gang cannot form or the head is out of reach: one line, exit 1
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(" ".join(gang.torchrun_args(args.job_id, args.port)))
    return 0
