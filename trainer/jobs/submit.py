"""`python -m trainer submit --queue-url URL [--job-id ID] [--sweep KEY=V1,V2 ...] -- <train flags>`.

Enqueues one job, or with ``--sweep`` the grid of all combinations (one job each, ids derived
from the values). Every job's flags go through train's own parser first: if any job is invalid,
nothing is sent.
"""
from __future__ import annotations

import itertools
import json
import re
import sys
import time

from trainer.errors import ArgumentParser, UsageError
from trainer.jobs.queue import Job, check_job_id, open_queue, parse_job


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """KEY=V1,V2 -> (train flag name with dashes, values); KEY may be written lr, --lr or batch_size."""
    from trainer.loop.config import FIELDS

    key, sep, values = text.partition("=")
    name = key.strip().lstrip("-").replace("-", "_")
    if not sep or name not in FIELDS:
        raise UsageError(f"--sweep: {text!r} is not allowed; expected KEY=V1,V2,... with KEY a train flag "
                         f"({', '.join(n.replace('_', '-') for n in FIELDS)})")
    items = [v.strip() for v in values.split(",")]
    if not all(items) or len(set(items)) != len(items):
        raise UsageError(f"--sweep {key}: {values!r} is not allowed; expected distinct, non-empty values")
    return name.replace("_", "-"), items


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def expand(base_id: str, args: list[str], sweeps: list[tuple[str, list[str]]]) -> list[Job]:
    """The grid: one job per combination; its id is base_id plus each flag-value pair; checked by train's parser."""
    if sweeps and any(a == "--checkpoint-uri" or a.startswith("--checkpoint-uri=") for a in args):
        raise UsageError("--checkpoint-uri: one location cannot be shared by the jobs of a sweep; leave it out "
                         "(each job then gets jobs/<job_id>/ in the cluster's bucket)")
    keys = [k for k, _ in sweeps]
    if len(set(keys)) != len(keys):
        raise UsageError(f"--sweep: a flag is swept twice ({', '.join(keys)})")
    jobs = []
    for combo in itertools.product(*(values for _, values in sweeps)):
        job_id = ".".join([base_id] + [f"{k}-{_slug(v)}" for k, v in zip(keys, combo)])
        flags = [x for k, v in zip(keys, combo) for x in (f"--{k}", v)]
        job = Job(check_job_id(job_id, "--job-id"), args + flags)
        parse_job(json.dumps({"job_id": job.job_id, "args": job.args}))
        jobs.append(job)
    if len({j.job_id for j in jobs}) != len(jobs):
        raise UsageError("--sweep: two combinations give the same job id; use values that differ in letters or digits")
    return jobs


def main(argv: list[str]) -> int:
    own, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = ArgumentParser(prog="python -m trainer submit", description=__doc__.splitlines()[0])
    p.add_argument("--queue-url", required=True, help="the cluster's job queue URL")
    p.add_argument("--job-id", help="job id (default: job-<UTC time>); with --sweep, the prefix of every id")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="run every combination of these train flag values (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the jobs, send nothing")
    args = p.parse_args(own)
    base = check_job_id(args.job_id, "--job-id") if args.job_id else time.strftime("job-%Y%m%d-%H%M%S", time.gmtime())
    jobs = expand(base, train_args, [parse_sweep(s) for s in args.sweep])
    queue = None if args.dry_run else open_queue(args.queue_url)
    for job in jobs:
        body = json.dumps({"job_id": job.job_id, "args": job.args})
        if queue is None:
            print(body)
        else:
            queue.send(body)
            print(f"queued {job.job_id}: {' '.join(job.args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
