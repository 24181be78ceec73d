"""The demo's arithmetic on hand-made metrics records: runs, table states, the notice, the summary."""
from __future__ import annotations

import pytest

from infra import catalog
from infra.demo import progress as pg

TOTAL = 10


def recs(steps, t0: float, ckpt=(), dt: float = 1.0) -> list[dict]:
    """Records of consecutive steps, one per `dt` seconds from t0; `ckpt` steps carry checkpoint_s."""
    out = []
    for i, step in enumerate(steps):
        r = {"step": step, "loss": 5.0 - step / 10, "time": t0 + (i + 1) * dt, "step_time_s": dt}
        if step in ckpt:
            r["checkpoint_s"] = 0.01
        out.append(r)
    return out


def test_a_file_splits_into_runs_where_the_step_does_not_increase():
    file = recs(range(1, 5), 0, ckpt={4}) + recs(range(3, 7), 10)
    runs = pg.split_runs("node-1", file)
    assert [(r.first, r.last, r.checkpoints) for r in runs] == [(1, 4, [4]), (3, 6, [])]
    assert runs[0].started == 0 and runs[0].ended == 4 and runs[0].seconds == 4


def test_runs_of_a_job_come_in_start_order_one_file_an_attempt():
    runs = pg.job_runs([("gpu-2", recs(range(6, 11), 20)), ("gpu-1", recs(range(1, 6), 0, ckpt={5})),
                        ("gpu-1", recs(range(11, 13), 40)), ("gpu-2", [])])
    # the third file's steps follow the first's on the same node: still a run of its own (another attempt)
    assert [(r.node, r.first) for r in runs] == [("gpu-1", 1), ("gpu-2", 6), ("gpu-1", 11)]


def test_states_through_an_interruption():
    notice = pg.Notice("gpu-1", "j", time=3.5, step=3)
    running = [("gpu-1", recs(range(1, 4), 0))]
    rec = {"state": "running"}
    assert pg.job_state([], TOTAL, None, None, "j") == "waiting"
    assert pg.job_state([], TOTAL, {"state": "queued", "reason": "nodes powering up"}, None, "j") == \
        "nodes powering up"
    assert pg.job_state([], TOTAL, {"state": "running"}, None, "j") == "starting"  # no step yet
    assert pg.job_state(pg.job_runs(running), TOTAL, rec, None, "j") == "running"
    assert pg.job_state(pg.job_runs(running), TOTAL, rec, notice, "j") == "spot notice: stopping"
    stopped = [("gpu-1", recs(range(1, 5), 0, ckpt={4}))]
    assert pg.job_state(pg.job_runs(stopped), TOTAL, {"state": "preempted"}, notice, "j") == "requeued at 4"
    elsewhere = {"state": "running", "attempts": [{"nodes": ["gpu-1"]}, {"nodes": ["gpu-2"]}]}
    assert pg.job_state(pg.job_runs(stopped), TOTAL, elsewhere, notice, "j") == "starting"  # its first step to come
    resumed = [*stopped, ("gpu-2", recs(range(5, 7), 10))]
    assert pg.job_state(pg.job_runs(resumed), TOTAL, rec, notice, "j") == "resumed from 4"
    done = [*stopped, ("gpu-2", recs(range(5, 11), 10))]
    assert pg.job_state(pg.job_runs(done), TOTAL, {"state": "running"}, notice, "j") == "resumed from 4"
    assert pg.job_state(pg.job_runs(done), TOTAL, {"state": "succeeded"}, notice, "j") == "done"
    assert pg.job_state(pg.job_runs(running), TOTAL, {"state": "failed"}, None, "j") == "failed"
    # another job on the noticed node is not affected
    assert pg.job_state(pg.job_runs(running), TOTAL, rec, notice, "other") == "running"


def test_rows_show_nodes_step_loss_and_checkpoint():
    files = {"a": [("gpu-1", recs(range(1, 4), 0))], "b": [], "pair": [("gpu-1", recs(range(1, 3), 0))]}
    records = {"a": {"state": "running", "attempts": [{"nodes": ["gpu-1"]}], "spec": {}},
               "pair": {"state": "running", "attempts": [{"nodes": ["gpu-1", "gpu-2"]}], "spec": {"nodes": 2}}}
    rows = pg.rows(["a", "b", "pair"], files, TOTAL, {"a": 2, "b": None}, records, None)
    assert rows == [pg.Row("a", "gpu-1", 3, TOTAL, pytest.approx(4.7), 2, "running", 1.0),
                    pg.Row("b", "-", 0, TOTAL, None, None, "waiting"),
                    pg.Row("pair", "gpu-1,gpu-2", 2, TOTAL, pytest.approx(4.8), None, "running", 1.0, nodes=2)]


def test_step_time_is_the_mean_of_the_latest_steps():
    run = pg.split_runs("n", recs(range(1, 4), 0, dt=1.0) + [{"step": s, "loss": 1, "time": 9 + s, "step_time_s": 3.0}
                                                            for s in range(4, 9)])[0]
    assert pg.step_time(run) == 3.0 and pg.step_time(run, last=8) == pytest.approx((3 * 1 + 5 * 3) / 8)


def row(state="running", step=4, job="a", node="gpu-1", nodes=1):
    return pg.Row(job, node, step, TOTAL, 1.0, None, state, 1.5, nodes)


def test_the_victim_is_the_one_job_left_running_alone_with_time_to_go():
    assert pg.victim([row(), row("done", TOTAL, "b")], idle_nodes=1, min_left_s=4) == row()
    assert pg.victim([row(), row("waiting", 0, "b")], idle_nodes=1, min_left_s=4) is None  # a job still waits
    assert pg.victim([row(), row(job="b", node="gpu-2")], idle_nodes=1, min_left_s=4) is None  # two running
    assert pg.victim([row()], idle_nodes=0, min_left_s=4) is None              # no node to take it over
    assert pg.victim([row(nodes=2)], idle_nodes=1, min_left_s=4) is None       # a 2-node job: none to go to
    assert pg.victim([row(step=0)], idle_nodes=1, min_left_s=4) is None        # nothing done yet
    assert pg.victim([row(step=8)], idle_nodes=1, min_left_s=4) is None        # 2 steps of 1.5 s left: < 4 s
    assert pg.victim([row(step=8)], idle_nodes=1, min_left_s=3) == row(step=8)
    assert pg.victim([row(step=4)], idle_nodes=1) is None                      # 9 s left: under MIN_LEFT_S


def test_steps_lost_redone_and_missing():
    clean = pg.job_runs([("node-1", recs(range(1, 5), 0, ckpt={4})), ("node-2", recs(range(5, 11), 10))])
    assert [pg.steps_lost(r) for r in clean] == [0, 6]
    assert pg.steps_redone(clean) == 0 and pg.steps_missing(clean, TOTAL) == 0
    # killed at step 6 after the checkpoint of step 4: steps 5 and 6 are lost and trained again
    killed = pg.job_runs([("node-1", recs(range(1, 7), 0, ckpt={4})), ("node-2", recs(range(5, 11), 10))])
    assert pg.steps_lost(killed[0]) == 2 and pg.steps_redone(killed) == 2
    assert pg.steps_missing(pg.job_runs([("n", recs([1, 2, 5], 0))]), 5) == 2


def test_costs_price_the_node_hours_from_the_catalog():
    rows = pg.costs(2.0, ["g6.xlarge", "g6.12xlarge"])
    g6, big = catalog.CATALOG["g6.xlarge"], catalog.CATALOG["g6.12xlarge"]
    assert rows[0] == {"instance_type": "g6.xlarge", "gpus": 1, "gpu_hours": 2.0,
                       "on_demand_usd": 2.0 * g6.price_hour, "spot_usd": 2.0 * g6.spot_price_hour}
    assert rows[1]["gpu_hours"] == 8.0 and rows[1]["spot_usd"] == 2.0 * big.spot_price_hour
    prices = {"on_demand": {"instance_type": "g6.xlarge", "usd_hour": 0.8}, "spot": {"instance_type": "g5.xlarge",
                                                                                     "usd_hour": 0.3}}
    assert pg.stack_cost(2.0, prices) == {"on_demand": {"instance_type": "g6.xlarge", "usd": 1.6},
                                          "spot": {"instance_type": "g5.xlarge", "usd": 0.6}}


def interrupted(second_first_step: int = 5):
    files = {
        "a": [("node-1", recs(range(1, 11), 0, ckpt={10}))],
        "b": [("node-1", recs(range(1, 5), 20, ckpt={4})), ("node-2", recs(range(second_first_step, 11), 30))],
    }
    return files, pg.Notice("node-1", "b", time=23.5, step=3)


def test_summary_of_a_clean_interruption():
    files, notice = interrupted()
    s = pg.summarize(["a", "b"], files, TOTAL, notice, ["g6.xlarge"], {})
    assert s.ok, s.failures
    assert (s.jobs_done, s.steps_lost, s.steps_redone, s.steps_missing) == (2, 0, 0, 0)
    assert (s.interrupted_job, s.notice_node, s.stopped_at, s.resumed_node, s.resumed_from) == \
        ("b", "node-1", 4, "node-2", 4)
    assert s.stop_s == pytest.approx(24 - 23.5)
    assert s.requeue_latency_s == pytest.approx(31 - 23.5)       # the resumed run's first record
    assert s.node_hours == pytest.approx((10 + 4 + 6) / 3600)    # 20 one-second steps in all
    assert s.costs[0]["on_demand_usd"] == pytest.approx(s.node_hours * catalog.CATALOG["g6.xlarge"].price_hour)
    two = pg.summarize(["a", "b"], files, TOTAL, notice, ["g6.xlarge"], {}, nodes_of={"a": 2})
    assert two.node_hours == pytest.approx((2 * 10 + 4 + 6) / 3600)  # job a ran on two nodes


def test_summary_fails_on_redone_steps_no_resume_or_no_notice():
    files, notice = interrupted(second_first_step=3)
    assert pg.summarize(["a", "b"], files, TOTAL, notice, [], {}).failures == ["2 step(s) trained twice"]
    files, notice = interrupted()
    files["b"].pop()
    s = pg.summarize(["a", "b"], files, TOTAL, notice, [], {})
    assert s.failures == ["job b did not finish", "job b was not resumed after the notice to node-1"]
    files, _ = interrupted()
    assert pg.summarize(["a", "b"], files, TOTAL, None, [], {}).failures == [
        "no spot notice was sent: no job was left running alone long enough"]
