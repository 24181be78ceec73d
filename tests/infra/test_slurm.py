"""A stack's Slurm cluster (infra.slurm) from the repository's stack files: exact partitions, and their slurm.conf."""
from __future__ import annotations

import pytest

from infra import catalog, config, slurm
from tests.conftest import ROOT
from trainer.slurm.conf import Cluster, Partition, render_gres_conf, render_slurm_conf

PROGRAMS = {"resume": "/opt/gpufleet/bin/slurm-resume", "suspend": "/opt/gpufleet/bin/slurm-suspend",
            "resume_fail": "/opt/gpufleet/bin/slurm-resume-fail"}


def stack(name: str, **overrides) -> config.StackConfig:
    raw, secrets = config.read_stack_file(ROOT / f"Pulumi.{name}.yaml")
    raw = {k: v for k, v in {**raw, **overrides}.items() if v is not None}  # None: the key is not given
    return config.parse(raw, name, secrets)


def settings(text: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#") and " " not in ln)


def features(cfg: config.StackConfig) -> tuple[str, ...]:
    (part,) = cfg.partitions
    return slurm.features(part)


def node_line(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("NodeName=")]
    return line


# --- the repository's stacks ------------------------------------------------------------------------------------

EXPECTED = {
    "dev": Partition(name="gpu", count=4, cpus=4, memory_mb=15564, gpus=1,
                     features=("g6.xlarge", "g5.xlarge", "g6.2xlarge", "g5.2xlarge", "spot"), always_on=0,
                     default=True, max_nodes=1),
    "prod": Partition(name="gpu", count=4, cpus=192, memory_mb=1992294, gpus=8,
                      features=("p5.48xlarge", "efa", "gang"), always_on=4, default=True),
    "azure": Partition(name="gpu", count=4, cpus=96, memory_mb=875520, gpus=8,
                       features=("Standard_ND96asr_v4", "spot"), always_on=0, default=True, max_nodes=1),
    "tencent": Partition(name="gpu", count=4, cpus=80, memory_mb=311296, gpus=8,
                         features=("GN10Xp.20XLARGE320", "spot"), always_on=0, default=True, max_nodes=1),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_stack_partitions(name):
    assert slurm.partitions(stack(name)) == (EXPECTED[name],)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_stack_partition_fields(name):
    (p,) = slurm.partitions(stack(name))
    e = EXPECTED[name]
    assert (p.name, p.count, p.cpus, p.memory_mb, p.gpus, p.features, p.always_on, p.default, p.max_time) == (
        e.name, e.count, e.cpus, e.memory_mb, e.gpus, e.features, e.always_on, e.default, "INFINITE")


@pytest.mark.parametrize("name,cloud", [("dev", "aws"), ("prod", "aws"), ("azure", "azure"),
                                        ("tencent", "tencent")])
def test_stack_cluster(name, cloud):
    cfg = stack(name)
    c = slurm.cluster(cfg, "controller-1", PROGRAMS)
    assert isinstance(c, Cluster)
    assert (c.name, c.controller, c.cloud, c.state_dir, c.spool_dir, c.log_dir, c.run_dir, c.slurm_user) == (
        name, "controller-1", cloud, "/var/spool/slurmctld", "/var/spool/slurmd", "/var/log/slurm", "/run/slurm",
        "slurm")
    assert c.partitions == (EXPECTED[name],)
    assert c.programs == PROGRAMS and c.programs is not PROGRAMS
    assert c.local_nodes == {} and c.munge_socket is None and c.controller_addr is None


# --- rendered ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,kill_wait", [("dev", "100"), ("prod", "100"), ("azure", "20"), ("tencent", "100")])
def test_each_stack_renders(name, kill_wait):
    text = render_slurm_conf(slurm.cluster(stack(name), "controller-1", PROGRAMS))
    conf = settings(text)
    assert conf["ClusterName"] == name
    assert conf["SlurmctldHost"] == "controller-1"
    assert conf["KillWait"] == kill_wait
    assert (conf["RequeueExit"], conf["JobRequeue"], conf["JobFileAppend"]) == ("75", "1", "1")
    assert conf["ResumeProgram"] == "/opt/gpufleet/bin/slurm-resume"
    assert conf["SlurmdSpoolDir"] == "/var/spool/slurmd/%n"
    assert conf["StateSaveLocation"] == "/var/spool/slurmctld"
    span = "" if name == "prod" else " MaxNodes=1"  # queue partitions' nodes cannot reach each other
    assert f"PartitionName=gpu Nodes=gpu-[1-4] Default=YES MaxTime=INFINITE{span} State=UP OverSubscribe=NO" in (
        text.splitlines())
    assert conf["SrunPortRange"] == "60001-63000"


def test_dev_renders_scale_to_zero_spot_nodes():
    text = render_slurm_conf(slurm.cluster(stack("dev"), "controller-1", PROGRAMS))
    assert node_line(text) == ("NodeName=gpu-[1-4] CPUs=4 RealMemory=15564 Gres=gpu:1 "
                               "Features=g6.xlarge,g5.xlarge,g6.2xlarge,g5.2xlarge,spot State=CLOUD")
    assert "SuspendExcNodes" not in settings(text)
    assert render_gres_conf(slurm.cluster(stack("dev"), "c", PROGRAMS)).splitlines()[1:] == [
        "NodeName=gpu-[1-4] Name=gpu File=/dev/nvidia0"]


def test_prod_renders_gang_efa_nodes_always_on():
    cluster = slurm.cluster(stack("prod"), "controller-1", PROGRAMS)
    text = render_slurm_conf(cluster)
    assert node_line(text) == ("NodeName=gpu-[1-4] CPUs=192 RealMemory=1992294 Gres=gpu:8 "
                               "Features=p5.48xlarge,efa,gang State=CLOUD")
    assert settings(text)["SuspendExcNodes"] == "gpu-[1-4]"
    assert render_gres_conf(cluster).splitlines()[1:] == ["NodeName=gpu-[1-4] Name=gpu File=/dev/nvidia[0-7]"]


def test_azure_and_tencent_render_eight_gpu_spot_nodes():
    for name, line in [("azure", "NodeName=gpu-[1-4] CPUs=96 RealMemory=875520 Gres=gpu:8 "
                                 "Features=Standard_ND96asr_v4,spot State=CLOUD"),
                       ("tencent", "NodeName=gpu-[1-4] CPUs=80 RealMemory=311296 Gres=gpu:8 "
                                   "Features=GN10Xp.20XLARGE320,spot State=CLOUD")]:
        text = render_slurm_conf(slurm.cluster(stack(name), "controller-1", PROGRAMS))
        assert node_line(text) == line
        assert "SuspendExcNodes" not in settings(text)


# --- each rule: a passing and a failing case --------------------------------------------------------------------

GANG2 = {"gpufleet:mode": "gang", "gpufleet:nodes": {"min": 2, "desired": 2, "max": 2}}


def test_partitions_key_makes_one_slurm_partition_each_the_first_default():
    cfg = stack("dev", **{"gpufleet:mode": None, "gpufleet:instanceTypes": None, "gpufleet:nodes": None,
                          "gpufleet:spot": None, "gpufleet:partitions": [
                              {"name": "small", "instanceTypes": ["g6.xlarge"], "nodes": {"max": 8}, "spot": True},
                              {"name": "big", "instanceTypes": ["p5.48xlarge"], "nodes": {"min": 1, "max": 2},
                               "gang": True}]})
    small, big = slurm.partitions(cfg)
    assert (small.name, small.count, small.always_on, small.default, small.features) == (
        "small", 8, 0, True, ("g6.xlarge", "spot"))
    assert (big.name, big.count, big.always_on, big.default, big.features, big.gpus) == (
        "big", 2, 1, False, ("p5.48xlarge", "efa", "gang"), 8)
    text = render_slurm_conf(slurm.cluster(cfg, "c", PROGRAMS))
    assert "PartitionName=big Nodes=big-[1-2] Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO" in text
    assert "PartitionName=small Nodes=small-[1-8] Default=YES MaxTime=INFINITE MaxNodes=1 State=UP" in text
    assert settings(text)["SuspendExcNodes"] == "big-1"


def test_count_is_nodes_max_and_always_on_nodes_min():
    (p,) = slurm.partitions(stack("dev", **{"gpufleet:nodes": {"min": 1, "desired": 2, "max": 7}}))
    assert (p.count, p.always_on) == (7, 1)
    assert settings(render_slurm_conf(slurm.cluster(
        stack("dev", **{"gpufleet:nodes": {"min": 1, "desired": 2, "max": 7}}), "c", PROGRAMS)))[
        "SuspendExcNodes"] == "gpu-1"


def test_spot_feature_only_when_spot():
    assert "spot" in features(stack("dev"))
    assert features(stack("dev", **{"gpufleet:spot": False})) == (
        "g6.xlarge", "g5.xlarge", "g6.2xlarge", "g5.2xlarge")


def test_efa_needs_gang_mode_and_an_efa_primary():
    assert features(stack("prod")) == ("p5.48xlarge", "efa", "gang")
    # the same EFA type in queue mode: no efa, no gang
    queue = stack("prod", **{"gpufleet:mode": "queue", "gpufleet:nodes": {"min": 0, "desired": 0, "max": 4}})
    assert features(queue) == ("p5.48xlarge",)
    # gang mode on a single node of a type without EFA: gang, no efa
    single = stack("dev", **{"gpufleet:mode": "gang", "gpufleet:instanceTypes": ["g6.xlarge"],
                             "gpufleet:nodes": {"min": 1, "desired": 1, "max": 1}})
    assert features(single) == ("g6.xlarge", "spot", "gang")


def test_efa_from_the_primary_type_only():
    # g5.8xlarge has one EFA interface: gang over EFA
    efa = stack("dev", **{**GANG2, "gpufleet:instanceTypes": ["g5.8xlarge"]})
    assert features(efa) == ("g5.8xlarge", "spot", "efa", "gang")


def test_infiniband_needs_gang_mode_and_an_infiniband_type():
    assert features(stack("azure")) == ("Standard_ND96asr_v4", "spot")
    # an Azure gang shares InfiniBand in an availability set, which takes no spot VMs
    assert features(stack("azure", **GANG2, **{"gpufleet:spot": False})) == ("Standard_ND96asr_v4", "infiniband",
                                                                             "gang")


def test_tencent_gang_has_no_fabric_feature():
    assert features(stack("tencent", **GANG2)) == ("GN10Xp.20XLARGE320", "spot", "gang")


def test_shape_from_the_primary_type():
    cfg = stack("dev", **{"gpufleet:instanceTypes": ["g6.2xlarge", "g6.xlarge"]})
    (p,) = slurm.partitions(cfg)
    assert (p.cpus, p.memory_mb, p.gpus, p.features) == (8, 31129, 1, ("g6.2xlarge", "g6.xlarge", "spot"))


@pytest.mark.parametrize("gib,mb", [(16, 15564), (32, 31129), (40, 38912), (900, 875520), (2048, 1992294)])
def test_memory_is_nominal_less_five_percent_rounded_down(gib, mb):
    row = catalog.InstanceType("t", "aws", "g5", 1, "X", 1, 1, gib, 1, 0, 0, False, 0, 1.0)
    assert slurm.memory_mb(row) == mb
    assert mb <= gib * 1024 * 0.95 < mb + 1


@pytest.mark.parametrize("name", catalog.names())
def test_every_catalog_type_leaves_a_reserve(name):
    row = catalog.lookup(name)
    nominal = row.memory_gib * 1024
    assert 0.949 * nominal < slurm.memory_mb(row) <= 0.95 * nominal


def test_partitions_is_pure():
    cfg = stack("prod")
    assert slurm.partitions(cfg) == slurm.partitions(cfg)
    assert slurm.cluster(cfg, "c", PROGRAMS) == slurm.cluster(cfg, "c", PROGRAMS)
