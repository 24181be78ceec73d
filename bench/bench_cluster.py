"""Work lost to a spot interruption: stop-on-notice against periodic checkpoints only.

Two real `train` runs on this machine, each interrupted the same way: once past step START, the
instance "dies" (SIGKILL) LEAD_S seconds later. With the notice, the fake IMDS announces the
interruption at that moment, as EC2 does two minutes ahead; without it, only the periodic
checkpoints (every EVERY steps) survive. Lost steps = steps done minus the newest checkpoint.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EVERY = 200
START = 300
LEAD_S = 10.0  # far shorter than EC2's two minutes: a conservative notice


def _steps(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(ln)["step"] for ln in path.read_text().splitlines() if ln.strip()]


def interrupted_run(workdir: Path, notice: bool) -> tuple[int, float]:
    """(steps lost, seconds from the notice until the process had exited or was killed)."""
    from infra.demo.imds import FakeImds
    from trainer.loop.checkpoint import Checkpointer
    from trainer.loop.storage import open_store

    metrics, ckpt = workdir / "m.jsonl", workdir / "ckpt"
    with FakeImds() as imds:
        env = {**os.environ, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
               "AWS_EC2_METADATA_DISABLED": "false" if notice else "true"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer", "train", "--model", "gpt-tiny", "--dataset", "synthetic",
             "--batch-size", "4", "--num-workers", "0", "--steps", "1000000", "--checkpoint-every", str(EVERY),
             "--checkpoint-uri", str(ckpt), "--metrics-file", str(metrics), "--log-every", "1000000"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while len(_steps(metrics)) < START:
                if proc.poll() is not None:
                    raise RuntimeError(f"train exited early with status {proc.returncode}")
                time.sleep(0.05)
            t0 = time.monotonic()
            if notice:
                imds.spot_interruption()
            try:
                proc.wait(timeout=LEAD_S)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            elapsed = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    saved = Checkpointer(open_store(str(ckpt)), keep=1).steps()
    return max(_steps(metrics)) - (saved[0] if saved else 0), elapsed


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "notice").mkdir()
        (Path(tmp) / "periodic").mkdir()
        lost, stop_s = interrupted_run(Path(tmp) / "notice", notice=True)
        lost_periodic, _ = interrupted_run(Path(tmp) / "periodic", notice=False)
    return {
        "lost_steps_per_preemption": {"value": float(lost), "unit": "steps",
                                      "target": "0 when the notice comes >= one checkpoint-time before the end"},
        "lost_steps_periodic_only": {"value": float(lost_periodic), "unit": "steps",
                                     "target": f"baseline: checkpoint every {EVERY} steps, no notice"},
        "notice_to_safe_exit_s": {"value": stop_s, "unit": "s",
                                  "target": "< 120 (EC2 spot notice lead); includes the 2 s IMDS poll"},
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
