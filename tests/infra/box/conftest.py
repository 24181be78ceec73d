"""A running box for the tests of this folder: `gpufleet box up` on a real Slurm (slurmctld, CLOUD nodes as local
slurmd started by power saving), the bridge, moto and fake metadata endpoints, all on loopback.

One box serves the module that asks for it (starting one takes about 10 s); its teardown is `gpufleet box down`,
and checks that no process of the box is left.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def gpufleet(*argv: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def wait_for(predicate, timeout_s: float = 180, what: str = "condition", every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


@dataclass
class Box:
    dir: Path
    state: dict

    def env(self, **more: str) -> dict[str, str]:
        """A user's shell after `eval $(gpufleet box env)`: no AWS settings of its own."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SLURM_", "GPUFLEET_"))}
        env.update(SLURM_CONF=self.state["slurm_conf"], GPUFLEET_BOX_DIR=str(self.dir), **more)
        return env

    def jobs(self, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
        words = list(argv)
        at = words.index("--") if "--" in words else len(words)
        words[at:at] = ["--stack", "box"]
        return gpufleet("jobs", *words, env=self.env(), timeout=timeout)

    def submit(self, *argv: str) -> list[str]:
        done = self.jobs("submit", *argv)
        assert done.returncode == 0, done.stderr
        return [ln.split()[1] for ln in done.stdout.splitlines() if ln.startswith("queued ")]

    def slurm(self, *argv: str, check: bool = True, input: str | None = None) -> str:
        done = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=60, input=input)
        if check:
            assert done.returncode == 0, done.stderr
        return done.stdout

    def records(self, team: str | None = None):
        """A team's records (default: the box's first team, whose queue `jobs submit --stack box` sends to)."""
        from trainer.clouds.s3store import S3Store
        from trainer.jobs.layout import team_prefix
        from trainer.jobs.records import RecordStore

        import boto3

        s3 = boto3.client("s3", endpoint_url=self.state["endpoint"], region_name=self.state["region"],
                          aws_access_key_id="box", aws_secret_access_key="box")
        team = team or next(t for t, url in self.state["team_queues"].items() if url == self.state["queue_url"])
        return RecordStore(S3Store(self.state["bucket"], team_prefix(team), client=s3))

    def record(self, job_id: str, team: str | None = None) -> dict:
        return self.records(team).get(job_id)

    def wait_state(self, job_id: str, *states: str, timeout_s: float = 240, team: str | None = None) -> dict:
        def reached():
            try:
                rec = self.record(job_id, team)
            except Exception:
                return None
            return rec if rec["state"] in states else None

        return wait_for(reached, timeout_s, f"job {job_id} to be {' or '.join(states)}")

    def node_of_running(self, job_id: str) -> str:
        rec = self.wait_state(job_id, "running")
        return rec["attempts"][-1]["nodes"][0]

    @property
    def job_files(self) -> Path:
        """A folder of the box's that its jobs may write (they run as the teams' users): the tests' metrics."""
        return self.dir / "test-files"

    def processes(self) -> list[int]:
        from infra.box.supervisor import box_processes

        return box_processes(self.state["box_id"])


@pytest.fixture(scope="module")
def box():
    """The box of the module, in /tmp: its jobs run as the teams' users (the tests run as root), who must reach
    it, which they cannot below pytest's own 0700 folders."""
    root = Path(tempfile.mkdtemp(prefix="gpufleet-box-test-", dir="/tmp"))
    up = gpufleet("box", "up", "--dir", str(root), "--nodes", "2", timeout=240)
    assert up.returncode == 0, up.stderr + (root / "box.log").read_text()
    state = json.loads((root / "state.json").read_text())
    b = Box(root, state)
    b.job_files.mkdir(mode=0o1777)
    b.job_files.chmod(0o1777)
    try:
        yield b
    finally:
        down = gpufleet("box", "down", "--dir", str(root), timeout=120)
        assert down.returncode == 0, down.stderr
        assert b.processes() == [], "box down left processes behind"
        shutil.rmtree(root, ignore_errors=True)
