"""The demo's arithmetic: jobs' runs from their metrics files, the live table's rows, when to send the
spot notice, and the summary (steps lost and redone, requeue latency, GPU-hours and their price).
Pure functions on plain data; the orchestration (infra.demo.cli) reads the files, the records and Slurm.

A metrics file (one per job attempt, written by the attempt's rank 0 on its node:
``<box>/work/teams/<team>/nodes/<node>/jobs/<job>/metrics-<attempt>.jsonl``) holds one record per optimizer
step: ``step``, ``loss``, ``time`` (wall clock when written), ``step_time_s`` and, on a step whose checkpoint was saved,
``checkpoint_s``. A run is a stretch of increasing steps. A job's files are given as ``[(node, records)]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from infra import catalog

MIN_LEFT_S = 12.0  # training a job must have left for a notice: the watcher's 2 s poll, requeue, the stop step


@dataclass(frozen=True)
class Run:
    node: str
    records: tuple[dict, ...]

    @property
    def first(self) -> int:
        return self.records[0]["step"]

    @property
    def last(self) -> int:
        return self.records[-1]["step"]

    @property
    def started(self) -> float:
        return self.records[0]["time"] - self.records[0].get("step_time_s", 0.0)

    @property
    def ended(self) -> float:
        return self.records[-1]["time"]

    @property
    def checkpoints(self) -> list[int]:
        return [r["step"] for r in self.records if "checkpoint_s" in r]

    @property
    def seconds(self) -> float:
        """Training time of the run: from the start of its first step to its last record."""
        return self.ended - self.started


@dataclass(frozen=True)
class Notice:
    node: str
    job: str
    time: float
    step: int  # the job's last recorded step when the notice was sent


def split_runs(node: str, records: list[dict]) -> list[Run]:
    """A metrics file's records as runs: a step not above the previous one starts a new run."""
    runs: list[list[dict]] = []
    for rec in records:
        if not runs or rec["step"] <= runs[-1][-1]["step"]:
            runs.append([])
        runs[-1].append(rec)
    return [Run(node, tuple(r)) for r in runs]


def job_runs(files: list[tuple[str, list[dict]]]) -> list[Run]:
    """All runs of one job (``files``: (node, the records of one metrics file) each), in start order."""
    return sorted((run for node, recs in files if recs for run in split_runs(node, recs)), key=lambda r: r.started)


@dataclass(frozen=True)
class Row:
    job: str
    node: str
    step: int
    total: int
    loss: float | None
    checkpoint: int | None
    state: str
    step_time_s: float | None = None  # of the latest steps
    nodes: int = 1                    # nodes the job asked for


def step_time(run: Run, last: int = 5) -> float:
    """Mean step time of the run's last few steps."""
    recent = run.records[-last:]
    return sum(r.get("step_time_s", 0.0) for r in recent) / len(recent)


def job_state(runs: list[Run], total: int, record: dict | None, notice: Notice | None, job: str) -> str:
    """The job's state in the table, from its runs and its record (the bridge's view of Slurm's): waiting,
    nodes powering up, starting, running, spot notice: stopping, requeued at N, resumed from N, done, failed,
    cancelled."""
    state = (record or {}).get("state", "queued")
    if state in ("failed", "cancelled"):
        return state
    if runs and runs[-1].last >= total and state == "succeeded":
        return "done"
    if not runs:
        if state == "running":
            return "starting"
        return "nodes powering up" if (record or {}).get("reason") == "nodes powering up" else "waiting"
    latest = runs[-1]
    if state == "preempted":
        return f"requeued at {latest.last}"
    if notice is not None and notice.job == job and latest.node == notice.node and latest.started <= notice.time:
        current = ((record or {}).get("attempts") or [{}])[-1].get("nodes") or [notice.node]
        return "spot notice: stopping" if notice.node in current else "starting"  # elsewhere, no step yet
    if len(runs) > 1:
        return f"resumed from {latest.first - 1}"
    return "running"


def rows(jobs: list[str], files: dict[str, list[tuple[str, list[dict]]]], total: int,
         checkpoints: dict[str, int | None], records: dict[str, dict], notice: Notice | None) -> list[Row]:
    """The live table: per job its nodes, step, loss, newest checkpoint in the store and state."""
    out = []
    for job in jobs:
        runs = job_runs(files.get(job, []))
        latest = runs[-1] if runs else None
        record = records.get(job) or {}
        attempts = record.get("attempts") or [{}]
        node = ",".join(attempts[-1].get("nodes") or []) or (latest.node if latest else "-")
        out.append(Row(job, node, latest.last if latest else 0, total,
                       latest.records[-1]["loss"] if latest else None, checkpoints.get(job),
                       job_state(runs, total, record, notice, job), step_time(latest) if latest else None,
                       int((record.get("spec") or {}).get("nodes", 1))))
    return out


def victim(table: list[Row], idle_nodes: int, min_left_s: float = MIN_LEFT_S) -> Row | None:
    """The job to interrupt now, or None: the one job still running, on one node, while no job waits and another
    node is idle (``idle_nodes``: Slurm's idle, powered up or not, answering or not: Slurm runs the requeued job
    there once it can), with steps done and ``min_left_s`` of training left at its recent step time."""
    running = [r for r in table if r.state == "running"]
    waiting = [r for r in table if r.state in ("waiting", "nodes powering up")]
    if waiting or idle_nodes < 1 or len(running) != 1:
        return None
    r = running[0]
    if r.nodes != 1 or r.step < 1:
        return None
    return r if (r.total - r.step) * (r.step_time_s or 0.0) >= min_left_s else None


@dataclass
class Summary:
    jobs: int
    jobs_done: int
    steps_per_job: int
    steps_lost: int
    steps_redone: int
    steps_missing: int
    interrupted_job: str | None
    notice_node: str | None
    stopped_at: int | None            # the interrupted run's last step (its checkpoint)
    resumed_node: str | None
    resumed_from: int | None          # the checkpoint step the next run started after
    stop_s: float | None              # notice -> the checkpoint of the stop step written
    requeue_latency_s: float | None   # notice -> the job's first step done on the other node
    node_hours: float
    costs: list[dict] = field(default_factory=list)
    stack_cost: dict = field(default_factory=dict)   # {on_demand|spot: {instance_type, usd}}
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def steps_lost(run: Run) -> int:
    """Steps a run did after its newest checkpoint (or its start): gone with the process."""
    saved = run.checkpoints
    return run.last - (saved[-1] if saved else run.first - 1)


def steps_redone(runs: list[Run]) -> int:
    """Step numbers trained by more than one run."""
    seen: set[int] = set()
    again = 0
    for run in runs:
        steps = {r["step"] for r in run.records}
        again += len(steps & seen)
        seen |= steps
    return again


def steps_missing(runs: list[Run], total: int) -> int:
    """Steps 1..total that no run recorded."""
    done = {r["step"] for run in runs for r in run.records}
    return len(set(range(1, total + 1)) - done)


def costs(node_hours: float, instance_types: list[str]) -> list[dict]:
    """The same node-hours on each instance type: GPU-hours, on-demand and spot price (catalog list prices
    and its planning spot ratio, as the preview's cost estimate prices them)."""
    out = []
    for name in instance_types:
        t = catalog.CATALOG[name]
        out.append({"instance_type": name, "gpus": t.gpus, "gpu_hours": node_hours * t.gpus,
                    "on_demand_usd": node_hours * t.price_hour, "spot_usd": node_hours * t.spot_price_hour})
    return out


def stack_cost(node_hours: float, prices: dict) -> dict:
    """The node-hours at the preview's cost basis (``cost.prices``: the primary type on demand, the cheapest
    listed type on spot)."""
    return {kind: {"instance_type": p["instance_type"], "usd": node_hours * p["usd_hour"]}
            for kind, p in prices.items()}


def summarize(jobs: list[str], files: dict[str, list[tuple[str, list[dict]]]], total: int, notice: Notice | None,
              instance_types: list[str], stack_prices: dict, nodes_of: dict[str, int] | None = None) -> Summary:
    """The end-of-demo figures and what went wrong (``failures``: one line each; none means success).
    ``nodes_of``: the nodes of each multi-node job (its rank 0 writes the metrics; its node-hours count them all)."""
    nodes_of = nodes_of or {}
    all_runs = {job: job_runs(files.get(job, [])) for job in jobs}
    done = [j for j, runs in all_runs.items() if runs and runs[-1].last >= total]
    failures = [f"job {j} did not finish" for j in jobs if j not in done]
    lost = redone = missing = 0
    for runs in all_runs.values():
        lost += sum(steps_lost(r) for r in runs[:-1])  # every run but the finishing one was interrupted
        redone += steps_redone(runs)
        missing += steps_missing(runs, total) if runs else 0
    node_hours = sum(r.seconds * nodes_of.get(job, 1) for job, runs in all_runs.items() for r in runs) / 3600
    s = Summary(len(jobs), len(done), total, lost, redone, missing, None, None, None, None, None, None, None,
                node_hours, costs(node_hours, instance_types), stack_cost(node_hours, stack_prices), failures)
    if notice is None:
        failures.append("no spot notice was sent: no job was left running alone long enough")
        return s
    runs = all_runs[notice.job]
    hit = [i for i, r in enumerate(runs) if r.node == notice.node and r.started <= notice.time]
    s.interrupted_job, s.notice_node = notice.job, notice.node
    if not hit or hit[-1] + 1 >= len(runs):
        failures.append(f"job {notice.job} was not resumed after the notice to {notice.node}")
        return s
    stopped, resumed = runs[hit[-1]], runs[hit[-1] + 1]
    s.stopped_at, s.resumed_node, s.resumed_from = stopped.last, resumed.node, resumed.first - 1
    s.stop_s = stopped.ended - notice.time
    s.requeue_latency_s = resumed.records[0]["time"] - notice.time
    if resumed.node == notice.node:
        failures.append(f"job {notice.job} resumed on {resumed.node}, the node that got the notice")
    if lost:
        failures.append(f"{lost} step(s) lost")
    if redone:
        failures.append(f"{redone} step(s) trained twice")
    if missing:
        failures.append(f"{missing} step(s) never trained")
    return s
