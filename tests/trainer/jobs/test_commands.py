"""Every trainer command on a fresh machine: one line, the right exit status, nothing half-done.

Missing credentials (no AWS keys, no Azure credential) and refused endpoints through real subprocesses
against a moto server, Azurite and closed loopback ports; node.json that is a list or a directory; bad
checkpoint and dataset locations; resuming with another model or changed flags; Ctrl-C (a real SIGINT)
in each command while it waits on a loopback server that accepts and never answers.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
import torch

from tests.conftest import free_port
from trainer.__main__ import main
from trainer.errors import UsageError
from trainer.loop.shards import write_shards
from trainer.loop.storage import local_path

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--model", "gpt-tiny", "--dataset", "synthetic", "--batch-size", "2", "--warmup-steps", "1",
        "--log-every", "100"]
NO_AWS = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
          "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull}


def run(argv: list[str], env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    environ = {**os.environ}
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return subprocess.run([sys.executable, "-m", "trainer", *argv], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=timeout)


def told(proc: subprocess.CompletedProcess, status: int) -> str:
    """The one error line of a command that exited ``status`` (log lines may come before it)."""
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr
    return errors[0]


@pytest.fixture
def sqs_queue(moto_endpoint):
    return boto3.client("sqs").create_queue(QueueName="jobs")["QueueUrl"]


@pytest.fixture
def text_dir(tmp_path) -> Path:
    src = tmp_path / "text"
    src.mkdir()
    (src / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    (src / "b.txt").write_text("pack my box with five dozen liquor jugs\n" * 30)
    return src


# --- credentials and endpoints ----------------------------------------------------------------------

def test_no_aws_credentials_is_one_line_exit_2_in_every_command(sqs_queue, text_dir, tmp_path):
    boto3.client("s3").create_bucket(Bucket="ckpt", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    commands = {
        "submit": ["submit", "--queue-url", sqs_queue, "--", "--steps", "2"],
        "train": ["train", *TINY, "--steps", "2", "--checkpoint-uri", "s3://ckpt/run",
                  "--metrics-file", str(tmp_path / "m.jsonl")],
        "shards": ["shards", str(text_dir), "--out", "s3://ckpt/shards", "--record-bytes", "33"],
    }
    for name, argv in commands.items():
        line = told(run(argv, NO_AWS), 2)
        assert "no usable AWS credentials" in line and "AWS_ACCESS_KEY_ID" in line and "AWS_PROFILE" in line, name
    assert not (tmp_path / "m.jsonl").exists()  # train stopped before step 1
    assert "Contents" not in boto3.client("s3").list_objects_v2(Bucket="ckpt")  # nothing half-written


def test_a_refused_endpoint_is_one_line_exit_1():
    closed = f"http://127.0.0.1:{free_port()}"
    proc = run(["submit", "--queue-url", f"{closed}/123456789012/jobs", "--", "--steps", "2"],
               {"AWS_ENDPOINT_URL": closed, "AWS_MAX_ATTEMPTS": "1"})
    assert told(proc, 1) == (f"error: cannot connect to {closed}/; check the network, or AWS_ENDPOINT_URL if "
                             "it points at an emulator")


def test_no_azure_credential_is_one_line_exit_2(text_dir, tmp_path):
    env = {"AZURE_STORAGE_CONNECTION_STRING": None, "AZURE_STORAGE_ACCOUNT": "gpufleetnone",
           "AZURE_CLIENT_ID": None, "AZURE_TENANT_ID": None, "AZURE_CLIENT_SECRET": None,
           "IDENTITY_ENDPOINT": None, "MSI_ENDPOINT": None, "HOME": str(tmp_path)}  # no CLI or cache login
    for argv in (["shards", str(text_dir), "--out", "az://data/shards", "--record-bytes", "33"],
                 ["submit", "--queue-url", "https://gpufleetnone.queue.core.windows.net/jobs", "--", "--steps", "2"],
                 ["train", *TINY, "--steps", "2", "--checkpoint-uri", "az://ckpt/run"]):
        line = told(run(argv, env), 2)
        assert "no usable Azure credential" in line and "AZURE_STORAGE_CONNECTION_STRING" in line, argv[0]


def test_a_refused_azure_endpoint_is_a_fault_in_one_line():
    """The error azure-core raises for a closed port (without its minute of retries) is told as a Fault."""
    from azure.storage.blob import BlobServiceClient

    from trainer.clouds import explain
    from trainer.errors import Fault

    conn = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
            f"BlobEndpoint=http://127.0.0.1:{free_port()}/devstoreaccount1;")
    with pytest.raises(Exception) as err:
        BlobServiceClient.from_connection_string(conn, retry_total=0).get_container_client("c").exists()
    import trainer.clouds.azure  # noqa: F401  (explain asks the clouds in use)

    told = explain(err.value)
    assert isinstance(told, Fault) and "\n" not in str(told)
    assert str(told).startswith("cannot connect to the Azure Storage endpoint (") and "emulator" in str(told)


# --- node.json --------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    ([1, 2], "expected a JSON object, got a list"),
    ({"asg_name": ""}, "node.asg_name: expected a non-empty string"),
    ({"cloud": "gcp"}, "node.cloud: 'gcp' is not one of aws, azure"),
    ({"aws": {"job_role_arn": "arn:aws:iam::123456789012:role/job"}}, "node.aws: missing bucket"),
    ("dir", "cannot read it (Is a directory)"),
])
def test_a_bad_node_json_is_one_line_in_preflight(content, message, tmp_path):
    path = tmp_path / "node.json"
    if content == "dir":
        path.mkdir()
    else:
        path.write_text(json.dumps(content))
    line = told(run(["preflight", "--node-json", str(path), "--instance-type", "g5.xlarge"]), 2)
    assert line.startswith(f"error: --node-json: {path}") and message in line, line


# --- locations --------------------------------------------------------------------------------------

def test_a_bad_checkpoint_location_is_refused_before_step_1(tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    assert main(["train", *TINY, "--steps", "2", "--checkpoint-uri", "/etc/hostname/ck",
                 "--metrics-file", str(metrics)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: --checkpoint-uri /etc/hostname/ck: cannot hold checkpoints (Not a directory); "
        "give a writable directory or bucket prefix")
    assert not metrics.exists()
    ok = tmp_path / "ck"
    assert main(["train", *TINY, "--steps", "1", "--checkpoint-uri", str(ok)]) == 0
    assert sorted(p.name for p in ok.iterdir()) == ["step-000000001", "step-000000001.json"]  # probe removed


def test_file_uris_take_an_absolute_path_and_no_host(tmp_path, capsys):
    assert local_path(f"file://{tmp_path}/x") == f"{tmp_path}/x"
    assert local_path(f"file://localhost{tmp_path}/x") == f"{tmp_path}/x"
    with pytest.raises(UsageError, match=r"'file://relative/x': a file:// URI names no host; write "
                                         r"file:///absolute/path \(or the plain path 'relative/x'\)"):
        local_path("file://relative/x")
    assert main(["train", *TINY, "--steps", "1", "--checkpoint-uri", "file://relative/x"]) == 2
    assert "names no host" in capsys.readouterr().err
    assert not Path("/x").exists()


def test_model_and_dataset_that_are_not_what_they_should_be(text_dir, tmp_path, capsys):
    assert main(["train", "--model", "os:path", "--steps", "1", "--checkpoint-uri", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "error: --model: 'os:path' is not a callable factory (module)")
    assert main(["train", "--model", "os:getcwd", "--steps", "1", "--checkpoint-uri", str(tmp_path / "a")]) == 2
    assert "returned str, not a torch.nn.Module" in capsys.readouterr().err
    assert main(["train", "--model", "gpt-tiny", "--dataset", str(text_dir), "--steps", "1",
                 "--checkpoint-uri", str(tmp_path / "b")]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert f"error: --dataset: {text_dir} is not a shard directory" in line
    assert line.endswith("make shards with python -m trainer shards --out LOCATION --record-bytes 33 SOURCE...")


def test_shards_of_another_record_size_are_refused_in_both_directions(text_dir, tmp_path, capsys):
    out = tmp_path / "shards"
    first = write_shards([str(text_dir)], str(out), 33, shard_bytes=1000)
    before = sorted(p.name for p in out.iterdir())
    assert main(["shards", str(text_dir), "--out", str(out), "--record-bytes", "129"]) == 2
    assert capsys.readouterr().err == (f"error: --out {out}: holds shards of 33-byte records; refusing to add "
                                       "129-byte records to them; write to another location or remove the old "
                                       "shards\n")
    assert sorted(p.name for p in out.iterdir()) == before  # nothing added
    assert main(["train", "--model", "gpt-small", "--dataset", str(out), "--steps", "1",
                 "--checkpoint-uri", str(tmp_path / "ck")]) == 2
    assert f"--dataset: {out} holds shards of 33-byte records; the model needs 129-byte records" in \
        capsys.readouterr().err
    # The same record size again: the earlier run's extra shards go, so the directory is one set.
    assert write_shards([str(text_dir / "b.txt")], str(out), 33, shard_bytes=1000) == first[:2]
    assert sorted(p.name for p in out.iterdir()) == [".shards.json", *first[:2]]


# --- resume -----------------------------------------------------------------------------------------

def width_model():
    """gpt-tiny, or with WIDTH_MODEL_EMBD set a wider one of the same name (another model's shapes)."""
    from dataclasses import replace

    from trainer.loop.model import GPT, PRESETS

    return GPT(replace(PRESETS["gpt-tiny"], n_embd=int(os.environ.get("WIDTH_MODEL_EMBD", "32"))))


def test_resume_refuses_another_model_and_applies_changed_hyperparameters(tmp_path, capsys, monkeypatch,
                                                                         caplog):
    ck = str(tmp_path / "ck")
    assert main(["train", *TINY, "--steps", "2", "--checkpoint-uri", ck]) == 0
    assert main(["train", *TINY, "--steps", "3", "--model", "gpt-small", "--seed", "9", "--checkpoint-uri", ck]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --model gpt-small (was gpt-tiny), --seed 9 (was 0): the checkpoint of step 2 at {ck} "
        "was written with other values; resume with them or give another --checkpoint-uri")
    # Changed hyperparameters are applied from the next step, and said so.
    metrics = tmp_path / "m.jsonl"
    caplog.set_level("WARNING", logger="trainer")
    assert main(["train", *TINY, "--steps", "4", "--lr", "1e-2", "--checkpoint-uri", ck,
                 "--metrics-file", str(metrics)]) == 0
    assert "resuming with changed flags, applied from step 3 on: --steps 4 (was 2), --lr 0.01 (was 0.0003)" \
        in caplog.text
    from trainer.loop.optim import lr_factor

    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 4]
    assert [r["lr"] for r in records] == pytest.approx([1e-2 * lr_factor(s, 1, 4) for s in (2, 3)])
    # Same model name, other shapes: refused in one line, not a state_dict traceback.
    factory = ["--model", "tests.trainer.jobs.test_commands:width_model"]
    other = str(tmp_path / "other")
    assert main(["train", *TINY, *factory, "--steps", "1", "--checkpoint-uri", other]) == 0
    monkeypatch.setenv("WIDTH_MODEL_EMBD", "64")
    capsys.readouterr()
    assert main(["train", *TINY, *factory, "--steps", "2", "--checkpoint-uri", other]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(f"error: --model tests.trainer.jobs.test_commands:width_model: the checkpoint of step 1 "
                           f"at {other} holds the weights of another model (size mismatch for")


# --- Ctrl-C -----------------------------------------------------------------------------------------

class Silent:
    """A loopback server that accepts connections and never answers: a command waits on it until interrupted."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        return self

    def connections(self) -> int:
        """Accept what is waiting (and keep it open, unanswered); the number accepted so far."""
        self.sock.setblocking(False)
        self.held = getattr(self, "held", [])
        try:
            while True:
                self.held.append(self.sock.accept()[0])
        except BlockingIOError:
            pass
        return len(self.held)

    def __exit__(self, *exc):
        for conn in getattr(self, "held", []):
            conn.close()
        self.sock.close()


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(kids - found)
            found |= kids
    return found


def interrupt(argv: list[str], server: Silent, env: dict, count: int = 1) -> tuple[subprocess.CompletedProcess, set[int]]:
    """Start a command, wait until it is blocked on ``server``, press Ctrl-C ``count`` times (SIGINT);
    (result, its children then)."""
    proc = subprocess.Popen([sys.executable, "-m", "trainer", *argv], cwd=ROOT, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while server.connections() == 0:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    kids = descendants(proc.pid)
    for i in range(count):
        if i:
            time.sleep(0.5)  # two presses, not one signal delivered twice
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), kids


def gone(pids: set[int]) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = {p for p in pids if Path(f"/proc/{p}").exists()
                 and Path(f"/proc/{p}/stat").read_text().split(") ")[-1][0] != "Z"}
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("command", ["submit", "shards", "train"])
def test_ctrl_c_exits_130_without_a_traceback_or_a_child(command, text_dir, tmp_path):
    with Silent() as server:
        env = {"AWS_ENDPOINT_URL": server.url, "AWS_MAX_ATTEMPTS": "1"}
        argv = {
            "submit": ["submit", "--queue-url", f"{server.url}/123456789012/jobs", "--", "--steps", "2"],
            "shards": ["shards", str(text_dir), "--out", "s3://data/shards", "--record-bytes", "33"],
            # train: the first Ctrl-C asks for a checkpoint at the next step, the second aborts.
            "train": ["train", *TINY, "--steps", "2", "--dataset", "s3://data/shards",
                      "--checkpoint-uri", str(tmp_path / "ck")],
        }[command]
        proc, kids = interrupt(argv, server, env, count=2 if command == "train" else 1)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr
    assert gone(kids)
