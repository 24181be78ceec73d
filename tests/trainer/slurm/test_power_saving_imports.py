"""Slurm's power-saving programs (`python -m trainer nodes resume|suspend HOSTLIST`, run by slurmctld for every
power-up and power-down) load no torch: the node providers reach their cloud module (and its stop-notice watcher,
trainer.loop.notices and trainer.loop.stop) without the training loop's dependencies.

Each cloud's suspend runs in a fresh Python process through the command's entry point (trainer.__main__.main, as
`python -m trainer` runs it), against what answers on loopback: moto for AWS (the suspend completes), the fake
managed-identity endpoint of tests/trainer/fake_azure_compute.py refusing the config's identity for Azure, and the
fake CVM metadata service of tests/trainer/fake_tencent.py without the controller's CAM role for Tencent Cloud (the
suspend ends, in one line, at its first credential, before any request to the cloud's API). Whatever the suspend
imported by then, module top or lazily, is in sys.modules when the driver prints them. How long the start-up takes
is measured in `make bench` (bench/bench_slurm.py), not asserted here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from tests.trainer.fake_azure_compute import FakeAzure
from tests.trainer.fake_tencent import FakeMetadata

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "numpy")  # the training loop's; a power-saving program needs neither

# The command's entry point, then what the process holds once it returned.
DRIVER = """\
import json, sys
from trainer.__main__ import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""


def suspend(tmp_path: Path, config: dict, hostlist: str, env: dict[str, str | None]) -> tuple[int, list[str], str]:
    """`python -m trainer nodes suspend HOSTLIST --config FILE` through the driver, with ``env`` over this
    process's environment (None: unset): its status, the modules the process loaded, its stderr."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({**config, "slurm_conf": str(conf)}))
    environ = {k: v for k, v in {**os.environ, "SLURM_CONF": str(conf), **env}.items() if v is not None}
    done = subprocess.run([sys.executable, "-c", DRIVER, "nodes", "suspend", hostlist, "--config", str(path)],
                          cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip(), done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["status"], out["modules"], done.stderr


def heavy(modules: list[str]) -> list[str]:
    return sorted({m.partition(".")[0] for m in modules} & set(HEAVY))


def test_the_aws_suspend_loads_no_torch(moto_endpoint, tmp_path):
    region = "us-east-2"
    ec2 = boto3.client("ec2", region_name=region)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    config = {"provider": "aws", "cloud": "aws", "stack": "dev", "region": region, "tags": {},
              "partitions": {"gpu": {"instance_types": ["g5.xlarge"], "spot": False, "on_demand_base": 0,
                                     "gang": False, "launch_template_id": "lt-0123456789abcdef0",
                                     "subnet_ids": [subnet], "placement_group": None}}}
    status, modules, stderr = suspend(tmp_path, config, "gpu-[1-2]", {})
    assert status == 0, stderr
    assert "nodes gpu-1, gpu-2: no instance to terminate" in stderr
    assert {"trainer.clouds.aws_nodes", "trainer.clouds.aws", "trainer.loop.notices", "botocore"} <= set(modules)
    assert heavy(modules) == []


def test_the_azure_suspend_loads_no_torch(tmp_path):
    with FakeAzure() as fake:  # its identity endpoint answers cid-controller only
        config = {"provider": "azure", "cloud": "azure", "stack": "t", "region": "westeurope",
                  "client_id": "cid-someone-else", "tags": {},
                  "partitions": {"gpu": {
                      "subscription_id": "0000-sub", "resource_group": "rg-gpufleet-t", "location": "westeurope",
                      "subnet_id": "/subscriptions/0000-sub/x/subnets/nodes", "image": "/subscriptions/0000-sub/x/i",
                      "identity_id": "/subscriptions/0000-sub/x/nodes", "admin_username": "gpufleet",
                      "ssh_public_key": "ssh-ed25519 AAAAC3Nza test@gpufleet", "os_disk_gb": 256,
                      "custom_data": "I2Nsb3VkLWNvbmZpZw==",
                      "vm_size": "Standard_ND96isr_H100_v5", "scale_set_id": "/subscriptions/0000-sub/x/ss"}}}
        env = {"AZURE_POD_IDENTITY_AUTHORITY_HOST": fake.base_url, "AZURE_CLIENT_ID": None,
               "AZURE_SDK_CLOUD_CONF": None}
        status, modules, stderr = suspend(tmp_path, config, "gpu-1", env)
    assert status == 1, stderr
    assert stderr.strip().splitlines()[-1].startswith("error: nodes suspend: 1 of 1 node(s) not deleted")
    assert "no token of the managed identity" in stderr  # refused by the fake, before any request to Azure
    assert {"trainer.clouds.azure_nodes", "trainer.clouds.azure", "trainer.loop.notices", "azure.identity"} <= \
        set(modules)
    assert heavy(modules) == []


def test_the_tencent_suspend_loads_no_torch(tmp_path):
    with FakeMetadata() as metadata:
        metadata.set("meta-data/cam/security-credentials/", None)  # no CAM role: no key, no API request
        config = {"provider": "tencent", "cloud": "tencent", "stack": "tencent", "region": "ap-shanghai",
                  "tags": {}, "partitions": {"gpu": {}}}
        env = {"TENCENTCLOUD_METADATA_ENDPOINT": metadata.endpoint, "TENCENTCLOUD_SECRET_ID": None,
               "TENCENTCLOUD_SECRETID": None}
        status, modules, stderr = suspend(tmp_path, config, "gpu-1", env)
        assert metadata.gets  # the suspend went as far as its first credential
    assert status == 1, stderr
    assert stderr.strip().splitlines()[-1] == ("error: nodes suspend: this instance has no CAM role "
                                                "(meta-data/cam/security-credentials/)")
    assert {"trainer.clouds.tencent_nodes", "trainer.clouds.tencent", "trainer.loop.notices"} <= set(modules)
    assert heavy(modules) == []


@pytest.mark.parametrize("cloud", ["aws", "azure", "tencent"])
def test_the_driver_sees_torch_where_it_is_loaded(cloud, tmp_path):
    """The check is not blind: a process that imported torch before the command is reported."""
    modules = subprocess.run([sys.executable, "-c", f"import sys, torch, trainer.clouds.{cloud}_nodes; "
                              "print('\\n'.join(sys.modules))"], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=120).stdout.split()
    assert heavy(modules) == ["numpy", "torch"]
