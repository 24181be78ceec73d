"""The job spec (one schema, version-0 messages migrated), code bundles (what is packed, reproducibly, checked
on fetch), the user API off the cluster, and a bad spec that reaches a node (moto server): one log line, then
the dead-letter queue."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import boto3
import pytest
import torch

from tests.trainer.aws import counts
from tests.trainer.gated import ROOT
from trainer.errors import UsageError
from trainer.jobs import api, bundle
from trainer.jobs.spec import SCHEMA_PATH, Job, migrate, parse_job, schema, validate
from trainer.node.agent import Agent
from trainer.clouds.aws import NodePlatform, SqsJobQueue

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
    assert validate(job.to_dict()) == job  # what submit sends is what the agent reads
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
])
def test_bad_specs_are_one_line(raw, message):
    with pytest.raises(UsageError) as err:
        validate({"spec": 1, "job_id": "j", **raw})
    assert message in str(err.value) and "\n" not in str(err.value)


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


def test_a_bad_spec_that_reaches_a_node_is_dead_lettered_with_one_log_line(moto_endpoint, tmp_path, caplog):
    sqs = boto3.client("sqs")
    dlq = sqs.create_queue(QueueName="jobs-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName="jobs", Attributes={
        "VisibilityTimeout": "1", "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "2"})
    })["QueueUrl"]
    body = {"spec": 1, "job_id": "bad", "kind": "image", "image": "Not A Ref", "command": ["python"]}
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))
    a = Agent(SqsJobQueue(url), "ckpt", {}, tmp_path / "a", wait_s=0, nproc=0)
    assert a.serve(once=True) == 1
    (line,) = [r for r in caplog.records if "invalid job" in r.getMessage()]
    assert line.getMessage().endswith("invalid job, moved to the dead-letter queue: job bad: image: 'Not A Ref' is "
                                      "not a valid image reference; expected [registry/]name[:tag][@digest]")
    assert a.serve(once=True) == 0 and counts(sqs, url) == (0, 0)  # moved at once, not redelivered
    (moved,) = sqs.receive_message(QueueUrl=dlq)["Messages"]
    assert json.loads(moved["Body"]) == body


@pytest.fixture
def queue_and_bucket(moto_endpoint):
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return sqs, url


def code_job(tmp_path, job_id: str, main: str, **fields) -> str:
    work = tmp_path / f"src-{job_id}"
    work.mkdir()
    (work / "main.py").write_text(main)
    uri, _ = bundle.upload(bundle.pack(work), "ckpt")
    return Job(job_id, "code", code=uri, command=("python", "main.py"), **fields).to_json()


def test_a_code_job_runs_in_its_work_dir_with_the_job_environment_and_its_secrets(queue_and_bucket, tmp_path):
    sqs, url = queue_and_bucket
    boto3.client("ssm").put_parameter(Name="/gpufleet/dev/hf", Value="s3cr3t", Type="SecureString")
    dump = tmp_path / "env.json"
    main = ("import json, os, sys\n"
            f"json.dump({{'env': dict(os.environ), 'cwd': os.getcwd(), 'python': sys.executable}}, open({str(dump)!r}, 'w'))\n")
    body = code_job(tmp_path, "env-1", main, env={"MODE": "fast", "HF_TOKEN": {"ssm": "/gpufleet/dev/hf"}})
    sqs.send_message(QueueUrl=url, MessageBody=body)
    node = {"region": "eu-west-1", "stack": "dev"}
    a = Agent(SqsJobQueue(url), "ckpt", node, tmp_path / "a", wait_s=0, nproc=0, platform=NodePlatform(node))
    assert a.serve(once=True) == 0
    seen = json.loads(dump.read_text())
    ours = {k: v for k, v in seen["env"].items() if k.startswith("GPUFLEET_") and "LOOPBACK" not in k}  # not the guard's
    assert ours == {
        "GPUFLEET_JOB_ID": "env-1", "GPUFLEET_ATTEMPT": "1", "GPUFLEET_CHECKPOINT_URI": "s3://ckpt/jobs/env-1/",
        "GPUFLEET_NNODES": "1", "GPUFLEET_NODE_RANK": "0", "GPUFLEET_NPROC_PER_NODE": "1",
        "GPUFLEET_RDZV_ENDPOINT": "127.0.0.1:29400",
        "GPUFLEET_STOP_FILE": str(tmp_path / "a" / "jobs" / "env-1" / "control" / "stop")}
    assert (seen["env"]["MODE"], seen["env"]["HF_TOKEN"]) == ("fast", "s3cr3t")
    assert seen["cwd"] == str(tmp_path / "a" / "jobs" / "env-1" / "code")
    assert seen["env"]["PATH"].split(":")[0] == os.path.dirname(sys.executable)  # the node image's Python first
    assert counts(sqs, url) == (0, 0)


def test_a_missing_ssm_parameter_fails_that_job_with_one_line_naming_the_stacks_path(queue_and_bucket, tmp_path,
                                                                                      caplog):
    sqs, url = queue_and_bucket
    sqs.send_message(QueueUrl=url, MessageBody=code_job(tmp_path, "ssm-1", "print('never')\n",
                                                        env={"HF_TOKEN": {"ssm": "/gpufleet/dev/nope"}}))
    node = {"region": "eu-west-1", "stack": "dev"}
    a = Agent(SqsJobQueue(url), "ckpt", node, tmp_path / "a", wait_s=0, nproc=0, platform=NodePlatform(node))
    assert a.serve(once=True) == 1
    (line,) = [r.getMessage() for r in caplog.records if "cannot start" in r.getMessage()]
    assert line == ("job ssm-1: cannot start: env: ssm:/gpufleet/dev/nope: ParameterNotFound: no such SSM parameter; "
                    "create it below /gpufleet/dev/ (aws ssm put-parameter --type SecureString)")


def test_key_vault_secrets_reach_a_job_and_an_unreadable_one_fails_only_that_job(queue_and_bucket, tmp_path, caplog):
    """On an Azure node (the fakes of tests/trainer/fake_azure_identity.py), through the agent: a job whose secret
    is missing fails with one line naming it; the agent goes on and runs the next job with its secret."""
    from tests.trainer.test_registry import azure_platform
    from tests.trainer.fake_azure_identity import FakeAzureIdentity

    sqs, url = queue_and_bucket
    dump = tmp_path / "env.json"
    main = f"import json, os\njson.dump(dict(os.environ), open({str(dump)!r}, 'w'))\n"
    sqs.send_message(QueueUrl=url, MessageBody=code_job(tmp_path, "kv-1", main, env={"HF_TOKEN": {"keyvault": "nope"}}))
    with FakeAzureIdentity() as fake:
        fake.secrets["hf-token"] = "hf_abc"
        a = Agent(SqsJobQueue(url), "ckpt", {}, tmp_path / "a", wait_s=0, nproc=0, platform=azure_platform(fake))
        assert a.serve(once=True) == 1
        sqs.send_message(QueueUrl=url, MessageBody=code_job(tmp_path, "kv-2", main,
                                                            env={"HF_TOKEN": {"keyvault": "hf-token"}}))
        assert a.serve(once=True) == 0
    (line,) = [r.getMessage() for r in caplog.records if "cannot start" in r.getMessage()]
    assert line == ("job kv-1: cannot start: env: keyvault:nope: HTTP 404: no secret 'nope' in Key Vault gpufleet-kv; "
                    "create it there (az keyvault secret set)")
    assert json.loads(dump.read_text())["HF_TOKEN"] == "hf_abc"


def test_a_job_past_its_timeout_is_stopped_and_fails(queue_and_bucket, tmp_path, caplog):
    sqs, url = queue_and_bucket
    sqs.send_message(QueueUrl=url, MessageBody=code_job(tmp_path, "slow", "import time\ntime.sleep(600)\n", timeout=1))
    a = Agent(SqsJobQueue(url), "ckpt", {}, tmp_path / "a", wait_s=0, nproc=0, stop_grace_s=5)
    assert a.serve(once=True) == 1
    assert "job slow: stopped at its timeout of 1 s" in caplog.text
    assert (tmp_path / "a" / "jobs" / "slow" / "control" / "stop").exists()
    assert counts(sqs, url) == (0, 1)  # left for redelivery and the dead-letter queue


def test_a_stop_asked_while_the_job_is_set_up_is_applied_when_it_starts(queue_and_bucket, tmp_path, monkeypatch):
    """A cancel (or a heartbeat lapse) read while the bundle is fetched or the image pulled, before the job's
    process exists: the job is stopped as soon as it starts, not left to run to its end."""
    sqs, url = queue_and_bucket
    sqs.send_message(QueueUrl=url, MessageBody=code_job(tmp_path, "early", "import time\ntime.sleep(600)\n"))
    a = Agent(SqsJobQueue(url), "ckpt", {}, tmp_path / "a", wait_s=0, nproc=0, stop_grace_s=5)
    real_start = a.start

    def start(*args):
        a.stop_job()  # what Tracking does on a cancel, with no process to stop yet
        return real_start(*args)

    monkeypatch.setattr(a, "start", start)
    assert a.serve(once=True) == 75  # stopped at once: handed back
    assert counts(sqs, url) == (1, 0)


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
