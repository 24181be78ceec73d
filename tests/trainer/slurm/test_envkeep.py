"""Records show a job's env names, never their values (issue 23, finding 9: DB_PASS, OPENAI_KEY and DATABASE_URL
were in clear in the record); the bridge keeps the values on the controller, for a retry that comes without them."""
from __future__ import annotations

import json
import stat

import pytest

from trainer.errors import UsageError
from trainer.jobs.records import new_record
from trainer.jobs.spec import HIDDEN, Job, parse_job
from trainer.slurm.envkeep import EnvKeep

ENV = {"DB_PASS": "hunter2", "OPENAI_KEY": "sk-live-1", "DATABASE_URL": "postgres://u:p@db/x",
       "HF_HOME": {"ssm": "/gpufleet/dev/hf"}}


def job(env=ENV) -> Job:
    return Job("j1", "code", code="s3://b/code/" + "0" * 64 + ".tar.gz", command=("python", "t.py"), env=dict(env))


def test_a_record_keeps_env_names_and_secret_references_never_values():
    rec = new_record(job().to_dict(), 1.0)
    assert rec["spec"]["env"] == {"DB_PASS": HIDDEN, "OPENAI_KEY": HIDDEN, "DATABASE_URL": HIDDEN,
                                  "HF_HOME": {"ssm": "/gpufleet/dev/hf"}}
    text = json.dumps(rec)
    assert not any(v in text for v in ("hunter2", "sk-live-1", "postgres://"))
    again = parse_job(json.dumps(rec["spec"]))  # what `jobs retry` sends is a valid message
    assert again.env == rec["spec"]["env"]


def test_the_bridge_fills_in_what_it_kept_and_nothing_else(tmp_path):
    keep = EnvKeep(tmp_path / "env")
    keep.keep(job())
    assert stat.S_IMODE((tmp_path / "env").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "env" / "j1.json").stat().st_mode) == 0o600
    retried = parse_job(json.dumps(new_record(job().to_dict(), 1.0)["spec"]))
    assert keep.fill(retried).env == ENV
    assert keep.fill(job({"A": "1"})).env == {"A": "1"}  # a message with its own values needs nothing kept
    keep.keep(job({"HF_HOME": {"ssm": "/gpufleet/dev/hf"}}))  # a new attempt without inline values
    with pytest.raises(UsageError) as missing:
        keep.fill(retried)
    assert str(missing.value) == ("job j1: env DATABASE_URL, DB_PASS, OPENAI_KEY: the value is not kept on this "
                                  "controller (records show env names only); submit the job again with its --env "
                                  "and --again")
