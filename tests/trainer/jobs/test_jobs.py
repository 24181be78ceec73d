"""The job spec (one schema, version-0 messages migrated, the retry decision), code bundles (what is packed,
reproducibly, checked on fetch) and the user API off the cluster."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.trainer.gated import ROOT
from trainer.errors import UsageError
from trainer.jobs import api, bundle
from trainer.jobs.spec import SCHEMA_PATH, Job, migrate, parse_job, retry_decision, schema, validate

SHA = "0" * 64


def test_the_schema_names_every_field_of_the_job():
    props = schema()["properties"]
    assert list(props) == ["spec", "job_id", "kind", "args", "image", "code", "command", "nodes", "gpus_per_node",
                           "env", "timeout", "retries", "array", "attempts"]
    assert set(Job.__dataclass_fields__) == set(props) - {"spec"}
    assert SCHEMA_PATH.name == "job.schema.json" and props["kind"]["enum"] == ["trainer", "image", "code"]


def test_version_0_messages_are_migrated_to_trainer_jobs():
    assert migrate({"job_id": "j", "args": ["--steps", "2"]}) == {"spec": 1, "job_id": "j", "kind": "trainer",
                                                                  "args": ["--steps", "2"]}
    job = parse_job(json.dumps({"job_id": "j", "args": ["--steps", "2"]}))
    assert job == Job("j", "trainer", args=("--steps", "2"))
    assert validate(job.to_dict()) == job  # what submit sends is what the bridge reads
    with pytest.raises(UsageError, match=r"no \"spec\" field, and not a version-0 message"):
        parse_job(json.dumps({"job_id": "j", "image": "x"}))


@pytest.mark.parametrize("raw, message", [
    ({"kind": "image", "image": "a:1"}, "job j: 'command' is a required property"),
    ({"kind": "trainer", "args": [], "command": ["x"]}, "job j: kind 'trainer' takes args, not command"),
    ({"kind": "code", "code": "s3://b/code/abc.tar.gz", "command": ["x"]}, "job j: code: 's3://b/code/abc.tar.gz' "
                                                                           "does not match"),
    ({"kind": "image", "image": "a:1", "command": ["x"], "gpus": 2}, "job j: unknown field(s) gpus; expected spec,"),
    ({"kind": "image", "image": "team/Train:1", "command": ["x"]}, "image: 'team/Train:1' is not a valid image reference"),
    ({"kind": "image", "image": "a:1", "command": ["x"], "retries": {"on_error": -1}},
     "job j: retries.on_error: -1 is less than the minimum of 0"),
    ({"kind": "image", "image": "a:1", "command": ["x"], "env": {"X": 1}}, "job j: env.X: 1 is not valid"),
    # a pattern's end is the string's end: Python's `$` would take a trailing newline
    ({"kind": "image", "image": "a:1\n", "command": ["x"]}, "image: 'a:1\\n' is not a valid image reference"),
    ({"kind": "code", "code": f"s3://b/code/{'a' * 64}.tar.gz\n", "command": ["x"]}, "job j: code: 's3://b/code/"),
    ({"kind": "image", "image": "a:1", "command": ["x"], "env": {"X\n": "1"}}, "env: 'X\\n' is not an allowed"),
    # a lone surrogate (an argument of undecodable bytes) cannot be encoded: one line, not a traceback
    ({"kind": "image", "image": "a:1", "command": ["x"], "env": {"X": "\udcff"}}, "job j: env.X: not valid text"),
    ({"kind": "image", "image": "a:1", "command": ["x", "\ud800"]}, "job j: command[1]: not valid text"),
])
def test_bad_specs_are_one_line(raw, message):
    with pytest.raises(UsageError) as err:
        validate({"spec": 1, "job_id": "j", **raw})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_job_id_with_a_trailing_newline_is_refused_and_never_becomes_a_key():
    """A user saw `"run1\\n"` accepted and stored as jobs/run1\\n/record.json."""
    body = json.dumps({"spec": 1, "job_id": "run1\n", "kind": "image", "image": "a:1", "command": ["x"]})
    with pytest.raises(UsageError, match=r"^job: job_id: 'run1\\n' is not allowed; expected 1-128 letters"):
        parse_job(body)
    with pytest.raises(UsageError, match=r"^job j: command\[0\]: not valid text"):  # as the bridge reads a body
        parse_job('{"spec": 1, "job_id": "j", "kind": "image", "image": "a:1", "command": ["\\ud800"]}')


@pytest.mark.parametrize("ref", ["ubuntu", "ubuntu:22.04", "nvcr.io/nvidia/pytorch:24.05-py3",
                                 "localhost:5000/a/b_c:1", "123456789012.dkr.ecr.eu-west-1.amazonaws.com/gpufleet-dev:t",
                                 "public.ecr.aws/x/y@sha256:" + "a" * 64])
def test_valid_image_references(ref):
    assert validate({"spec": 1, "job_id": "j", "kind": "image", "image": ref, "command": ["x"]}).image == ref


def test_bundles_are_reproducible_and_hold_what_git_tracks(tmp_path):
    work = tmp_path / "w"
    (work / "src").mkdir(parents=True)
    (work / "src" / "a.py").write_text("A = 1\n")
    (work / "run.sh").write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o755)
    (work / "out").mkdir()
    (work / "out" / "big.ckpt").write_bytes(b"x" * 10)
    (work / ".gpufleetignore").write_text("out/\n*.pyc\n")
    first = bundle.pack(work)
    (work / "src" / "a.pyc").write_bytes(b"compiled")
    (work / "run.sh").touch()  # a new mtime changes nothing
    assert bundle.pack(work).sha256 == first.sha256
    assert bundle.files_of(work) == [".gpufleetignore", "run.sh", "src/a.py"]

    git = ["git", "-C", str(work), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "src/a.py", "run.sh"], check=True)
    assert bundle.files_of(work) == ["run.sh", "src/a.py"]  # in a repository: what git tracks
    assert bundle.files_of(work / "src") == ["a.py"]

    unpacked = bundle.unpack(_saved(bundle.pack(work), tmp_path), tmp_path / "job" / "code")
    assert sorted(p.relative_to(unpacked).as_posix() for p in unpacked.rglob("*") if p.is_file()) == \
        ["run.sh", "src/a.py"]
    assert (unpacked / "run.sh").stat().st_mode & 0o777 == 0o755


def _saved(b: bundle.Bundle, tmp_path):
    path = tmp_path / f"{b.sha256}.tar.gz"
    path.write_bytes(b.gzipped())
    return path


def test_a_bundle_whose_content_does_not_match_its_name_is_refused(tmp_path):
    store = tmp_path / "store"
    (store / "code").mkdir(parents=True)
    (store / "code" / f"{SHA}.tar.gz").write_bytes(gzip.compress(b"not what the name says"))
    with pytest.raises(ValueError, match="its content has SHA-256 .*, not the one it is named by"):
        bundle.fetch(f"{store}/code/{SHA}.tar.gz", tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())
    good = bundle.pack(tmp_path / "store")  # any directory; stored as submit stores it
    (store / "code" / f"{good.sha256}.tar.gz").write_bytes(good.gzipped())
    assert bundle.fetch(f"{store}/code/{good.sha256}.tar.gz", tmp_path / "cache").exists()


def test_a_cached_bundle_another_job_replaced_is_fetched_again_not_run(tmp_path):
    """Finding 2 of the isolation review: team A's job replaced team B's cached bundle, and B's next job ran A's
    code. The cache is checked against the bundle's name at every use."""
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "main.py").write_text("print('team b')\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "main.py").write_text("print('team a')\n")
    store = tmp_path / "store"
    (store / "code").mkdir(parents=True)
    b = bundle.pack(tmp_path / "b")
    (store / "code" / f"{b.sha256}.tar.gz").write_bytes(b.gzipped())
    uri = f"{store}/code/{b.sha256}.tar.gz"
    cached = bundle.fetch(uri, tmp_path / "cache")
    cached.write_bytes(bundle.pack(tmp_path / "a").gzipped())  # another job's code under B's name
    again = bundle.fetch(uri, tmp_path / "cache")
    code = bundle.unpack(again, tmp_path / "job" / "code")
    assert (code / "main.py").read_text() == "print('team b')\n"


def test_a_small_archive_of_a_huge_file_is_refused_before_it_is_unpacked(tmp_path):
    """Finding 8: the bundle limit was held at submit only; a 0.4 MB archive unpacked to 400 MB on the node."""
    import io
    import tarfile

    data = tmp_path / "bomb.tar.gz"
    with tarfile.open(data, "w:gz") as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 3 * bundle.MB
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert data.stat().st_size < 0.01 * bundle.MB
    with pytest.raises(ValueError, match=r"^code bundle bomb.tar.gz: its files are 3.0 MB unpacked, over the "
                                         r"bundle limit of 2 MB$"):
        bundle.unpack(data, tmp_path / "job" / "code", max_bytes=2 * bundle.MB)
    assert not (tmp_path / "job").exists()  # nothing written
    assert (bundle.unpack(data, tmp_path / "job" / "code") / "zeros.bin").stat().st_size == 3 * bundle.MB


@pytest.mark.parametrize("kind, name", [("link", "data"), ("file", "../outside.py"), ("file", "/etc/cron.d/x"),
                                        ("fifo", "pipe"), ("hardlink", "passwd")])
def test_a_bundle_member_that_is_not_a_file_below_its_root_is_refused_before_anything_is_written(tmp_path, kind,
                                                                                                name):
    """What pack writes is regular files below the root; an archive made otherwise is refused on the node in one
    line, whatever the Python's own tar filter (Debian 12's 3.11.2 has none)."""
    import io
    import tarfile

    data = tmp_path / "odd.tar.gz"
    with tarfile.open(data, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("main.py"), io.BytesIO(b""))
        info = tarfile.TarInfo(name)
        info.type = {"link": tarfile.SYMTYPE, "file": tarfile.REGTYPE, "fifo": tarfile.FIFOTYPE,
                     "hardlink": tarfile.LNKTYPE}[kind]
        info.linkname = "/etc/passwd" if kind in ("link", "hardlink") else ""
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError) as err:
        bundle.unpack(data, tmp_path / "job" / "code")
    assert str(err.value) == f"code bundle odd.tar.gz: member {name!r} is not a file below its root"
    assert not (tmp_path / "job").exists()


def test_user_api_off_the_cluster(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("GPUFLEET_CHECKPOINT_URI", "GPUFLEET_STOP_FILE", "GPUFLEET_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    assert api.checkpoint_uri() == "checkpoints" and api.info().job_id == "local"
    ckpt = api.Checkpointer()
    assert ckpt.restore() == (0, None)
    ckpt.save(3, {"model": {"w": torch.ones(2)}, "meta": {"epoch": 1}})
    step, state = api.Checkpointer().restore()
    assert step == 3 and torch.equal(state["model"]["w"], torch.ones(2)) and state["meta"] == {"epoch": 1}
    assert (tmp_path / "checkpoints" / "step-000000003.json").exists()  # the trainer's commit protocol
    stop = tmp_path / "stop"
    monkeypatch.setenv("GPUFLEET_STOP_FILE", str(stop))
    assert not api.stop_requested()
    stop.touch()
    assert api.stop_requested()


def test_retries_on_error_count_failures_and_timeouts_never_preemptions():
    assert retry_decision({}, [], 2) == (False, "1 failure(s), retries.on_error is 0")
    assert retry_decision({"on_error": 1}, [], 2) == (True, "retry 1 of 1 (retries.on_error)")
    failed = [{"outcome": "failed", "exit_status": 2}]
    assert retry_decision({"on_error": 1}, failed, 2) == (False, "2 failure(s), retries.on_error is 1")
    preempted = [{"outcome": "preempted", "exit_status": 75}] * 3
    assert retry_decision({"on_error": 1}, preempted, 2)[0]  # preemptions never count
    assert not retry_decision({"on_error": 1}, [{"outcome": "timeout", "exit_status": None}], 1)[0]


def test_an_exit_status_in_on_exit_codes_always_retries_and_never_counts():
    retries = {"on_error": 0, "on_exit_codes": [2]}
    earlier = [{"outcome": "failed", "exit_status": 2}] * 3
    assert retry_decision(retries, earlier, 2) == (True, "exit status 2 is in retries.on_exit_codes")
    assert retry_decision({"on_error": 1, "on_exit_codes": [2]}, earlier, 3) == (True, "retry 1 of 1 "
                                                                                 "(retries.on_error)")


@pytest.mark.slow
def test_the_example_resumes_exactly_through_the_api(tmp_path):
    """examples/train.py stopped after 3 steps (saved by api.Checkpointer) and rerun logs the losses of a run
    that was never stopped."""
    def run(uri, steps, metrics):
        env = {**os.environ, "GPUFLEET_CHECKPOINT_URI": str(uri)}
        subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), "--steps", str(steps), "--metrics",
                        str(metrics)], env=env, check=True, capture_output=True)
        return [json.loads(ln)["loss"] for ln in metrics.read_text().splitlines()]

    whole = run(tmp_path / "a", 6, tmp_path / "a.jsonl")
    run(tmp_path / "b", 3, tmp_path / "b.jsonl")
    assert run(tmp_path / "b", 6, tmp_path / "b.jsonl") == whole
