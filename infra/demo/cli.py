"""`gpufleet demo` (`python -m infra.demo`): the cluster in a box on a real Slurm (infra.box: moto for the
account, slurmctld, two CLOUD nodes that power up on demand as local slurmd, the bridge), a 2-node DDP job and
a sweep (one job array) of the built-in GPT submitted with the real `gpufleet jobs submit --stack box`, a spot
interruption notice to the node of a running job, its resume on the other node from its checkpoint, the summary.

Exit status: 0 every job finished with no step lost; 1 anything else (one line on stderr); 2 bad
arguments (or no Slurm here); 130 interrupted (Ctrl-C), with every process stopped and the work directory removed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from infra.box import cli as box_cli
from infra.cli import ArgumentParser, UsageError
from infra.config import ConfigError
from infra.demo import progress as pg
from infra.demo import resources as rs
from infra.preview.runner import one_line
from trainer.clouds.s3store import S3Store
from trainer.jobs.layout import team_prefix
from trainer.jobs.records import RecordStore, UnknownJob
from trainer.slurm import client

NODES = 2
JOB_ID = "demo"             # the sweep: demo.lr-<value>, one job array
PAIR_ID = "demo-ddp"        # the 2-node DDP job
POLL_S = 0.5
DESCRIPTION = ("The cluster in a box on a real Slurm: the stack's bucket and queues in a local moto server, "
               "slurmctld and two CLOUD nodes powered up on demand, a 2-node DDP job and a sweep (a job array), "
               "a spot interruption and the resume from the checkpoint, a summary.")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", default="dev", help="stack whose preview gives the resources and prices")
    p.add_argument("--jobs", type=_positive, default=3,
                   help="jobs in the sweep (one learning rate each): odd, >= 3, so the last runs alone")
    p.add_argument("--steps", type=_positive, default=300, help="optimizer steps per job (about 0.1 s each), >= 20")
    p.add_argument("--work-dir", metavar="DIR", help="use (and keep) this directory instead of a temporary one")
    p.add_argument("--keep-dir", action="store_true", help="keep the temporary directory (Slurm's logs, metrics)")
    p.add_argument("--summary-json", metavar="FILE", help="also write the summary here as JSON")
    p.add_argument("--timeout", type=_positive, default=600, metavar="S", help="give up after S seconds")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected an integer >= 1")
    return int(text)


def check(args: argparse.Namespace) -> argparse.Namespace:
    if args.jobs < 3 or args.jobs % 2 == 0:
        raise UsageError(f"--jobs: {args.jobs} is not allowed; expected an odd number >= 3 (the sweep runs two at "
                         "a time on the two nodes: the last job runs alone, and the notice goes to its node)")
    if args.work_dir and Path(args.work_dir).exists() and any(Path(args.work_dir).iterdir()):
        raise UsageError(f"--work-dir: {args.work_dir} is not empty; give a new or empty directory")
    if args.steps < 20:
        raise UsageError(f"--steps: {args.steps} is not allowed; expected >= 20 (the notice needs steps left)")
    return args


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m infra.demo", description=DESCRIPTION)
    configure(p)
    return check(p.parse_args(argv))


def sweep_values(n: int) -> list[str]:
    """n distinct learning rates, log-spaced from 1e-4 to 1e-3."""
    return [f"{1e-4 * 10 ** (i / max(1, n - 1)):.1e}" for i in range(n)]


def train_args(steps: int) -> list[str]:
    every = max(1, steps // 6)
    return ["--model", "gpt-small", "--dataset", "text", "--batch-size", "8", "--steps", str(steps),
            "--checkpoint-every", str(every), "--warmup-steps", str(max(1, steps // 10)), "--log-every", str(every)]


def read_metrics(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            break
    return out


# --- display ---------------------------------------------------------------------------------------

def job_table(table: list[pg.Row]):
    from rich.table import Table  # lazy: rich (~30 ms) off gpufleet's start-up

    t = Table(title="jobs", expand=False)
    for col in ("job", "node", "step", "loss", "ckpt", "state"):
        t.add_column(col, justify="right" if col in ("step", "loss", "ckpt") else "left")
    style = {"done": "green", "waiting": "dim"}
    for r in table:
        t.add_row(r.job, r.node, f"{r.step}/{r.total}", "-" if r.loss is None else f"{r.loss:.3f}",
                  "-" if r.checkpoint is None else str(r.checkpoint), r.state,
                  style=style.get(r.state, "yellow" if "notice" in r.state or "requeued" in r.state else None))
    return t


def summary_table(s: pg.Summary, wall_s: float):
    from rich.table import Table  # lazy: rich (~30 ms) off gpufleet's start-up

    t = Table(title="summary", show_header=False)
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_row("jobs done", f"{s.jobs_done}/{s.jobs}")
    t.add_row("steps lost", str(s.steps_lost))
    t.add_row("steps redone", str(s.steps_redone))
    if s.requeue_latency_s is not None:
        t.add_row(f"requeue latency, notice to training ({s.interrupted_job}: {s.notice_node} -> {s.resumed_node})",
                  f"{s.requeue_latency_s:.1f} s")
        t.add_row(f"checkpoint after the notice (step {s.stopped_at})", f"{s.stop_s:.1f} s")
    t.add_row("training time (node-hours, every node of a job)", f"{s.node_hours:.5f}")
    for kind, c in s.stack_cost.items():
        t.add_row(f"at the stack's {kind.replace('_', '-')} price ({c['instance_type']})", f"USD {c['usd']:.5f}")
    t.add_row("demo wall time", f"{wall_s:.0f} s")
    c = Table(title="the same GPU-hours on the stack's instance types (catalog list prices)")
    for col in ("instance type", "GPUs", "GPU-hours", "on-demand USD", "spot USD"):
        c.add_column(col, justify="left" if col == "instance type" else "right")
    for row in s.costs:
        c.add_row(row["instance_type"], str(row["gpus"]), f"{row['gpu_hours']:.5f}",
                  f"{row['on_demand_usd']:.5f}", f"{row['spot_usd']:.5f}")
    return t, c


class Display:
    """A live table on a terminal; plain event lines otherwise (logs, tests)."""

    def __init__(self):
        from rich.console import Console  # lazy: rich (~30 ms) off gpufleet's start-up

        self.console = Console(stderr=False, highlight=False)
        self.live = None
        self.events: list[str] = []
        self.nodes_line = ""
        self.table: list[pg.Row] = []
        self.t0 = time.monotonic()

    def __enter__(self):
        if self.console.is_terminal:
            from rich.live import Live  # lazy: rich (~30 ms) off gpufleet's start-up

            self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)
            self.live = None

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:5.1f}s] {text}"
        self.events.append(line)
        if self.live:
            self.live.update(self._render())
        else:
            self.console.print(line, markup=False, soft_wrap=True)

    def update(self, table: list[pg.Row], nodes_line: str) -> None:
        self.table, self.nodes_line = table, nodes_line
        if self.live:
            self.live.update(self._render())

    def _render(self):
        from rich.console import Group  # lazy: rich (~30 ms) off gpufleet's start-up
        from rich.text import Text

        return Group(job_table(self.table), Text(self.nodes_line), Text("\n".join(self.events[-10:]), style="dim"))

    def final(self, *renderables) -> None:
        self.__exit__(None, None, None)
        for r in renderables:
            self.console.print(r)


# --- the run ---------------------------------------------------------------------------------------

class DemoFailure(Exception):
    """Something in the demo's cluster went wrong; str() is one line."""


@dataclass
class Box:
    """The demo's view of its running box: Slurm's commands, the bucket's records, checkpoints and metrics."""
    dir: Path
    state: dict
    _s3: object = None

    def env(self) -> dict[str, str]:
        """A user's shell after `eval $(gpufleet box env)`."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SLURM_", "GPUFLEET_"))}
        return {**env, "SLURM_CONF": self.state["slurm_conf"], "GPUFLEET_BOX_DIR": str(self.dir),
                "PATH": box_cli._path()}

    @property
    def s3(self):
        if self._s3 is None:
            import boto3  # lazy: boto3 (~0.2 s) off gpufleet's start-up

            self._s3 = boto3.client("s3", endpoint_url=self.state["endpoint"], region_name=self.state["region"],
                                    aws_access_key_id="box", aws_secret_access_key="box")
        return self._s3

    def submit(self, *argv: str) -> list[str]:
        """`gpufleet jobs submit --stack box ARGV`, as a user runs it; the queued job ids."""
        done = subprocess.run([sys.executable, "-m", "infra.cli", "jobs", "submit", "--stack", "box", *argv],
                              env=self.env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise DemoFailure(f"jobs submit: {(done.stderr or done.stdout).strip()}")
        return [line.split()[1] for line in done.stdout.splitlines() if line.startswith("queued ")]

    @property
    def team(self) -> str | None:
        """The team the demo's jobs are (`jobs submit --stack box` sends to the box's first queue, its team's)."""
        return next((t for t, url in (self.state.get("team_queues") or {}).items() if url == self.state["queue_url"]),
                    None)

    def records(self, jobs: list[str]) -> dict[str, dict]:
        store = RecordStore(S3Store(self.state["bucket"], team_prefix(self.team), client=self.s3))
        out = {}
        for job in jobs:
            try:
                out[job] = store.get(job)
            except UnknownJob:  # not written by submit yet
                pass
        return out

    def checkpoints(self, jobs: list[str]) -> dict[str, int | None]:
        """The newest checkpoint step of each job in the bucket (its default prefix teams/<team>/jobs/<job>/)."""
        from trainer.loop.checkpoint import Checkpointer  # lazy: torch (~2 s) off gpufleet's start-up

        out = {}
        for job in jobs:
            steps = Checkpointer(S3Store(self.state["bucket"], f"{team_prefix(self.team)}jobs/{job}/", client=self.s3),
                                 keep=1).steps()
            out[job] = steps[0] if steps else None
        return out

    def metrics(self, job: str) -> list[tuple[str, list[dict]]]:
        """The job's metrics files, one per attempt (its rank 0's node): [(node, records)]."""
        found = []
        for path in (self.dir / "work" / "teams").glob(f"*/nodes/*/jobs/{job}/metrics-*.jsonl"):
            attempt = path.stem.rsplit("-", 1)[1]
            found.append((int(attempt) if attempt.isdigit() else 0, path.parents[2].name, read_metrics(path)))
        return [(node, recs) for _, node, recs in sorted(found)]


def run(args: argparse.Namespace, display: Display) -> pg.Summary:
    from infra.demo.account import preview_document  # lazy: boto3 (~0.2 s) off gpufleet's start-up

    started = time.monotonic()
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="gpufleet-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.work_dir:  # the box's jobs, as the teams' users where root runs it, must reach the box below it
        work.chmod(0o711)
    box_dir = work / "box"
    try:
        display.say(f"preview of stack {args.stack} (in-process, mock runtime)")
        doc = preview_document(args.stack)
        res = rs.stack_resources(doc)  # a stack the box cannot stand in for is refused here, in one line
        levels = [v.get("level") for v in doc.get("policy", {}).get("violations", [])]
        display.say(f"preview: {len(doc['resources'])} resources, {levels.count('mandatory')} mandatory and "
                    f"{len(levels) - levels.count('mandatory')} advisory policy findings")
        state = box_cli.start(box_dir, NODES, 0, args.stack)
        os.environ["SLURM_CONF"] = state["slurm_conf"]  # trainer.slurm.client's commands reach the box
        box = Box(box_dir, state)
        display.say(f"box up in {box_dir}: moto at {state['endpoint']} stands in for the account, slurmctld on "
                    f"port {state['slurmctld_port']}, CLOUD nodes {', '.join(state['nodes'])} powered down")
        (pair,) = box.submit("--job-id", PAIR_ID, "--nodes", str(NODES), "--", *train_args(args.steps))
        display.say(f"submitted {pair} (DDP on {NODES} nodes) to the queue {state['queue_url']}")
        wait_for_slurm(box, pair, args.timeout)
        jobs = box.submit("--job-id", JOB_ID, "--sweep", "lr=" + ",".join(sweep_values(args.jobs)), "--",
                          *train_args(args.steps))
        display.say(f"submitted the sweep: {len(jobs)} jobs, one job array")
        jobs = [pair, *jobs]
        summary, records = follow(args, box, jobs, res, doc, display)
        summary_json = {**dataclasses.asdict(summary), "ok": summary.ok, "wall_s": time.monotonic() - started,
                        "stack": args.stack, "queue_url": state["queue_url"], "bucket": state["bucket"],
                        "nodes": sorted(state["nodes"]),
                        "slurm_ids": {j: (r.get("slurm") or {}).get("id") for j, r in records.items()},
                        "attempts": {j: [{"n": a.get("n"), "nodes": a.get("nodes"), "reason": a.get("reason")}
                                         for a in r.get("attempts", [])] for j, r in records.items()}}
        display.final(job_table(display.table), *summary_table(summary, summary_json["wall_s"]))
        if args.summary_json:
            Path(args.summary_json).write_text(json.dumps(summary_json, indent=2) + "\n")
        return summary
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            box_cli.stop(box_dir)
            if not (args.work_dir or args.keep_dir):
                shutil.rmtree(work, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, previous)


def wait_for_slurm(box: Box, job: str, timeout_s: float) -> None:
    """Until the bridge has the job in Slurm (so that the sweep, sent next, queues behind it)."""
    deadline = time.monotonic() + timeout_s
    while not (box.records([job]).get(job) or {}).get("slurm"):
        if time.monotonic() > deadline:
            raise DemoFailure(f"job {job} did not reach Slurm within {timeout_s} s")
        time.sleep(POLL_S)


def follow(args, box: Box, jobs: list[str], res, doc: dict, display: Display) -> tuple[pg.Summary, dict]:
    """Watch the jobs, send the spot notice to the node of the job left running alone, until every job is
    done. Returns the summary and the jobs' records."""
    deadline = time.monotonic() + args.timeout
    notice: pg.Notice | None = None
    seen: dict[str, str] = {}
    checkpoints: dict[str, int | None] = {}
    last_ckpt_read = 0.0
    while True:
        records = box.records(jobs)
        files = {job: box.metrics(job) for job in jobs}
        if time.monotonic() - last_ckpt_read > 1.0:
            checkpoints, last_ckpt_read = box.checkpoints(jobs), time.monotonic()
        nodes = client.node_states()  # sinfo's: idle~ powered down, # powering up, * not responding
        table = pg.rows(jobs, files, args.steps, checkpoints, records, notice)
        for r in table:
            if seen.get(r.job) != r.state:
                display.say(f"{r.job}: {r.state}" + (f" on {r.node} (step {r.step})" if r.node != "-" else ""))
                seen[r.job] = r.state
            if r.state in ("failed", "cancelled"):
                rec = records[r.job]
                why = (rec.get("attempts") or [{}])[-1].get("reason") or rec.get("reason") or "no reason given"
                raise DemoFailure(f"job {r.job} {r.state}: {why}")
        if notice is None:
            target = pg.victim(table, sum(1 for s in nodes.values() if s.startswith("idle")))  # ~ # * too
            if target:
                box_cli.send_notice(box.state, target.node)
                notice = pg.Notice(target.node, target.job, time.time(), target.step)
                display.say(f"spot interruption notice to {target.node} while {target.job} is at step "
                            f"{target.step}")
        display.update(table, "   ".join(f"{n}: {s}" for n, s in sorted(nodes.items())))
        if all(r.state == "done" for r in table):
            nodes_of = {r.job: r.nodes for r in table}
            return pg.summarize(jobs, files, args.steps, notice, res.instance_types,
                                (doc.get("cost", {}).get("partitions") or [{}])[0].get("prices", {}), nodes_of), records
        if time.monotonic() > deadline:
            raise DemoFailure(f"the jobs did not finish within {args.timeout} s")
        time.sleep(POLL_S)


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return execute(args)


def execute(args: argparse.Namespace) -> int:
    """Run the demo of checked arguments; its exit status (0, 1, 2 or 130), every failure told in one line."""
    previous = signal.signal(signal.SIGTERM, _sigterm)
    display = Display()
    try:
        with display:
            summary = run(args, display)
    except KeyboardInterrupt:
        print("interrupted: every process stopped", file=sys.stderr)
        return 130
    except (ConfigError, rs.PreviewMismatch, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DemoFailure as exc:
        print(f"error: demo failed: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 one line, no traceback
        print(f"error: demo failed: {one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not summary.ok:
        print(f"error: demo failed: {'; '.join(summary.failures)}", file=sys.stderr)
        return 1
    return 0
