"""Where a team's things lie in the stack's bucket: each team's under ``teams/<team>/``, so a team's rights (its
submit role, its jobs' credentials) can be bounded to its own prefix.

    teams/<team>/jobs/<job_id>/          a job's record, checkpoints and log chunks (trainer.jobs.records, logs)
    teams/<team>/jobs-index/<shard>.json the records' index
    teams/<team>/code/<sha256>.tar.gz    code bundles (trainer.jobs.bundle)
    teams/<team>/data/                   the team's data sets, which its jobs read

A job's team is its Slurm account (who submitted it: the bridge submits under the account of the queue the
message came through); a job with no account is the default team's.
"""
from __future__ import annotations

from trainer.errors import UsageError
from trainer.slurm.accounts import TEAM_NAME

DEFAULT_TEAM = "default"  # infra.config's team when a stack names none
TEAMS = "teams/"


def store_base(bucket: str) -> str:
    """The bucket as a store URI: ``s3://<bucket>/``, or the Azure container URL or cos:// URI as given."""
    if "://" in bucket:
        return bucket.rstrip("/") + "/"
    return f"s3://{bucket}/"


def team_prefix(team: str | None) -> str:
    """``teams/<team>/`` (None: the default team's); UsageError for a name that is no team's."""
    team = team or DEFAULT_TEAM
    if not TEAM_NAME.match(team):
        raise UsageError(f"team {team!r} is not a team name (1-15 lowercase letters and digits, starting with a "
                         "letter)")
    return f"{TEAMS}{team}/"


def team_of_account(account: str | None) -> str:
    """The team of a Slurm account (a job submitted with sbatch): the account when it is a team's name, else the
    default team."""
    return account if account and TEAM_NAME.match(account) else DEFAULT_TEAM


def team_base(bucket: str, team: str | None) -> str:
    """The store URI of a team's part of the bucket."""
    return store_base(bucket) + team_prefix(team)


def job_uri(bucket: str, team: str | None, job_id: str) -> str:
    """A job's own prefix: where it checkpoints unless it names another place."""
    return f"{team_base(bucket, team)}jobs/{job_id}/"
