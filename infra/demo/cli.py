"""`python -m infra.demo`: the cluster in a box (moto for the account, two local nodes running the real
agent), a sweep submitted with the real `submit`, a spot interruption mid-job, and the summary.

Exit status: 0 every job finished with no step lost; 1 anything else (one line on stderr); 2 bad
arguments; 130 interrupted (Ctrl-C), with every process stopped and the work directory removed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from infra.cli import ArgumentParser, UsageError
from infra.demo import progress as pg

NODES = 2
JOB_ID = "demo"
POLL_S = 0.25
DESCRIPTION = ("The cluster in a box: the stack's bucket and queues in a local moto server, two local nodes "
               "running the real agent, a sweep, a spot interruption and its resume, a summary.")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", default="dev", help="stack whose preview gives the resources and prices")
    p.add_argument("--jobs", type=_positive, default=5, help="jobs in the sweep (one learning rate each), >= 3")
    p.add_argument("--steps", type=_positive, default=150, help="optimizer steps per job (about 0.1 s each), >= 20")
    p.add_argument("--work-dir", metavar="DIR", help="use (and keep) this directory instead of a temporary one")
    p.add_argument("--keep-dir", action="store_true", help="keep the temporary directory (nodes' logs, metrics)")
    p.add_argument("--summary-json", metavar="FILE", help="also write the summary here as JSON")
    p.add_argument("--timeout", type=_positive, default=600, metavar="S", help="give up after S seconds")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected an integer >= 1")
    return int(text)


def check(args: argparse.Namespace) -> argparse.Namespace:
    if args.jobs < 3:
        raise UsageError(f"--jobs: {args.jobs} is not allowed; expected >= 3 (two nodes, and one job left to interrupt)")
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


def read_records(path: Path) -> list[dict]:
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
    from rich.table import Table

    t = Table(title="jobs", expand=False)
    for col in ("job", "node", "step", "loss", "ckpt", "state"):
        t.add_column(col, justify="right" if col in ("step", "loss", "ckpt") else "left")
    style = {"done": "green", "waiting": "dim"}
    for r in table:
        t.add_row(r.job, r.node, f"{r.step}/{r.total}", "-" if r.loss is None else f"{r.loss:.3f}",
                  "-" if r.checkpoint is None else str(r.checkpoint), r.state,
                  style=style.get(r.state, "yellow" if "notice" in r.state or "handed" in r.state else None))
    return t


def summary_table(s: pg.Summary, wall_s: float):
    from rich.table import Table

    t = Table(title="summary", show_header=False)
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_row("jobs done", f"{s.jobs_done}/{s.jobs}")
    t.add_row("steps lost", str(s.steps_lost))
    t.add_row("steps redone", str(s.steps_redone))
    if s.requeue_latency_s is not None:
        t.add_row(f"requeue latency ({s.interrupted_job}: {s.notice_node} -> {s.resumed_node})",
                  f"{s.requeue_latency_s:.1f} s")
        t.add_row(f"checkpoint after the notice (step {s.stopped_at})", f"{s.stop_s:.1f} s")
    t.add_row("training time (node-hours)", f"{s.node_hours:.5f}")
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
        from rich.console import Console

        self.console = Console(stderr=False, highlight=False)
        self.live = None
        self.events: list[str] = []
        self.nodes_line = ""
        self.table: list[pg.Row] = []
        self.t0 = time.monotonic()

    def __enter__(self):
        if self.console.is_terminal:
            from rich.live import Live

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
        from rich.console import Group
        from rich.text import Text

        return Group(job_table(self.table), Text(self.nodes_line), Text("\n".join(self.events[-10:]), style="dim"))

    def final(self, *renderables) -> None:
        self.__exit__(None, None, None)
        for r in renderables:
            self.console.print(r)


# --- the run ---------------------------------------------------------------------------------------

class DemoFailure(Exception):
    """Something in the demo's cluster went wrong; str() is one line."""


def run(args: argparse.Namespace, display: Display) -> pg.Summary:
    from infra.demo.cluster import Cluster, become_subreaper, preview_document

    started = time.monotonic()
    become_subreaper()
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="gpufleet-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(args.stack, work, keep_dir=bool(args.work_dir or args.keep_dir))
    try:
        display.say(f"preview of stack {args.stack} (in-process, mock runtime)")
        doc = preview_document(args.stack)
        levels = [v.get("level") for v in doc.get("policy", {}).get("violations", [])]
        display.say(f"preview: {len(doc['resources'])} resources, {levels.count('mandatory')} mandatory and "
                    f"{len(levels) - levels.count('mandatory')} advisory policy findings")
        cluster.start(doc)
        display.say(f"moto server at {cluster.endpoint} stands in for the account; work dir {work}")
        cluster.provision()
        for note in cluster.notes:
            display.say(note)
        instances = cluster.start_group(NODES)
        display.say(f"autoscaling group {cluster.res.group_name}: {', '.join(i[0] for i in instances)}")
        nodes = [cluster.add_node(f"node-{i + 1}", inst) for i, inst in enumerate(instances)]
        jobs = cluster.submit(JOB_ID, "lr=" + ",".join(sweep_values(args.jobs)), train_args(args.steps))
        display.say(f"submitted {len(jobs)} jobs to {cluster.queue_url}")
        summary, protected = follow(args, cluster, nodes, jobs, display)
        cluster.stop_agents()
        summary_json = {**dataclasses.asdict(summary), "ok": summary.ok, "wall_s": time.monotonic() - started,
                        "stack": args.stack, "queue_url": cluster.queue_url, "bucket": cluster.res.bucket_name,
                        "nodes": {n.name: n.instance_id for n in nodes}, "protected_seen": sorted(protected),
                        "notes": cluster.notes}
        display.final(job_table(display.table), *summary_table(summary, summary_json["wall_s"]))
        if args.summary_json:
            Path(args.summary_json).write_text(json.dumps(summary_json, indent=2) + "\n")
        return summary
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        try:
            cluster.close()
        finally:
            signal.signal(signal.SIGINT, previous)


class AgentLog:
    """New lines of a node's agent log (the agent's and its jobs' stderr): hand-backs and failures."""

    HANDED_BACK = re.compile(r"job (\S+): stopped after a checkpoint; message handed back")
    FAILED = re.compile(r"job \S+: failed with exit status .*")

    def __init__(self, path: Path):
        self.path, self.offset = path, 0
        self.handed_back: set[str] = set()

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        data = data[:data.rfind(b"\n") + 1]
        self.offset += len(data)
        for line in data.decode(errors="replace").splitlines():
            if m := self.HANDED_BACK.search(line):
                self.handed_back.add(m.group(1))
            if m := self.FAILED.search(line):
                raise DemoFailure(f"{self.path.parent.name}: {m.group(0)}")


def follow(args, cluster, nodes, jobs: list[str], display: Display) -> tuple[pg.Summary, set[str]]:
    """Start the nodes, watch the jobs, send the spot notice, until every job is done. Returns the summary
    and the nodes seen protected from scale-in (by their agent, in moto) while a job ran."""
    first, second = nodes
    deadline = time.monotonic() + args.timeout
    notice: pg.Notice | None = None
    reclaimed = False
    seen: dict[str, str] = {}
    checkpoints: dict[str, int | None] = {}
    logs: dict[str, AgentLog] = {}
    protected_seen: set[str] = set()

    def start(node) -> None:
        cluster.start_agent(node)
        logs[node.name] = AgentLog(node.log)
        display.say(f"{node.name} ({node.instance_id}, {node.instance_type}) runs the agent")

    def read_checkpoints() -> dict[str, int | None]:
        return {job: (steps[0] if (steps := cluster.checkpoint_steps(job)) else None) for job in jobs}

    start(first)
    last_ckpt_read = 0.0
    while True:
        for log in logs.values():
            log.read()
        handed_back = set().union(*(log.handed_back for log in logs.values()))
        files = {job: {n.name: recs for n in nodes if (recs := read_records(n.metrics_file(job)))} for job in jobs}
        if time.monotonic() - last_ckpt_read > 1.0:
            checkpoints, last_ckpt_read = read_checkpoints(), time.monotonic()
        table = pg.rows(jobs, files, args.steps, checkpoints, notice, handed_back)
        for r in table:
            if seen.get(r.job) != r.state:
                if r.state != "waiting":
                    display.say(f"{r.job}: {r.state} on {r.node} (step {r.step})")
                seen[r.job] = r.state
        if second.proc is None and any(r.step >= args.steps // 3 for r in table):
            start(second)  # a third of a job after the first, so that one job is left running alone at the end
        if notice is None and second.proc is not None:
            target = pg.victim(table, *cluster.queue_counts())
            if target:
                node = next(n for n in nodes if n.name == target.node)
                node.imds.spot_interruption()
                notice = pg.Notice(node.name, target.job, time.time(), target.step)
                display.say(f"spot interruption notice to {node.name} ({node.instance_id}) while {target.job} "
                            f"is at step {target.step}")
        for n in nodes:
            if n.proc is None or n.proc.poll() is None:
                continue
            if not (notice and n.name == notice.node):
                raise DemoFailure(f"the agent of {n.name} exited with status {n.proc.returncode} (see {n.log})")
            if not reclaimed:
                cluster.reclaim(n)
                reclaimed = True
                display.say(f"{n.name}: the agent took no more jobs and exited ({n.proc.returncode}); "
                            f"instance {n.instance_id} terminated in the group")
        protected = cluster.protected()
        protected_seen |= {n.name for n in nodes if protected.get(n.instance_id)}
        display.update(table, "   ".join(
            f"{n.name} {n.instance_id} {n.instance_type}: "
            + ("reclaimed" if reclaimed and n.name == notice.node else
               "scale-in protected" if protected.get(n.instance_id) else "idle" if n.proc else "not started")
            for n in nodes))
        if all(r.state == "done" for r in table):
            display.update(pg.rows(jobs, files, args.steps, read_checkpoints(), notice, handed_back), "")
            return pg.summarize(jobs, files, args.steps, notice, cluster.res.instance_types,
                                cluster.doc.get("cost", {}).get("prices", {})), protected_seen
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
    from infra.config import ConfigError
    from infra.demo.resources import PreviewMismatch

    previous = signal.signal(signal.SIGTERM, _sigterm)
    display = Display()
    try:
        with display:
            summary = run(args, display)
    except KeyboardInterrupt:
        print("interrupted: every process stopped", file=sys.stderr)
        return 130
    except (ConfigError, PreviewMismatch) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DemoFailure as exc:
        print(f"error: demo failed: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 one line, no traceback
        from infra.preview.runner import one_line

        print(f"error: demo failed: {one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not summary.ok:
        print(f"error: demo failed: {'; '.join(summary.failures)}", file=sys.stderr)
        return 1
    return 0
