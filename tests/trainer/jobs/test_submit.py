"""`python -m trainer submit`: one job or a sweep grid of any kind, all checked against the job spec (trainer
jobs by train's parser) before anything is uploaded or sent; code bundles content-addressed in moto's S3."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile

import boto3
import re

import pytest

from tests.trainer.gated import ROOT
from trainer.errors import UsageError
from trainer.jobs.spec import MAX_ARGS_BYTES, Job, parse_job
from trainer.jobs.submit import expand, parse_sweep


def test_parse_sweep():
    assert parse_sweep("lr=1e-3,3e-4") == ("lr", ["1e-3", "3e-4"])
    assert parse_sweep("--batch_size=8,16") == ("batch-size", ["8", "16"])
    with pytest.raises(UsageError, match=r"--sweep: 'learning=1' is not allowed; expected KEY=V1,V2,\.\.\. with KEY a train flag"):
        parse_sweep("learning=1")
    with pytest.raises(UsageError, match="expected distinct, non-empty values"):
        parse_sweep("lr=1,,2")


def test_grid_ids_derive_from_values():
    jobs = expand(Job("exp", args=("--steps", "100")), [("lr", ["1e-3", "3e-4"]), ("batch-size", ["8", "16"])])
    assert [j.job_id for j in jobs] == ["exp.lr-1e-3.batch-size-8", "exp.lr-1e-3.batch-size-16",
                                        "exp.lr-3e-4.batch-size-8", "exp.lr-3e-4.batch-size-16"]
    nonce = jobs[0].array["nonce"]  # one Slurm job array: every member names the sweep, its index and size
    assert re.fullmatch(r"[0-9a-f]{32}", nonce)
    assert jobs[1] == Job("exp.lr-1e-3.batch-size-16", args=("--steps", "100", "--lr", "1e-3", "--batch-size", "16"),
                          array={"id": "exp", "nonce": nonce, "index": 1, "count": 4})
    assert [j.array["index"] for j in jobs] == [0, 1, 2, 3] and {j.array["nonce"] for j in jobs} == {nonce}
    assert expand(Job("one", args=("--steps", "5")), []) == [Job("one", args=("--steps", "5"))]


def test_image_and_code_sweeps_set_the_environment_and_fill_the_command():
    base = Job("exp", "image", image="reg.example/team/train:1", command=("python", "t.py", "--lr", "{LR}"),
               env={"MODE": "fast"})
    jobs = expand(base, [parse_sweep("LR=0.1,0.01", "image")])
    assert [(j.job_id, j.command[-1], j.env) for j in jobs] == [
        ("exp.LR-0.1", "0.1", {"MODE": "fast", "LR": "0.1"}), ("exp.LR-0.01", "0.01", {"MODE": "fast", "LR": "0.01"})]
    with pytest.raises(UsageError, match="--sweep: 'GPUFLEET_X=1' is not allowed; expected KEY=V1,V2,... with KEY an "
                                         "environment variable name"):
        parse_sweep("GPUFLEET_X=1", "code")


def test_any_invalid_combination_refuses_the_whole_grid():
    with pytest.raises(UsageError, match=r"job exp.batch-size-0: --batch-size: '0' is not allowed"):
        expand(Job("exp"), [("batch-size", ["8", "0"])])
    with pytest.raises(UsageError, match="--checkpoint-uri: one location cannot be shared by the jobs of a sweep"):
        expand(Job("exp", args=("--checkpoint-uri", "s3://b/x")), [("lr", ["1", "2"])])
    with pytest.raises(UsageError, match="two combinations give the same job id"):
        expand(Job("exp"), [("model", ["a:b", "a/b"])])


@pytest.fixture
def queue(moto_endpoint):
    sqs = boto3.client("sqs")
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return sqs, sqs.create_queue(QueueName="jobs")["QueueUrl"]


def submit(*argv):
    return subprocess.run([sys.executable, "-m", "trainer", "submit", *argv], cwd=ROOT, capture_output=True, text=True)


def received(sqs, url) -> list[dict]:
    out = []
    while msgs := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        out += [json.loads(m["Body"]) for m in msgs]
    return out


def test_a_job_over_the_command_line_limit_is_refused_at_submit_in_one_line(queue):
    _, url = queue
    proc = submit("--queue-url", url, "--job-id", "big", "--", "--model", "m" * (MAX_ARGS_BYTES + 1))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "job big: its args are" in proc.stderr and "a command line can safely carry" in proc.stderr


def test_submit_sends_the_grid(queue):
    sqs, url = queue
    proc = submit("--queue-url", url, "--job-id", "sweep1", "--sweep", "lr=1e-3,3e-4", "--sweep", "seed=1,2",
                  "--", "--steps", "50", "--model", "gpt-tiny")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("queued sweep1.") == 4
    bodies = received(sqs, url)
    assert sorted(b["job_id"] for b in bodies) == ["sweep1.lr-1e-3.seed-1", "sweep1.lr-1e-3.seed-2",
                                                    "sweep1.lr-3e-4.seed-1", "sweep1.lr-3e-4.seed-2"]
    for b in bodies:
        assert b["spec"] == 1 and b["kind"] == "trainer"
        assert parse_job(json.dumps(b)).args[:4] == ("--steps", "50", "--model", "gpt-tiny")  # what the bridge accepts


def test_workdir_is_uploaded_once_by_content(queue, tmp_path):
    sqs, url = queue
    work = tmp_path / "proj"
    (work / "pkg").mkdir(parents=True)
    (work / "train.py").write_text("print('hi')\n")
    (work / "pkg" / "m.py").write_text("X = 1\n")
    (work / "data.bin").write_bytes(b"x" * 1000)
    (work / ".gpufleetignore").write_text("# data stays out\ndata.bin\n")
    argv = ["--queue-url", url, "--bucket", "ckpt", "--workdir", str(work), "--job-id", "c1", "--env", "A=1",
            "--", "python", "train.py"]
    first = submit(*argv)
    refused = submit(*argv)  # c1 is queued (its record says so): a second job of that id is refused
    assert (refused.returncode, refused.stderr.splitlines()[-1]) == (
        2, "error: --job-id: job c1 exists and is queued; choose another id (or `gpufleet jobs cancel` it first)")
    second = submit(*[("c2" if a == "c1" else a) for a in argv])
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "3 files" in first.stdout and ", uploaded" in first.stdout
    assert "already there, not uploaded again" in second.stdout
    (one, two) = received(sqs, url)
    assert {**one, "job_id": "c2"} == two and one["kind"] == "code" and one["command"] == ["python", "train.py"] and one["env"] == {"A": "1"}
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ckpt", Prefix="teams/default/code/")["Contents"]]
    assert keys == [one["code"].removeprefix("s3://ckpt/")]
    body = boto3.client("s3").get_object(Bucket="ckpt", Key=keys[0])["Body"].read()
    assert sorted(tarfile.open(fileobj=io.BytesIO(body)).getnames()) == [".gpufleetignore", "pkg/m.py", "train.py"]


def test_a_finished_jobs_id_is_refused_unless_a_new_attempt_is_asked_for(queue):
    # issue 23, finding 6: a second submit of a finished job's id replaced its record, and the new job restored the
    # first one's weights (its checkpoints are under the id)
    from trainer.jobs.records import RecordStore, claim, end

    sqs, url = queue
    argv = ["--queue-url", url, "--bucket", "ckpt", "--job-id", "done1", "--", "--steps", "5"]
    assert submit(*argv).returncode == 0
    book = RecordStore.of_bucket("ckpt", None)
    book.update("done1", lambda r: end(claim(r, {"node": "n1", "gpus": 1}, 1.0), "succeeded", 0, None, 2.0))
    before = book.get("done1")
    refused = submit(*argv[:-1], "9")
    assert (refused.returncode, refused.stderr.splitlines()[-1:]) == (2, [
        "error: --job-id: job done1 exists (succeeded); ids are not reused: choose another id, or pass --again for "
        "a new attempt of that job (it resumes from its checkpoints)"])
    assert book.get("done1") == before and len(received(sqs, url)) == 1  # nothing written, nothing sent
    again = submit("--again", *argv[:-1], "9")
    assert again.returncode == 0, again.stderr
    rec = book.get("done1")
    assert rec["state"] == "queued" and rec["spec"]["args"] == ["--steps", "9"]
    assert rec["attempts"] == before["attempts"]
    assert [m["args"] for m in received(sqs, url)] == [["--steps", "9"]]


def test_the_same_job_id_in_two_teams_is_two_jobs_and_neither_touches_the_other(queue, tmp_path, monkeypatch):
    # issue 23, finding 6: team B's submit of an id team A used wiped A's record, and B's job restored A's weights
    # (its checkpoints were under the id): each team's jobs are under its own prefix now (the box's two teams,
    # their queues in moto)
    from trainer.jobs.commands import Target, checkpoint_uri
    from trainer.jobs.records import RecordStore, claim, end

    sqs, vision = queue
    nlp = sqs.create_queue(QueueName="jobs-nlp")["QueueUrl"]
    (tmp_path / "state.json").write_text(json.dumps({
        "endpoint": "http://127.0.0.1:1", "region": "eu-west-1", "bucket": "ckpt", "queue_url": vision,
        "team_queues": {"nlp": nlp, "vision": vision}}))  # moto's endpoint, set by the fixture, stays
    monkeypatch.setenv("GPUFLEET_BOX_DIR", str(tmp_path))
    argv = ["--stack", "box", "--job-id", "shared", "--", "--steps", "5"]
    assert submit(*argv).returncode == 0  # no --team: the stack's first queue, vision's
    visions = RecordStore.of_bucket("ckpt", "vision")
    visions.update("shared", lambda r: end(claim(r, {"node": "n1", "gpus": 1}, 1.0), "succeeded", 0, None, 2.0))
    before = visions.get("shared")
    theirs = submit("--team", "nlp", *argv[:-1], "7")  # no --again: nlp has no job of that id
    assert theirs.returncode == 0, theirs.stderr
    assert visions.get("shared") == before and len(received(sqs, vision)) == 1
    nlps = RecordStore.of_bucket("ckpt", "nlp").get("shared")
    assert (nlps["state"], nlps["attempts"], nlps["spec"]["args"]) == ("queued", [], ["--steps", "7"])
    assert [m["args"] for m in received(sqs, nlp)] == [["--steps", "7"]]
    assert checkpoint_uri(Target("ckpt", team="nlp"), nlps) == "s3://ckpt/teams/nlp/jobs/shared/"
    assert checkpoint_uri(Target("ckpt", team="vision"), before) == "s3://ckpt/teams/vision/jobs/shared/"
    refused = submit("--team", "nlp", *argv)  # within a team an id is still not reused
    assert (refused.returncode, refused.stderr.splitlines()[-1:]) == (2, [
        "error: --job-id: job shared exists and is queued; choose another id (or `gpufleet jobs cancel` it first)"])
    bad = submit("--team", "../vision", "--queue-url", nlp, "--bucket", "ckpt", "--", "--steps", "1")
    assert (bad.returncode, bad.stderr.splitlines()[-1:]) == (2, [
        "error: team '../vision' is not a team name (1-15 lowercase letters and digits, starting with a letter)"])


def test_image_job_is_sent_as_spec_1(queue):
    sqs, url = queue
    proc = submit("--queue-url", url, "--image", "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/train:1.4",
                  "--job-id", "i1", "--nodes", "2", "--max-nodes", "4", "--env-from", "HF_TOKEN=ssm:/team/hf",
                  "--", "torchrun", "train.py")
    assert proc.returncode == 0, proc.stderr
    (body,) = received(sqs, url)
    assert body == {"spec": 1, "job_id": "i1", "kind": "image",
                    "image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/train:1.4",
                    "command": ["torchrun", "train.py"], "nodes": 2, "gpus_per_node": None,
                    "env": {"HF_TOKEN": {"ssm": "/team/hf"}}, "timeout": None,
                    "retries": {"on_error": 0, "on_exit_codes": []}}


@pytest.mark.parametrize("argv, message", [
    (["--job-id", "j", "--", "--steps", "0"], "error: job j: --steps: '0' is not allowed; expected an integer >= 1"),
    (["--sweep", "precision=fp32,fp8", "--", "--steps", "5"], "--precision: 'fp8' is not allowed"),
    (["--job-id", "has space"], "--job-id: 'has space' is not allowed"),
    (["--job-id", "j", "--", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--job-id", "j", "--image", "Not A Ref", "--", "python"], "image: 'Not A Ref' is not a valid image reference"),
    (["--job-id", "j", "--image", "train:1"], "--image: no command; give it after --"),
    (["--job-id", "j", "--image", "train:1", "--nodes", "3", "--max-nodes", "2", "--", "python"],
     "job j: nodes: 3 is not allowed; the stack runs at most 2 node(s)"),
    (["--job-id", "j", "--image", "train:1", "--env", "DB_PASSWORD=hunter2", "--", "python"],
     "env DB_PASSWORD: a secret does not belong in the job message"),
    (["--job-id", "j", "--image", "train:1", "--env", "GPUFLEET_JOB_ID=x", "--", "python"],
     "env: 'GPUFLEET_JOB_ID' is not an allowed variable name"),
    (["--job-id", "j", "--workdir", ".", "--", "python"], "--workdir: --bucket is missing"),
    (["--job-id", "j", "--bucket", "ckpt", "--workdir", "{big}", "--max-bundle-mb", "1", "--", "python"],
     "MB to pack, over the bundle limit of 1 MB (largest: big.bin 2.0 MB)"),
    (["--image", "a:1", "--workdir", "."], "argument --workdir: not allowed with argument --image"),
    (["--job-id", "run1\n", "--", "--steps", "5"], "--job-id: 'run1\\n' is not allowed"),
    (["--job-id", "j", "--bucket", "ckpt", "--workdir", ".", "--max-bundle-mb", "500", "--", "python"],
     "--max-bundle-mb: 500 is not allowed; expected more than 0 and at most 200 (a node unpacks no larger bundle)"),
    (["--job-id", "j", "--image", "train:1", "--env", "K=\udcff", "--", "python"], "job j: env.K: not valid text"),
])
def test_invalid_input_sends_nothing(queue, argv, message, tmp_path):
    sqs, url = queue
    (tmp_path / "big.bin").write_bytes(b"\0" * 2_000_000)
    proc = submit("--queue-url", url, *[a.format(big=tmp_path) for a in argv])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert received(sqs, url) == []
    assert "Contents" not in boto3.client("s3").list_objects_v2(Bucket="ckpt")  # nothing uploaded
