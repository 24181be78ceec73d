"""The pure derivations of how a job runs: node facts from node.json, the job environment, the docker argv for
real instance types (GPU flags, EFA and InfiniBand devices) and the stop grace."""
from __future__ import annotations

import os
import stat

import pytest

from infra import catalog
from infra.aws import efa
from trainer.node.runner import (DEFAULT_GRACE_S, NOBODY, NodeFacts, Running, code_environment, container_user,
                                 docker_argv, job_environment, job_scratch, loggable, node_facts, stop_grace)

COMMON = ["docker", "run", "--rm", "--name", "gpufleet-j1-1-abc", "--label", "gpufleet.job", "--init",
          "--user", "1000:1000", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--network", "host", "--ipc", "host", "--ulimit", "memlock=-1:-1", "--ulimit", "stack=67108864:67108864",
          "--stop-signal", "SIGTERM", "--stop-timeout", "100"]
TAIL = ["--volume", "/mnt/scratch/jobs/scratch-1-x:/mnt/scratch", "--volume", "/w/jobs/j1/control:/gpufleet",
        "--env-file", "/etc/gpufleet/container.env", "--env", "GPUFLEET_JOB_ID=j1", "--env", "HF_TOKEN",
        "--env", "HOME=/mnt/scratch", "--env", "TMPDIR=/mnt/scratch", "reg/train:1", "torchrun", "train.py"]


def node_json(cloud: str, *types: str) -> dict:
    """node.json's instance_types entries as infra/aws/stack.py and infra/azure/derive.py write them."""
    rows = {t: catalog.CATALOG[t] for t in types}
    return {"cloud": cloud, "instance_types": {
        t: {"gpus": r.gpus, "efa": efa.efa_count(efa.layout(r, True)) if cloud == "aws" else 0,
            "nvswitch": r.nvswitch, "infiniband_gbps": r.infiniband_gbps} for t, r in rows.items()}}


def argv_for(facts: NodeFacts, gpus=None) -> list[str]:
    return docker_argv("gpufleet-j1-1-abc", "reg/train:1", ["torchrun", "train.py"],
                       {"GPUFLEET_JOB_ID": "j1", "HF_TOKEN": "s3cr3t"}, facts, gpus, "/w/jobs/j1/control", 100,
                       "1000:1000", "/mnt/scratch/jobs/scratch-1-x", secret_names=("HF_TOKEN",))


def middle(argv: list[str]) -> list[str]:
    assert argv[:len(COMMON)] == COMMON and argv[-len(TAIL):] == TAIL
    return argv[len(COMMON):-len(TAIL)]


def test_g6_xlarge_gets_its_gpu_and_no_fabric():
    facts = node_facts(node_json("aws", "g6.xlarge", "p5.48xlarge"), "g6.xlarge", 1)
    assert facts == NodeFacts("aws", 1, 0, False)
    assert middle(argv_for(facts)) == ["--runtime", "nvidia", "--gpus", "all"]


def test_p4d_gets_all_gpus_and_its_4_efa_devices():
    facts = node_facts(node_json("aws", "p4d.24xlarge"), None, 8)  # the only entry when the type is unknown
    assert middle(argv_for(facts)) == ["--runtime", "nvidia", "--gpus", "all",
                                       *[x for i in range(4) for x in ("--device", f"/dev/infiniband/uverbs{i}")]]


def test_p5_gets_32_efa_devices_and_a_gpu_subset_when_asked():
    facts = node_facts(node_json("aws", "g6.xlarge", "p5.48xlarge"), "p5.48xlarge", 8)
    assert facts.efa == 32
    flags = middle(argv_for(facts, gpus=4))
    assert flags[:4] == ["--runtime", "nvidia", "--gpus", '"device=0,1,2,3"']
    assert flags[4:] == [x for i in range(32) for x in ("--device", f"/dev/infiniband/uverbs{i}")]


def test_nd96asr_v4_gets_infiniband():
    facts = node_facts(node_json("azure", "Standard_ND96asr_v4"), "Standard_ND96asr_v4", 8)
    assert facts == NodeFacts("azure", 8, 0, True)
    assert middle(argv_for(facts)) == ["--runtime", "nvidia", "--gpus", "all", "--device", "/dev/infiniband",
                                       "--cap-add", "IPC_LOCK"]


def test_no_gpu_flags_without_gpus_and_test_extras_before_the_image():
    argv = docker_argv("n", "img:1", ["python"], {"HOME": "/home/me"}, NodeFacts(None, 0), None, "/c", 5, "7:7",
                       "/s", container_env_file=False, extra=("--volume", "/x:/x:ro"))
    assert "--gpus" not in argv and "--runtime" not in argv
    assert argv[-4:] == ["--volume", "/x:/x:ro", "img:1", "python"]
    assert "HOME=/home/me" in argv and "HOME=/mnt/scratch" not in argv  # the job's own HOME wins
    assert "s3cr3t" not in " ".join(argv_for(NodeFacts("aws", 1)))  # a secret is passed by name only


def test_job_environment_and_code_environment():
    env = job_environment("j1", 3, "s3://ckpt/jobs/j1/", 4, 2, 8, "10.0.0.9:29400", "/gpufleet/stop",
                          {"LR": "0.1", "GPUFLEET_NODE_RANK": "x"})
    assert env == {"LR": "0.1", "GPUFLEET_JOB_ID": "j1", "GPUFLEET_ATTEMPT": "3",
                   "GPUFLEET_CHECKPOINT_URI": "s3://ckpt/jobs/j1/", "GPUFLEET_NNODES": "4", "GPUFLEET_NODE_RANK": "2",
                   "GPUFLEET_NPROC_PER_NODE": "8", "GPUFLEET_RDZV_ENDPOINT": "10.0.0.9:29400",
                   "GPUFLEET_STOP_FILE": "/gpufleet/stop"}
    run = code_environment({"PATH": "/usr/bin", "NCCL_NET_PLUGIN": "ofi"}, {"LR": "0.1"}, "/opt/gpufleet/venv/bin")
    assert run == {"PATH": "/opt/gpufleet/venv/bin:/usr/bin", "NCCL_NET_PLUGIN": "ofi", "LR": "0.1"}


def test_stop_grace_fits_the_notice():
    assert stop_grace("aws") == 100 and stop_grace("azure") == 20
    assert stop_grace("tencent") == stop_grace(None) == DEFAULT_GRACE_S


def test_the_logged_docker_argv_names_each_variable_without_its_value():
    """Finding 9 of the isolation review: DB_PASS escapes the secret-name denylist and its value reached the log."""
    argv = docker_argv("n", "img:1", ["python", "--env", "X=1"], {"DB_PASS": "hunter2", "OPENAI_KEY": "sk-1"},
                       node_facts({}, None, 0), None, "/c", 100, "1000:1000", "/s")
    shown = loggable(argv, ["python", "--env", "X=1"])
    assert "--env" in shown and "DB_PASS" in shown and "OPENAI_KEY" in shown
    assert not [a for a in shown if "hunter2" in a or "sk-1" in a]
    assert shown[-4:] == ["img:1", "python", "--env", "X=1"]  # the job's own command is left as it is


def test_the_stop_file_is_never_written_through_a_link_the_job_planted(tmp_path):
    """Finding 4: the stop file was written through a link the job left in its control directory (it overwrote a
    cached bundle). The link is replaced by the stop file; its target is untouched."""
    control, victim = tmp_path / "control", tmp_path / "bundles" / "cached.tar.gz"
    control.mkdir()
    victim.parent.mkdir()
    victim.write_bytes(b"someone else's bundle")
    (control / "stop").symlink_to(victim)
    Running(None, control / "stop").signal_stop()
    assert victim.read_bytes() == b"someone else's bundle"
    assert not (control / "stop").is_symlink() and (control / "stop").read_text() == "stop\n"
    linked = tmp_path / "linked"  # a control directory that is itself a link is not followed either
    linked.symlink_to(victim.parent, target_is_directory=True)
    Running(None, linked / "stop").signal_stop()  # logged; the job still gets its SIGTERM
    assert not (victim.parent / "stop").exists()


def test_a_container_never_runs_as_root(tmp_path):
    """Jobs never run as root (issue 23): a task run by root (a box, a test) runs its containers as nobody."""
    assert container_user(0, 0) == NOBODY == (65534, 65534)
    assert container_user(1001, 1001) == (1001, 1001)
    for user in ("0:0", "root", "0"):
        with pytest.raises(ValueError):
            docker_argv("n", "img:1", ["python"], {}, NodeFacts(None, 0), None, "/c", 5, user, "/s")
    made = job_scratch(tmp_path, 2, (os.getuid(), os.getgid()))
    assert made.parent == tmp_path and made.name.startswith("scratch-2-")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    other = job_scratch(tmp_path, 2, (os.getuid(), os.getgid()))
    assert other != made  # one per attempt and node, never shared
