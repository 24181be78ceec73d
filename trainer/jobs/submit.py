"""`python -m trainer submit (--stack NAME | --queue-url URL [--bucket B]) [--image REF | --workdir DIR | --trainer] [flags] -- ARGV`.

Enqueues one job, or with ``--sweep`` the grid of all combinations (one job each, ids derived from the
values). The kind: ``--trainer`` (the default) runs the built-in trainer with ARGV as its flags; ``--image``
runs ARGV in a container of that image; ``--workdir`` packs the directory into a code bundle
(``<bucket>/teams/<team>/code/<sha256>.tar.gz``, uploaded only when absent) and runs ARGV in it with the node's
Python.
Every job is checked against the job spec (trainer/jobs/job.schema.json; a trainer job's flags by train's
own parser) before anything is uploaded or sent: one bad job, nothing sent.
With a bucket (``--bucket``, GPUFLEET_BUCKET, or the outputs of ``--stack``), each job's queued record
(trainer.jobs.records) is written before its message is sent, so `gpufleet jobs list` shows it at once. A job
id is never silently reused: one whose job is not finished is refused, and a finished one's too unless
``--again`` asks for a new attempt of that job (its record keeps the earlier attempts; it resumes from its
checkpoints).
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
import time
import uuid
from dataclasses import replace

from trainer.errors import ArgumentParser, UsageError
from trainer.jobs import bundle
from trainer.jobs.commands import resolve
from trainer.jobs.queue import open_queue
from trainer.jobs.layout import team_base, team_prefix
from trainer.jobs.records import TERMINAL, RecordStore, UnknownJob, reused
from trainer.jobs.spec import Job, check_job_id, validate
from trainer.loop.config import FIELDS

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
SECRET_SOURCES = ("ssm", "keyvault")


def parse_sweep(text: str, kind: str = "trainer") -> tuple[str, list[str]]:
    """KEY=V1,V2 -> (key, values). Trainer jobs: KEY is a train flag (lr, --lr or batch_size; returned with
    dashes). Image and code jobs: KEY is an environment variable, also substituted for {KEY} in ARGV."""
    key, sep, values = text.partition("=")
    if kind == "trainer":
        name = key.strip().lstrip("-").replace("-", "_")
        if not sep or name not in FIELDS:
            raise UsageError(f"--sweep: {text!r} is not allowed; expected KEY=V1,V2,... with KEY a train flag "
                             f"({', '.join(n.replace('_', '-') for n in FIELDS)})")
        name = name.replace("_", "-")
    else:
        name = key.strip()
        if not sep or not ENV_NAME.match(name) or name.startswith("GPUFLEET_"):
            raise UsageError(f"--sweep: {text!r} is not allowed; expected KEY=V1,V2,... with KEY an environment "
                             "variable name (set in each job, and substituted for {KEY} in the command)")
    items = [v.strip() for v in values.split(",")]
    if not all(items) or len(set(items)) != len(items):
        raise UsageError(f"--sweep {key}: {values!r} is not allowed; expected distinct, non-empty values")
    return name, items


def parse_env(items: list[str], secrets: list[str]) -> dict:
    """--env K=V and --env-from K=ssm:NAME|keyvault:NAME -> the spec's env object."""
    env: dict = {}
    for flag, text in [("--env", t) for t in items] + [("--env-from", t) for t in secrets]:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag}: {text!r} is not allowed; expected KEY=VALUE")
        if key in env:
            raise UsageError(f"{flag}: {key} is given twice")
        if flag == "--env-from":
            source, colon, name = value.partition(":")
            if source not in SECRET_SOURCES or not colon or not name:
                raise UsageError(f"--env-from: {text!r} is not allowed; expected KEY=ssm:PARAMETER or "
                                 "KEY=keyvault:SECRET")
            env[key] = {source: name}
        else:
            env[key] = value
    return env


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def expand(base: Job, sweeps: list[tuple[str, list[str]]], max_nodes: int | None = None) -> list[Job]:
    """The grid: one job per combination, its id base.job_id plus each key-value pair; each one validated."""
    if base.kind == "trainer" and sweeps and any(
            a == "--checkpoint-uri" or a.startswith("--checkpoint-uri=") for a in base.args):
        raise UsageError("--checkpoint-uri: one location cannot be shared by the jobs of a sweep; leave it out "
                         "(each job then gets teams/<team>/jobs/<job_id>/ in the cluster's bucket)")
    keys = [k for k, _ in sweeps]
    if len(set(keys)) != len(keys):
        raise UsageError(f"--sweep: a key is swept twice ({', '.join(keys)})")
    jobs = []
    for combo in itertools.product(*(values for _, values in sweeps)):
        pairs = list(zip(keys, combo))
        job_id = check_job_id(".".join([base.job_id] + [f"{k}-{_slug(v)}" for k, v in pairs]), "--job-id")
        if base.kind == "trainer":
            job = replace(base, job_id=job_id, args=base.args + tuple(x for k, v in pairs for x in (f"--{k}", v)))
        else:
            command = tuple(_substitute(a, pairs) for a in base.command)
            job = replace(base, job_id=job_id, command=command, env={**base.env, **dict(pairs)})
        jobs.append(validate(job.to_dict(), max_nodes))
    if len({j.job_id for j in jobs}) != len(jobs):
        raise UsageError("--sweep: two combinations give the same job id; use values that differ in letters or digits")
    if len(jobs) > 1:  # one Slurm job array: the bridge gathers the members by the submit's nonce
        nonce = uuid.uuid4().hex
        jobs = [replace(j, array={"id": base.job_id, "nonce": nonce, "index": i, "count": len(jobs)})
                for i, j in enumerate(jobs)]
    return jobs


def _substitute(arg: str, pairs: list[tuple[str, str]]) -> str:
    for key, value in pairs:
        arg = arg.replace("{" + key + "}", value)
    return arg


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer submit", description=__doc__.strip(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", metavar="NAME", help="read the queue and bucket from this stack's outputs "
                                                   "(`pulumi stack output`)")
    p.add_argument("--team", metavar="NAME", help="the team the jobs are (records and code under teams/<team>/ in the "
                                                  "bucket); with --stack, sent to its queue, so they run under its "
                                                  "Slurm account (default: the stack's first team; without --stack "
                                                  "GPUFLEET_TEAM, else team default)")
    p.add_argument("--project-dir", default=".", metavar="DIR", help="where `pulumi stack output` runs")
    p.add_argument("--queue-url", help="the cluster's job queue URL (default GPUFLEET_QUEUE_URL)")
    p.add_argument("--bucket", help="the cluster's bucket (AWS: its name; Azure: the checkpoints container URL); "
                                    "--workdir uploads the bundle there, the job records go there "
                                    "(default GPUFLEET_BUCKET)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--image", metavar="REF", help="run ARGV in a container of this image")
    kind.add_argument("--workdir", metavar="DIR", help="pack DIR as a code bundle and run ARGV in it")
    kind.add_argument("--trainer", action="store_true", help="run the built-in trainer, ARGV its flags (default)")
    p.add_argument("--job-id", help="job id (default: job-<UTC time>); with --sweep, the prefix of every id")
    p.add_argument("--nodes", type=int, default=1, metavar="N", help="nodes of the job (default 1)")
    p.add_argument("--gpus-per-node", type=int, metavar="N", help="GPUs per node (default: all of the node's)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set in the job (repeatable)")
    p.add_argument("--env-from", action="append", default=[], metavar="KEY=ssm:NAME",
                   help="set in the job from an SSM parameter or Key Vault secret (keyvault:NAME) the node reads")
    p.add_argument("--timeout", type=int, metavar="S", help="seconds an attempt may run")
    p.add_argument("--retries", type=int, default=0, metavar="N", help="failed attempts retried (default 0); preemptions never count")
    p.add_argument("--retry-on", type=int, action="append", default=[], metavar="CODE",
                   help="exit statuses that always retry, never counting against --retries (repeatable)")
    p.add_argument("--max-nodes", type=int, metavar="N", help="the stack's largest node count (refuses bigger jobs)")
    p.add_argument("--max-bundle-mb", type=float, default=bundle.MAX_BYTES / bundle.MB, metavar="MB",
                   help="limit on the files --workdir packs (default and most %(default)g MB: what a node unpacks)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="every combination of these values (repeatable): train flags for --trainer, "
                        "environment variables (and {KEY} in ARGV) otherwise")
    p.add_argument("--again", action="store_true",
                   help="a new attempt of finished jobs of these ids (they resume from their checkpoints); without "
                        "it a job id that exists is refused")
    p.add_argument("--dry-run", action="store_true", help="print the jobs, upload and send nothing")
    return p


def main(argv: list[str]) -> int:
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser().parse_args(own)
    if args.stack:
        target = resolve(args.stack, args.project_dir, None, None, team=args.team)
        args.queue_url, args.bucket, args.team = target.queue_url, target.bucket, target.team
    args.queue_url = args.queue_url or os.environ.get("GPUFLEET_QUEUE_URL")
    args.bucket = args.bucket or os.environ.get("GPUFLEET_BUCKET")
    args.team = args.team or os.environ.get("GPUFLEET_TEAM") or None
    team_prefix(args.team)  # a bad name: one line, before anything is packed or sent
    if not args.queue_url and not args.dry_run:
        raise UsageError("--queue-url: missing; give --stack NAME or --queue-url (or GPUFLEET_QUEUE_URL)")
    kind = "image" if args.image else "code" if args.workdir else "trainer"
    base_id = check_job_id(args.job_id, "--job-id") if args.job_id else time.strftime("job-%Y%m%d-%H%M%S",
                                                                                      time.gmtime())
    packed = None
    fields = {}
    if kind == "trainer":
        fields["args"] = tuple(rest)
    else:
        if not rest:
            raise UsageError(f"--{'image' if kind == 'image' else 'workdir'}: no command; give it after --, "
                             "e.g. -- python train.py")
        fields["command"] = tuple(rest)
    if kind == "image":
        fields["image"] = args.image
    if kind == "code":
        if not args.bucket:
            raise UsageError("--workdir: --bucket is missing; the bundle goes to <bucket>/teams/<team>/code/ (the "
                             "stack's bucket, or on Azure its checkpoints container URL)")
        if not 0 < args.max_bundle_mb <= bundle.MAX_BYTES / bundle.MB:
            raise UsageError(f"--max-bundle-mb: {args.max_bundle_mb:g} is not allowed; expected more than 0 and at "
                             f"most {bundle.MAX_BYTES / bundle.MB:g} (a node unpacks no larger bundle)")
        packed = bundle.pack(args.workdir, int(args.max_bundle_mb * bundle.MB))
        fields["code"] = team_base(args.bucket, args.team) + packed.key
    base = Job(base_id, kind, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
               env=parse_env(args.env, args.env_from), timeout=args.timeout,
               retries={"on_error": args.retries, "on_exit_codes": args.retry_on}, **fields)
    jobs = expand(base, [parse_sweep(s, kind) for s in args.sweep], args.max_nodes)
    if args.dry_run:
        for job in jobs:
            print(job.to_json())
        return 0
    queue = open_queue(args.queue_url)
    book = None
    if args.bucket:
        book = RecordStore.of_bucket(args.bucket, args.team)
        for job in jobs:  # refuse a taken id before anything is uploaded or sent
            try:
                rec = book.get(job.job_id)
            except UnknownJob:
                continue
            state = rec["state"]
            if state not in TERMINAL:
                raise UsageError(f"--job-id: job {job.job_id} exists and is {state}; choose another id (or "
                                 "`gpufleet jobs cancel` it first)")
            if not args.again:
                raise UsageError(reused(job.job_id, state))
    else:
        print("note: no --bucket: no job records written (`gpufleet jobs list` shows these jobs once given "
              "--bucket or --stack)", file=sys.stderr)
    if packed is not None:
        uri, sent = bundle.upload(packed, team_base(args.bucket, args.team))
        print(f"code bundle {uri}: {packed.files} files, {packed.size / bundle.MB:.1f} MB, "
              f"{'uploaded' if sent else 'already there, not uploaded again'}")
    for job in jobs:
        if book is not None:
            book.create(job.to_dict(), again=args.again)
        queue.send(job.to_json())
        what = " ".join(job.args) if kind == "trainer" else " ".join(job.command)
        print(f"queued {job.job_id} ({kind}): {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
