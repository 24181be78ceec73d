"""The env values of the jobs the bridge took, kept on the controller only: a job's record shows its env names,
never their values (a value may be a secret under a name the denylist does not know), so a job sent again
without them (`gpufleet jobs retry`, the bridge's own resubmission of a failure) gets them from here.

One file per job, ``<dir>/<job_id>.json`` (mode 0600, written whole through a rename), in a directory of the
bridge's own (0700; systemd's StateDirectory on the controller). Values of SSM and Key Vault names are not kept:
the node reads those at each start.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from trainer.errors import UsageError
from trainer.jobs.spec import Job, hidden_names

DEFAULT_DIR = "/var/lib/gpufleet/bridge/env"


class EnvKeep:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def _path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.json"  # job ids are checked: letters, digits, '.', '_', '-'

    def keep(self, job: Job) -> None:
        """The job's inline env values, as the job that is about to run has them (none: nothing kept)."""
        values = {k: v for k, v in job.env.items() if isinstance(v, str)}
        path = self._path(job.job_id)
        if not values:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(values, f)
        os.replace(tmp, path)

    def fill(self, job: Job) -> Job:
        """The job with the values of its hidden env names; UsageError (one line) for a value not kept here."""
        names = hidden_names(job)
        if not names:
            return job
        try:
            kept = json.loads(self._path(job.job_id).read_text())
        except (OSError, ValueError):
            kept = {}
        missing = [k for k in names if not isinstance(kept.get(k), str)]
        if missing:
            raise UsageError(f"job {job.job_id}: env {', '.join(missing)}: the value is not kept on this controller "
                             "(records show env names only); submit the job again with its --env and --again")
        return replace(job, env={**job.env, **{k: kept[k] for k in names}})
