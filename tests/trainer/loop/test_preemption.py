"""Stop notices end `train` at a checkpoint of the stop step (exit 75); resuming gives exactly the
uninterrupted run. Real train processes; the spot notice comes from the fake IMDS over HTTP."""
from __future__ import annotations

import signal
import time

import pytest
import torch

from infra.demo.imds import FakeImds
from tests.trainer.gated import GATE, TRAIN, final_state, start_train, steps, wait_for
from trainer.loop.config import parse_args
from trainer.clouds.aws import SPOT_ACTION
from trainer.loop.stop import StopNotice
from trainer.loop.train import train

STEPS = 12


@pytest.fixture
def baseline(tmp_path, monkeypatch):
    """The uninterrupted run, in this process (no notice can reach it: IMDS is disabled)."""
    args = [*TRAIN, "--steps", str(STEPS), "--checkpoint-uri", str(tmp_path / "base"),
            "--metrics-file", str(tmp_path / "base.jsonl")]
    assert train(parse_args(args), StopNotice()) == 0
    return [s["loss"] for s in steps(tmp_path / "base.jsonl")], final_state(str(tmp_path / "base"))


def run_until_notice(args, metrics, gate, env, notify) -> tuple[int, str]:
    """Start train, pause it at the gate (a known forward call), deliver the notice, open the gate."""
    done = len(steps(metrics))
    proc = start_train(args, {**env, GATE: f"{gate}:3"})
    wait_for(lambda: len(steps(metrics)) >= done + 1, what="a step before the gate")
    notify(proc)
    gate.touch()
    log = proc.communicate(timeout=300)[0]
    gate.unlink()
    return proc.returncode, log


@pytest.mark.slow
def test_sigterm_then_spot_notice_then_resume_is_the_uninterrupted_run(tmp_path, baseline):
    ckpt, metrics, gate = tmp_path / "ckpt", tmp_path / "m.jsonl", tmp_path / "gate"
    args = ["--steps", str(STEPS), "--checkpoint-uri", str(ckpt), "--metrics-file", str(metrics)]
    with FakeImds() as imds:
        env = {"AWS_EC2_METADATA_DISABLED": "false", "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint}

        # 1. SIGTERM while step 3 runs: every rank stops after step 4 (the stop vote is read a step late).
        rc, log = run_until_notice(args, metrics, gate, env, lambda proc: proc.send_signal(signal.SIGTERM))
        assert rc == 75, log
        assert "stop requested (SIGTERM)" in log
        first_stop = steps(metrics)[-1]["step"]
        assert 3 <= first_stop < STEPS and final_state(str(ckpt))[0] == first_stop

        # 2. Resumed; a spot interruption notice while its third step runs.
        def spot(proc):
            imds.spot_interruption()
            seen = len(imds.gets)
            wait_for(lambda: SPOT_ACTION in imds.gets[seen:], what="the watcher to read the notice")
            time.sleep(0.2)  # the watcher sets the notice once the read is answered

        rc, log = run_until_notice(args, metrics, gate, env, spot)
        assert rc == 75, log
        assert "stop requested (spot terminate at" in log
        second_stop = steps(metrics)[-1]["step"]
        assert first_stop + 3 <= second_stop < STEPS and final_state(str(ckpt))[0] == second_stop

        # 3. Resumed on a node without a notice: runs to the end.
        imds.items.pop(SPOT_ACTION)
        proc = start_train(args, env)
        log = proc.communicate(timeout=300)[0]
        assert proc.returncode == 0, log

    records = steps(metrics)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # none done twice, none skipped
    losses, (base_step, base_model) = baseline
    assert [r["loss"] for r in records] == losses
    step, model = final_state(str(ckpt))
    assert step == base_step == STEPS
    assert all(torch.equal(model[k], base_model[k]) for k in base_model)
