"""Preflight: checks from an injected probe or real commands on PATH; the instance type from the fake IMDS."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from infra.demo.imds import FakeImds
from trainer.errors import UsageError
from trainer.node.preflight import Finding, HostProbe, check, main

P5 = {"gpus": 8, "efa": 32, "nvswitch": True, "infiniband_gbps": 0}
G5 = {"gpus": 1, "efa": 0, "nvswitch": False, "infiniband_gbps": 0}


class FakeProbe:
    def __init__(self, gpus=8, efa=32, fabric=True, plugin="/opt/amazon/ofi-nccl/lib/libnccl-net.so"):
        self.gpus, self.efa, self.fabric, self.plugin = gpus, efa, fabric, plugin

    def gpu_count(self):
        return self.gpus

    def efa_devices(self):
        return self.efa

    def fabric_manager_active(self):
        return self.fabric

    def nccl_net_plugin(self):
        return self.plugin


def test_all_checks_pass_on_a_healthy_p5():
    findings = check(P5, FakeProbe())
    assert [f.check for f in findings] == ["gpus", "efa", "nccl-net-plugin", "fabric-manager"]
    assert all(f.ok for f in findings)
    assert findings[0].line() == "PASS gpus: 8 found, 8 expected"


def test_each_fault_is_reported():
    findings = {f.check: f for f in check(P5, FakeProbe(gpus=7, efa=16, fabric=False, plugin=None))}
    assert findings["gpus"] == Finding("gpus", False, "7 found, 8 expected")
    assert findings["efa"] == Finding("efa", False, "16 EFA devices found, 32 expected")
    assert not findings["nccl-net-plugin"].ok
    assert findings["fabric-manager"].line() == "FAIL fabric-manager: nvidia-fabricmanager is not active"


def test_single_gpu_type_needs_no_fabric():
    findings = check(G5, FakeProbe(gpus=1, efa=0, fabric=False, plugin=None))
    assert all(f.ok for f in findings)
    assert [f.detail for f in findings][1:] == ["not used by this instance type", "not needed (no NVSwitch)"]


def executable(path, text):
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_host_probe_reads_real_commands(tmp_path, monkeypatch):
    bin_dir, lib_dir = tmp_path / "bin", tmp_path / "lib"
    bin_dir.mkdir(), lib_dir.mkdir()
    executable(bin_dir / "nvidia-smi", "printf '0\\n1\\n2\\n3\\n'\n")
    domains = "".join(f"provider: efa\\n    domain: rdmap{i}s0-rdm\\n    type: FI_EP_RDM\\n" for i in range(4))
    executable(bin_dir / "fi_info", f"printf '{domains}{domains}'\n")  # each domain listed twice
    executable(bin_dir / "systemctl", '[ "$2" = nvidia-fabricmanager ] && echo active\n')
    (lib_dir / "libnccl-net-ofi.so").write_bytes(b"")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(lib_dir))
    probe = HostProbe()
    assert probe.gpu_count() == 4
    assert probe.efa_devices() == 4
    assert probe.fabric_manager_active()
    assert probe.nccl_net_plugin() == str(lib_dir / "libnccl-net-ofi.so")


@pytest.fixture
def node(tmp_path, monkeypatch):
    """An AWS node's node.json and its instance metadata (the fake IMDS), which names its type."""
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"cloud": "aws", "region": "eu-west-1", "instance_types": {"p5.48xlarge": P5}}))
    with FakeImds(instance_type="p5.48xlarge") as imds:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        yield str(path)


def test_a_healthy_node_of_the_type_its_metadata_names_passes(node, capsys):
    assert main(["--node-json", node], probe=FakeProbe()) == 0
    assert "preflight passed on p5.48xlarge" in capsys.readouterr().out


def test_a_failed_check_is_exit_1_with_its_finding(node, capsys):
    assert main(["--node-json", node], probe=FakeProbe(gpus=7)) == 1
    out = capsys.readouterr().out
    assert "FAIL gpus: 7 found, 8 expected" in out and "preflight FAILED on p5.48xlarge" in out


def test_off_a_cloud_node_the_type_is_given(tmp_path, capsys):
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"instance_types": {"g5.xlarge": G5}}))
    with pytest.raises(UsageError, match="--instance-type: required off a cloud node"):
        main(["--node-json", str(path)], probe=FakeProbe(gpus=1))
    assert main(["--node-json", str(path), "--instance-type", "g5.xlarge"], probe=FakeProbe(gpus=1)) == 0
    assert "preflight passed on g5.xlarge" in capsys.readouterr().out


def test_cli_bad_input_is_one_line(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"instance_types": {"g5.xlarge": G5}}))
    for argv, message in [
        (["--node-json", str(tmp_path / "missing.json")], "does not exist"),
        (["--node-json", str(path), "--instance-type", "p9.huge"], "'p9.huge' is not in node.json (allowed: g5.xlarge)"),
    ]:
        proc = subprocess.run([sys.executable, "-m", "trainer", "preflight", *argv], capture_output=True, text=True)
        assert proc.returncode == 2
        assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr
