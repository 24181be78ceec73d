"""`gpufleet jobs`: training jobs on a cluster's queue, and following them.

    gpufleet jobs submit ...                       (the flags of `python -m trainer submit`, forwarded unchanged)
    gpufleet jobs list [--state S] [--since T] [--format table|json]
    gpufleet jobs status ID [--format text|json]
    gpufleet jobs logs ID [--attempt N] [--follow]
    gpufleet jobs cancel ID
    gpufleet jobs retry ID

Every command but submit finds the jobs with ``--stack NAME`` (the stack's outputs, read by `pulumi stack
output`), or ``--bucket`` and ``--queue-url`` (or GPUFLEET_BUCKET, GPUFLEET_QUEUE_URL, GPUFLEET_DLQ_URL).
What they do is trainer.jobs.commands; this adds the console: flags, the table, the catalog's prices.
An unknown job, a stack without outputs, missing credentials: one line, exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import trainer.__main__
from infra import catalog, cli
from trainer.clouds import explain
from trainer.errors import Fault, UsageError
from trainer.jobs import commands

PROJECT_DIR = Path(__file__).resolve().parent.parent


def _submit(argv: list[str]) -> int:
    own = argv[:argv.index("--")] if "--" in argv else argv
    if "--stack" in own and not any(a == "--project-dir" or a.startswith("--project-dir=") for a in own):
        argv = ["--project-dir", str(PROJECT_DIR), *argv]  # `pulumi stack output` runs in the project
    return trainer.__main__.main(["submit", *argv])


def price_hour(instance_type: str) -> float | None:
    """The catalog's on-demand hourly price of an instance type (its cloud's currency), None when unknown."""
    try:
        return catalog.lookup(instance_type).price_hour
    except KeyError:
        return None


def _currency(rec: dict) -> str:
    types = [a.get("instance_type") for a in rec.get("attempts", []) if a.get("instance_type") in catalog.CATALOG]
    return catalog.CATALOG[types[0]].currency if types else ""


def _target(args):
    return commands.resolve(args.stack, args.project_dir, args.queue_url, args.bucket, args.dlq_url, team=args.team)


def _list(args) -> int:
    now = time.time()
    recs = _target(args).records().all(scan=args.scan)
    since = commands.parse_since(args.since, now) if args.since else None
    chosen = commands.select(recs, args.state, since)
    rows = [{**commands.row(r, now, price_hour), "currency": _currency(r)} for r in chosen]
    if args.format == "json":
        extra = ("gpu_hours", "cost", "currency")
        print(json.dumps([{**r, **{k: row[k] for k in extra}} for r, row in zip(chosen, rows)], indent=2))
        return 0
    from rich.console import Console  # lazy: rich (~30 ms) off gpufleet's start-up
    from rich.table import Table

    table = Table(title=f"{len(rows)} job(s)", expand=False)
    for col in ("id", "kind", "state", "attempts", "node", "progress", "age", "GPU-h", "cost"):
        table.add_column(col, justify="right" if col in ("attempts", "progress", "age", "GPU-h", "cost") else "left")
    style = {"succeeded": "green", "failed": "red", "cancelled": "dim", "preempted": "yellow", "running": "cyan"}
    for r in rows:
        cost = "-" if r["cost"] is None or not r["attempts"] else f"{r['cost']:.2f} {r['currency']}"
        table.add_row(r["job_id"], r["kind"], r["state"], str(r["attempts"]), r["node"] or "-", r["progress"] or "-",
                      r["age"], f"{r['gpu_hours']:.2f}", cost, style=style.get(r["state"].split()[0]))
    Console(width=max(120, Console().width)).print(table)
    return 0


def _status(args) -> int:
    target = _target(args)
    rec = target.records().get(args.job_id)
    now = time.time()
    doc = {**rec, **{k: v for k, v in commands.row(rec, now, price_hour).items() if k in ("gpu_hours", "cost")},
           "currency": _currency(rec), "checkpoint_uri": commands.checkpoint_uri(target, rec)}
    if args.format == "json":
        print(json.dumps(doc, indent=2))
        return 0
    lines = [f"job {rec['job_id']} ({rec['kind']}): {rec['state']}"
             + (f" ({rec['reason']})" if rec.get("reason") else "")
             + (" - cancel requested" if rec.get("cancel_requested") else ""),
             f"submitted {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(rec['submitted']))}, "
             f"{doc['gpu_hours']:.2f} GPU-hours"
             + ("" if doc["cost"] is None else f", {doc['cost']:.2f} {doc['currency']} so far"),
             f"checkpoints: {doc['checkpoint_uri']}"]
    progress = rec.get("progress")
    if progress:
        shown = ", ".join(f"{k} {v}" for k, v in progress.items() if v is not None and k != "at")
        lines.append(f"progress: {shown} ({commands.age(now - progress['at'])} ago)")
    for a in rec.get("attempts", []):
        took = commands.age(((a.get("end") or now) - a["start"])) if a.get("start") else "-"
        lines.append(f"  attempt {a['n']}: {','.join(a.get('nodes') or []) or '-'} ({a.get('instance_type') or '?'}, "
                     f"{a.get('gpus') if a.get('gpus') is not None else '?'} GPU(s)/node), {took}, "
                     + ("running" if a.get("end") is None else
                        f"exit {a.get('exit_status')}" + (f" ({a['reason']})" if a.get("reason") else "")))
    print("\n".join(lines))
    return 0


def _logs(args) -> int:
    out = sys.stdout.buffer
    where = None
    for attempt, node, data in commands.output(_target(args), args.job_id, args.attempt, args.follow,
                                               args.poll_interval):
        if (attempt, node) != where and (where is not None or args.follow):
            out.write(f"--- attempt {attempt}, node {node} ---\n".encode())
        where = (attempt, node)
        out.write(data)
        out.flush()
    if where is None and not args.follow:
        print(f"job {args.job_id}: no output shipped yet", file=sys.stderr)
    return 0


def _cancel(args) -> int:
    print(commands.cancel(_target(args), args.job_id))
    return 0


def _retry(args) -> int:
    print(commands.retry(_target(args), args.job_id))
    return 0


SUBCOMMANDS = {  # name -> (run, help)
    "list": (_list, "the jobs: id, kind, state, attempts, node, progress, age, GPU-hours and cost so far"),
    "status": (_status, "one job: its state, attempts, progress and checkpoint location"),
    "logs": (_logs, "a job's output (stdout and stderr), from the bucket"),
    "cancel": (_cancel, "cancel a job: a queued one never runs, a running one stops gracefully"),
    "retry": (_retry, "queue a failed, dead-lettered or cancelled job again, with its history"),
}


def _where(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", metavar="NAME", help="read the bucket and queues from this stack's outputs")
    p.add_argument("--team", metavar="NAME", help="whose jobs (each team's are under teams/<team>/ in the bucket) "
                                                  "and, with --stack, that team's queues (default: the stack's "
                                                  "first team; without --stack GPUFLEET_TEAM, else team default)")
    p.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help="where `pulumi stack output` runs")
    p.add_argument("--bucket", help="the stack's bucket (Azure: its checkpoints container URL); "
                                    "default GPUFLEET_BUCKET")
    p.add_argument("--queue-url", help="the job queue (default GPUFLEET_QUEUE_URL)")
    p.add_argument("--dlq-url", help="the dead-letter queue (default GPUFLEET_DLQ_URL, else the queue's own: "
                                     "SQS's redrive target, Azure <queue>-poison, CMQ <queue>-dead)")


def configure(parser: argparse.ArgumentParser) -> None:
    subs = cli.add_commands(parser, "jobs_command")
    cli.add_passthrough(subs, "submit", "queue one job, or a sweep of jobs; takes the flags of "
                                        "`python -m trainer submit` (`gpufleet jobs submit --help` lists them)")
    for name, (_, help) in SUBCOMMANDS.items():
        p = subs.add_parser(name, help=help, description=help)
        _where(p)
        if name != "list":
            p.add_argument("job_id", metavar="ID", help="the job's id")
        if name == "list":
            p.add_argument("--state", help="only jobs in this state (queued, running, preempted, succeeded, failed, "
                                           "cancelled)")
            p.add_argument("--since", metavar="T", help="only jobs submitted since: a duration (30m, 2h, 7d) or an "
                                                        "ISO date/time")
            p.add_argument("--format", choices=("table", "json"), default="table", help="output format")
            p.add_argument("--scan", action="store_true", help="read every record instead of the index")
        if name == "status":
            p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
        if name == "logs":
            p.add_argument("--attempt", type=int, metavar="N", help="this attempt (default: the latest)")
            p.add_argument("--follow", "-f", action="store_true",
                           help="keep printing new output until the job is finished")
            p.add_argument("--poll-interval", type=float, default=2.0, metavar="S", help="--follow: seconds "
                                                                                         "between looks")


def run(args: argparse.Namespace) -> int:
    if args.jobs_command == "submit":
        return _submit(args.argv)
    return told(lambda: SUBCOMMANDS[args.jobs_command][0](args))


def told(fn) -> int:
    """The trainer's user errors and the clouds' credential errors as one line: exit 2 (1 for a fault such as
    an endpoint that refuses connections)."""
    try:
        return fn()
    except Exception as exc:
        said = exc if isinstance(exc, (UsageError, Fault)) else explain(exc)
        if said is None:
            raise
        print(f"error: {said}", file=sys.stderr)
        return cli.EXIT_USAGE if isinstance(said, UsageError) else 1
