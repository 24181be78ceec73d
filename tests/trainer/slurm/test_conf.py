"""slurm.conf and gres.conf rendering (trainer.slurm.conf): exact lines from Cluster values, no Slurm needed.

Each rule: a cluster that renders it and one that does not (or raises the one-line UsageError). The last section
hands a cloud cluster's files to the real Slurm here (Debian's slurmctld and slurmd on loopback): slurmctld
starts with them and serves them to a configless slurmd.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from trainer.errors import UsageError
from trainer.slurm.conf import (EXIT_REQUEUE, IMAGE_PROGRAMS, KILL_WAIT_S, Cluster, LocalNode, Partition,
                                render_gres_conf, render_slurm_conf)

PROGRAMS = {"resume": "/opt/gpufleet/bin/resume", "suspend": "/opt/gpufleet/bin/suspend",
            "resume_fail": "/opt/gpufleet/bin/resume-fail"}


def gpu_partition(**overrides) -> Partition:
    values = dict(name="gpu", count=4, cpus=4, memory_mb=15564, gpus=1, features=("g6.xlarge", "spot"),
                  default=True)
    values.update(overrides)
    return Partition(**values)


def queue_cluster(**overrides) -> Cluster:
    """A queue-like cloud cluster: one partition of 4 single-GPU CLOUD nodes, scales to zero."""
    values = dict(name="dev", controller="controller", partitions=(gpu_partition(),),
                  state_dir="/var/spool/slurmctld", spool_dir="/var/spool/slurmd", log_dir="/var/log/slurm",
                  run_dir="/run/slurm", programs=dict(PROGRAMS), cloud="aws")
    values.update(overrides)
    return Cluster(**values)


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def settings(text: str) -> dict[str, str]:
    """The one-setting lines (Key=value, no spaces) of a slurm.conf; node and partition lines left out."""
    out: dict[str, str] = {}
    for ln in lines(text):
        if " " in ln:
            continue
        key, _, value = ln.partition("=")
        assert key not in out, f"{key} set twice"
        out[key] = value
    return out


def words(line: str) -> dict[str, str]:
    """A NodeName= or PartitionName= line as {key: value}."""
    return dict(w.split("=", 1) for w in line.split())


def node_lines(text: str) -> list[dict[str, str]]:
    return [words(ln) for ln in lines(text) if ln.startswith("NodeName=")]


def partition_lines(text: str) -> list[dict[str, str]]:
    return [words(ln) for ln in lines(text) if ln.startswith("PartitionName=")]


# --- nodes and partitions ---------------------------------------------------------------------------------------

def test_queue_cluster_renders_one_cloud_node_range_with_its_gpus_and_features():
    text = render_slurm_conf(queue_cluster())
    assert node_lines(text) == [{"NodeName": "gpu-[1-4]", "CPUs": "4", "RealMemory": "15564", "Gres": "gpu:1",
                                 "Features": "g6.xlarge,spot", "State": "CLOUD"}]
    assert partition_lines(text) == [{"PartitionName": "gpu", "Nodes": "gpu-[1-4]", "Default": "YES",
                                      "MaxTime": "INFINITE", "State": "UP", "OverSubscribe": "NO"}]
    assert "NodeName=gpu-[1-4] CPUs=4 RealMemory=15564 Gres=gpu:1 Features=g6.xlarge,spot State=CLOUD" in lines(text)


def test_node_line_without_gpus_has_no_gres_and_without_features_no_features():
    text = render_slurm_conf(queue_cluster(partitions=(gpu_partition(gpus=0, features=()),)))
    assert node_lines(text) == [{"NodeName": "gpu-[1-4]", "CPUs": "4", "RealMemory": "15564", "State": "CLOUD"}]


def test_eight_gpu_partition_renders_gres_gpu_8():
    text = render_slurm_conf(queue_cluster(partitions=(gpu_partition(gpus=8),)))
    assert node_lines(text)[0]["Gres"] == "gpu:8"


def test_single_node_partition_is_named_without_a_range():
    p = gpu_partition(count=1)
    assert p.node_names() == ["gpu-1"]
    assert p.hostlist() == "gpu-1"
    text = render_slurm_conf(queue_cluster(partitions=(p,)))
    assert node_lines(text)[0]["NodeName"] == "gpu-1"
    assert partition_lines(text)[0]["Nodes"] == "gpu-1"


def test_node_names_and_hostlists():
    p = gpu_partition(count=4)
    assert p.node_names() == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert p.hostlist() == "gpu-[1-4]"
    assert p.hostlist(1, 2) == "gpu-[1-2]"
    assert p.hostlist(3, 3) == "gpu-3"


def test_two_partitions_one_default():
    big = Partition("big", 2, 192, 1867776, gpus=8, features=("p5.48xlarge",), max_time="7-00:00:00")
    cluster = queue_cluster(partitions=(gpu_partition(), big))
    text = render_slurm_conf(cluster)
    assert [n["NodeName"] for n in node_lines(text)] == ["gpu-[1-4]", "big-[1-2]"]
    assert partition_lines(text) == [
        {"PartitionName": "gpu", "Nodes": "gpu-[1-4]", "Default": "YES", "MaxTime": "INFINITE", "State": "UP",
         "OverSubscribe": "NO"},
        {"PartitionName": "big", "Nodes": "big-[1-2]", "Default": "NO", "MaxTime": "7-00:00:00", "State": "UP",
         "OverSubscribe": "NO"}]
    assert cluster.nodes() == ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "big-1", "big-2"]


# --- power saving -----------------------------------------------------------------------------------------------

def test_power_saving_programs_and_timeouts():
    conf = settings(render_slurm_conf(queue_cluster()))
    assert {k: conf[k] for k in ("ResumeProgram", "SuspendProgram", "ResumeFailProgram", "SuspendTime",
                                 "SuspendTimeout", "ResumeTimeout", "ResumeRate", "SuspendRate")} == {
        "ResumeProgram": "/opt/gpufleet/bin/resume", "SuspendProgram": "/opt/gpufleet/bin/suspend",
        "ResumeFailProgram": "/opt/gpufleet/bin/resume-fail", "SuspendTime": "300", "SuspendTimeout": "120",
        "ResumeTimeout": "900", "ResumeRate": "0", "SuspendRate": "0"}
    assert conf["SlurmctldParameters"] == "enable_configless,idle_on_node_suspend"


def test_the_images_power_saving_programs():
    assert IMAGE_PROGRAMS == {"resume": "/usr/local/sbin/gpufleet-resume",
                              "suspend": "/usr/local/sbin/gpufleet-suspend",
                              "resume_fail": "/usr/local/sbin/gpufleet-resume-fail"}
    conf = settings(render_slurm_conf(queue_cluster(programs=IMAGE_PROGRAMS)))
    assert (conf["ResumeProgram"], conf["SuspendProgram"], conf["ResumeFailProgram"]) == (
        "/usr/local/sbin/gpufleet-resume", "/usr/local/sbin/gpufleet-suspend", "/usr/local/sbin/gpufleet-resume-fail")


# --- configless -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cloud", ["aws", "azure", "tencent"])
def test_a_cloud_cluster_serves_its_config_to_the_nodes(cloud):
    conf = settings(render_slurm_conf(queue_cluster(cloud=cloud)))
    assert conf["SlurmctldParameters"].split(",") == ["enable_configless", "idle_on_node_suspend"]


def test_a_cloud_cluster_leaves_out_what_the_images_slurm_does_by_default():
    conf = settings(render_slurm_conf(queue_cluster()))
    assert "cloud_reg_addrs" not in conf["SlurmctldParameters"]  # defunct since 23.11: the default
    assert "PrivateData" not in conf  # PrivateData=cloud: the default since 23.02


def test_the_box_reads_its_own_files_and_keeps_its_slurms_settings():
    conf = settings(render_slurm_conf(box_cluster()))
    assert conf["SlurmctldParameters"] == "idle_on_node_suspend,cloud_reg_addrs"
    assert conf["PrivateData"] == "cloud"


def test_power_saving_timeouts_follow_the_cluster():
    conf = settings(render_slurm_conf(queue_cluster(suspend_time_s=60, suspend_timeout_s=10,
                                                    resume_timeout_s=120)))
    assert (conf["SuspendTime"], conf["SuspendTimeout"], conf["ResumeTimeout"]) == ("60", "10", "120")


def test_no_always_on_nodes_no_suspend_exclusions():
    assert "SuspendExcNodes" not in settings(render_slurm_conf(queue_cluster()))


def test_always_on_nodes_never_power_down():
    conf = settings(render_slurm_conf(queue_cluster(partitions=(gpu_partition(always_on=2),))))
    assert conf["SuspendExcNodes"] == "gpu-[1-2]"


def test_one_always_on_node_and_every_partition_excluded():
    big = Partition("big", 2, 192, 1867776, gpus=8, always_on=2)
    conf = settings(render_slurm_conf(queue_cluster(partitions=(gpu_partition(always_on=1), big))))
    assert conf["SuspendExcNodes"] == "gpu-1,big-[1-2]"


# --- requeue and stop -------------------------------------------------------------------------------------------

def test_requeue_settings():
    conf = settings(render_slurm_conf(queue_cluster()))
    assert EXIT_REQUEUE == 75
    assert (conf["RequeueExit"], conf["JobRequeue"], conf["JobFileAppend"]) == ("75", "1", "1")
    assert (conf["ReturnToService"], conf["MinJobAge"], conf["SlurmdTimeout"]) == ("2", "600", "300")


@pytest.mark.parametrize("cloud,kill_wait", [("aws", "100"), ("azure", "20"), ("tencent", "100"), ("local", "30")])
def test_kill_wait_per_cloud(cloud, kill_wait):
    assert KILL_WAIT_S[cloud] == int(kill_wait)
    assert settings(render_slurm_conf(queue_cluster(cloud=cloud)))["KillWait"] == kill_wait


def test_kill_wait_override():
    assert settings(render_slurm_conf(queue_cluster(cloud="aws", kill_wait_s=45)))["KillWait"] == "45"
    assert settings(render_slurm_conf(queue_cluster(cloud="azure", kill_wait_s=0)))["KillWait"] == "0"


# --- controller, auth, paths ------------------------------------------------------------------------------------

def test_controller_paths_and_user():
    conf = settings(render_slurm_conf(queue_cluster()))
    assert {k: conf[k] for k in ("ClusterName", "SlurmctldHost", "SlurmctldPort", "SlurmdPort", "SlurmUser",
                                 "StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile",
                                 "SlurmctldLogFile", "SlurmdLogFile")} == {
        "ClusterName": "dev", "SlurmctldHost": "controller", "SlurmctldPort": "6817", "SlurmdPort": "6818",
        "SlurmUser": "slurm", "StateSaveLocation": "/var/spool/slurmctld", "SlurmdSpoolDir": "/var/spool/slurmd/%n",
        "SlurmctldPidFile": "/run/slurm/slurmctld.pid", "SlurmdPidFile": "/run/slurm/slurmd-%n.pid",
        "SlurmctldLogFile": "/var/log/slurm/slurmctld.log", "SlurmdLogFile": "/var/log/slurm/slurmd-%n.log"}


def test_controller_address_in_parentheses():
    conf = settings(render_slurm_conf(queue_cluster(controller="localhost", controller_addr="127.0.0.1")))
    assert conf["SlurmctldHost"] == "localhost(127.0.0.1)"


def test_munge_auth_with_cred_expire_and_default_socket():
    conf = settings(render_slurm_conf(queue_cluster()))
    assert (conf["AuthType"], conf["CredType"], conf["AuthInfo"]) == ("auth/munge", "cred/munge", "cred_expire=120")


def test_munge_socket_in_auth_info():
    conf = settings(render_slurm_conf(queue_cluster(munge_socket="/tmp/box/munge/munge.socket", cred_expire_s=10)))
    assert conf["AuthInfo"] == "cred_expire=10,socket=/tmp/box/munge/munge.socket"


def test_cloud_nodes_use_cgroups_and_no_loopback_binding():
    conf = settings(render_slurm_conf(queue_cluster()))
    assert (conf["ProctrackType"], conf["TaskPlugin"]) == ("proctrack/cgroup", "task/cgroup,task/affinity")
    assert "CommunicationParameters" not in conf
    assert (conf["SelectType"], conf["SelectTypeParameters"], conf["GresTypes"], conf["MpiDefault"]) == (
        "select/cons_tres", "CR_Core_Memory", "gpu", "none")


def test_scheduler_parameters_default_and_fast():
    assert settings(render_slurm_conf(queue_cluster()))["SchedulerParameters"] == "bf_interval=30"
    assert settings(render_slurm_conf(queue_cluster(fast_scheduling=True)))["SchedulerParameters"] == (
        "bf_interval=2,sched_interval=2,sched_min_interval=100000")


def test_no_health_check_program():  # it hung powering-up nodes here; the node's watcher runs the preflight
    assert not {"HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState"} & set(
        settings(render_slurm_conf(queue_cluster())))


def test_text_ends_with_one_newline_and_has_no_empty_settings():
    text = render_slurm_conf(queue_cluster())
    assert text.endswith("\n") and not text.endswith("\n\n")
    assert all("=" in ln for ln in lines(text))


# --- accounting -------------------------------------------------------------------------------------------------

def test_accounting_off_writes_completed_jobs_to_a_file():
    conf = settings(render_slurm_conf(queue_cluster()))
    assert (conf["AccountingStorageType"], conf["JobCompType"], conf["JobCompLoc"]) == (
        "accounting_storage/none", "jobcomp/filetxt", "/var/log/slurm/jobcomp.log")
    assert "AccountingStorageHost" not in conf and "AccountingStorageTRES" not in conf
    assert conf["JobAcctGatherType"] == "jobacct_gather/none"


def test_accounting_on_uses_slurmdbd_and_enforces_the_teams_accounts_limits_and_fair_share():
    conf = settings(render_slurm_conf(queue_cluster(accounting="controller")))
    assert (conf["AccountingStorageType"], conf["AccountingStorageHost"], conf["AccountingStoragePort"],
            conf["AccountingStorageTRES"]) == ("accounting_storage/slurmdbd", "controller", "6819", "gres/gpu")
    assert conf["AccountingStorageEnforce"] == "associations,limits,safe"
    assert (conf["PriorityType"], conf["PriorityWeightFairshare"]) == ("priority/multifactor", "10000")
    assert "JobCompType" not in conf and "JobCompLoc" not in conf and "AccountingStoragePass" not in conf
    boxed = settings(render_slurm_conf(queue_cluster(accounting="127.0.0.1", accounting_port=7010,
                                                     munge_socket="/tmp/box/munge.socket")))
    assert (boxed["AccountingStoragePort"], boxed["AccountingStoragePass"]) == ("7010", "/tmp/box/munge.socket")


# --- local nodes (the box) --------------------------------------------------------------------------------------

def box_cluster(**overrides) -> Cluster:
    part = Partition("gpu", 2, 1, 2048, features=("g6.xlarge", "spot"), default=True)
    values = dict(name="box", controller="localhost", controller_addr="127.0.0.1", partitions=(part,),
                  state_dir="/box/slurm/state", spool_dir="/box/slurm/spool", log_dir="/box/slurm/log",
                  run_dir="/box/slurm/run", programs=dict(PROGRAMS), cloud="local",
                  local_nodes={"gpu-1": LocalNode(port=7002), "gpu-2": LocalNode(addr="127.0.0.2", port=7003)})
    values.update(overrides)
    return Cluster(**values)


def test_local_nodes_one_line_each_with_port_and_address():
    text = render_slurm_conf(box_cluster())
    assert node_lines(text) == [
        {"NodeName": "gpu-1", "NodeAddr": "127.0.0.1", "NodeHostname": "localhost", "Port": "7002", "CPUs": "1",
         "RealMemory": "2048", "Features": "g6.xlarge,spot", "State": "CLOUD"},
        {"NodeName": "gpu-2", "NodeAddr": "127.0.0.2", "NodeHostname": "localhost", "Port": "7003", "CPUs": "1",
         "RealMemory": "2048", "Features": "g6.xlarge,spot", "State": "CLOUD"}]
    assert partition_lines(text)[0]["Nodes"] == "gpu-[1-2]"


def test_local_nodes_bind_loopback_without_cgroups():
    conf = settings(render_slurm_conf(box_cluster()))
    assert conf["CommunicationParameters"] == "NoInAddrAny"
    assert (conf["ProctrackType"], conf["TaskPlugin"]) == ("proctrack/linuxproc", "task/none")
    assert conf["SlurmctldHost"] == "localhost(127.0.0.1)"


def test_local_node_missing_its_address_is_a_usage_error():
    with pytest.raises(UsageError) as exc:
        render_slurm_conf(box_cluster(local_nodes={"gpu-1": LocalNode(port=7002)}))
    assert str(exc.value) == "cluster box: node gpu-2 has no local address and port"


# --- gres.conf --------------------------------------------------------------------------------------------------

def gres_lines(cluster: Cluster) -> list[str]:
    return lines(render_gres_conf(cluster))


def test_gres_one_gpu_is_nvidia0():
    assert gres_lines(queue_cluster()) == ["NodeName=gpu-[1-4] Name=gpu File=/dev/nvidia0"]


def test_gres_eight_gpus_is_a_device_range():
    assert gres_lines(queue_cluster(partitions=(gpu_partition(gpus=8),))) == [
        "NodeName=gpu-[1-4] Name=gpu File=/dev/nvidia[0-7]"]


def test_gres_two_gpus_single_node():
    assert gres_lines(queue_cluster(partitions=(gpu_partition(gpus=2, count=1),))) == [
        "NodeName=gpu-1 Name=gpu File=/dev/nvidia[0-1]"]


def test_gres_nothing_for_a_partition_without_gpus():
    assert gres_lines(queue_cluster(partitions=(gpu_partition(gpus=0),))) == []
    assert render_gres_conf(queue_cluster(partitions=(gpu_partition(gpus=0),))).endswith("\n")


def test_gres_only_partitions_with_gpus():
    cpu = Partition("cpu", 2, 8, 30000)
    assert gres_lines(queue_cluster(partitions=(cpu, gpu_partition(gpus=8)))) == [
        "NodeName=gpu-[1-4] Name=gpu File=/dev/nvidia[0-7]"]


# --- errors -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpu", "g", "a1", "abcdefghijklmno"])
def test_partition_names_allowed(name):
    assert Partition(name, 1, 1, 1).name == name


@pytest.mark.parametrize("name", ["", "GPU", "1gpu", "gpu-a", "gpu_a", "abcdefghijklmnop", "gpu "])
def test_partition_names_refused(name):
    with pytest.raises(UsageError) as exc:
        Partition(name, 1, 1, 1)
    assert str(exc.value) == (f"partition {name!r}: expected 1-15 lowercase letters and digits, starting with a "
                              "letter")


@pytest.mark.parametrize("count,always_on", [(1, 0), (1, 1), (4, 4), (4, 0)])
def test_count_and_always_on_allowed(count, always_on):
    p = Partition("gpu", count, 1, 1, always_on=always_on)
    assert (p.count, p.always_on) == (count, always_on)


@pytest.mark.parametrize("count,always_on", [(0, 0), (-1, 0), (4, 5), (4, -1)])
def test_count_and_always_on_refused(count, always_on):
    with pytest.raises(UsageError) as exc:
        Partition("gpu", count, 1, 1, always_on=always_on)
    assert str(exc.value) == (f"partition gpu: {count} node(s) with {always_on} always on is not allowed; "
                              "expected count >= 1 and 0 <= always_on <= count")


def test_duplicate_partition_names_refused():
    with pytest.raises(UsageError) as exc:
        render_slurm_conf(queue_cluster(partitions=(gpu_partition(), gpu_partition(count=2))))
    assert str(exc.value) == "cluster dev: partition names repeat (gpu, gpu)"


def test_no_partitions_refused():
    with pytest.raises(UsageError) as exc:
        render_slurm_conf(queue_cluster(partitions=()))
    assert str(exc.value) == "cluster dev: no partitions; a cluster needs at least one node group"


def test_values_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu_partition().count = 3  # type: ignore[misc]


# --- the real Slurm takes a cloud cluster's files ---------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(what: str, ready, procs: dict[str, subprocess.Popen], logs: Path, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not ready():
        dead = [name for name, proc in procs.items() if proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = {p.name: p.read_text()[-2000:] for p in sorted(logs.glob("*")) if p.is_file()}
            pytest.fail(f"{what}: not ready ({', '.join(dead) or 'timed out'} exited); logs: {tails}")
        time.sleep(0.05)


def _tools() -> dict[str, str]:
    tools = {}
    for name, package in (("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"),
                          ("scontrol", "slurm-client"), ("unshare", "util-linux")):
        path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        if path is None:
            pytest.fail(f"{name} is not installed; `make tools` installs Debian's {package}", pytrace=False)
        tools[name] = path
    return tools


def test_slurmctld_starts_with_a_cloud_clusters_files_and_serves_them_to_a_configless_slurmd():
    """Debian's Slurm (22.05; the images bake a newer one) on loopback: slurmctld with a cloud cluster's slurm.conf
    and gres.conf, then a slurmd started as the image starts it (``-N NAME --conf-server ADDR:PORT``, no
    slurm.conf of its own) fetches both from it. The slurmd may stop after that (no cgroups or GPUs here); the
    files in its conf-cache are what this checks."""
    tools = _tools()
    # munged wants every directory above its socket searchable by all; slurmstepd's sockets a short path.
    with tempfile.TemporaryDirectory(prefix="gf-conf-", dir="/tmp") as top:
        base = Path(top)
        os.chmod(base, 0o755)
        etc, logs = base / "etc", base / "log"
        for d in (etc, logs, base / "state", base / "spool", base / "run", base / "munge"):
            d.mkdir()
        key = base / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        port = _free_port()
        cluster = queue_cluster(
            controller="localhost", controller_addr="127.0.0.1", slurmctld_port=port, slurmd_port=_free_port(),
            state_dir=str(base / "state"), spool_dir=str(base / "spool"), log_dir=str(logs),
            run_dir=str(base / "run"), programs={k: "/bin/true" for k in PROGRAMS},
            munge_socket=str(base / "munge" / "socket"), slurm_user=_user())
        slurm_conf, gres_conf = render_slurm_conf(cluster), render_gres_conf(cluster)
        (etc / "slurm.conf").write_text(slurm_conf)
        (etc / "gres.conf").write_text(gres_conf)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(etc / "slurm.conf")}
        procs: dict[str, subprocess.Popen] = {}

        def spawn(name: str, argv: list[str], environ: dict[str, str]) -> None:
            with open(logs / f"{name}.out", "ab") as out:
                procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=environ)

        try:
            m = base / "munge"
            spawn("munged", [tools["munged"], "--foreground", f"--socket={m / 'socket'}", f"--key-file={key}",
                             f"--pid-file={m / 'pid'}", f"--seed-file={m / 'seed'}", f"--log-file={m / 'log'}"], env)
            _wait_for("munged", (m / "socket").exists, procs, logs)
            spawn("slurmctld", [tools["slurmctld"], "-D", "-f", str(etc / "slurm.conf")], env)

            def controller_up() -> bool:
                done = subprocess.run([tools["scontrol"], "ping"], env=env, capture_output=True, text=True)
                return "UP" in done.stdout

            _wait_for("slurmctld", controller_up, procs, logs)
            shown = subprocess.run([tools["scontrol"], "show", "config"], env=env, capture_output=True, text=True,
                                   check=True).stdout
            assert any(line.split() == ["SlurmctldParameters", "=", "enable_configless,idle_on_node_suspend"]
                       for line in shown.splitlines())

            # As the image's slurmd.service starts it: no SLURM_CONF, no -f, the controller named on the line.
            # Before it has the config, a slurmd reaches munged at the default socket (/run/munge/munge.socket.2;
            # 22.05 has no --authinfo), and it links /run/slurm/conf to its cache: in a mount namespace of its
            # own, /run is a fresh tmpfs whose default socket is this test's munged.
            node_env = {"PATH": env["PATH"]}
            spawn("slurmd", [tools["unshare"], "--mount", "--propagation", "private", "sh", "-c",
                             'mount -t tmpfs tmpfs /run && mkdir /run/munge && ln -s "$0" /run/munge/munge.socket.2 '
                             '&& exec "$@"', str(m / "socket"),
                             tools["slurmd"], "-D", "-N", "gpu-1", "--conf-server", f"127.0.0.1:{port}"], node_env)
            cache = base / "spool" / "gpu-1" / "conf-cache"

            def fetched() -> bool:
                return (cache / "slurm.conf").exists() and (cache / "gres.conf").exists()

            daemons = {k: v for k, v in procs.items() if k != "slurmd"}  # slurmd may stop once it has them
            _wait_for("slurmd", lambda: fetched() or procs["slurmd"].poll() is not None, daemons, logs)
            if not fetched():
                _wait_for("slurmd's fetch", fetched, procs, logs)  # fails with the logs
            assert (cache / "slurm.conf").read_text() == slurm_conf
            assert (cache / "gres.conf").read_text() == gres_conf
        finally:
            for name in ("slurmd", "slurmctld", "munged"):
                proc = procs.get(name)
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def test_a_job_spans_at_most_max_nodes_and_srun_listens_on_the_allowed_ports():
    text = render_slurm_conf(queue_cluster(partitions=(gpu_partition(max_nodes=1),), srun_ports=(60001, 63000)))
    (part,) = partition_lines(text)
    assert part["MaxNodes"] == "1"
    assert settings(text)["SrunPortRange"] == "60001-63000"
    plain = render_slurm_conf(queue_cluster())
    assert "MaxNodes" not in partition_lines(plain)[0] and "SrunPortRange" not in settings(plain)


def test_a_cloud_clusters_tasks_get_the_nodes_nccl_settings_the_box_has_none():
    from trainer.slurm.conf import IMAGE_TASK_PROLOG

    assert settings(render_slurm_conf(queue_cluster()))["TaskProlog"] == IMAGE_TASK_PROLOG
    assert "TaskProlog" not in settings(render_slurm_conf(box_cluster()))


def test_gres_a_box_node_has_one_stand_in_gpu_and_no_more():
    one = Partition("gpu", 2, 1, 2048, gpus=1)
    assert gres_lines(box_cluster(partitions=(one,))) == ["NodeName=gpu-[1-2] Name=gpu File=/dev/null"]
    with pytest.raises(UsageError) as exc:
        render_gres_conf(box_cluster(partitions=(dataclasses.replace(one, gpus=2),)))
    assert str(exc.value) == ("partition gpu: 2 GPUs on a local node; a box's node has at most one (/dev/null "
                              "stands in for it)")
