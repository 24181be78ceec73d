"""The image's Slurm TaskProlog hands every task the node's NCCL/EFA settings (Slurm sets what it prints)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROLOG = ROOT / "ami" / "files" / "gpufleet-task-prolog.sh"
NCCL_ENV = """# Written by ami/scripts/60-nccl-env.sh at bake time: efa-installer=1.41.0
FI_PROVIDER=efa
FI_EFA_FORK_SAFE=1
NCCL_SOCKET_IFNAME=^docker,lo
NCCL_NET_PLUGIN=ofi
LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/cuda/lib64
"""


def prolog(settings: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(PROLOG), str(settings)], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], **env})


def test_each_setting_is_an_export_and_the_tasks_library_path_comes_after_the_nodes(tmp_path):
    settings = tmp_path / "nccl.env"
    settings.write_text(NCCL_ENV)
    done = prolog(settings, LD_LIBRARY_PATH="/home/me/lib")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines() == [
        "export FI_PROVIDER=efa", "export FI_EFA_FORK_SAFE=1", "export NCCL_SOCKET_IFNAME=^docker,lo",
        "export NCCL_NET_PLUGIN=ofi",
        "export LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/cuda/lib64:/home/me/lib"]
    assert prolog(settings).stdout.splitlines()[-1] == (
        "export LD_LIBRARY_PATH=/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/cuda/lib64")


def test_no_settings_file_no_exports_and_odd_lines_are_skipped(tmp_path):
    assert prolog(tmp_path / "absent").stdout == ""
    settings = tmp_path / "nccl.env"
    settings.write_text("not a setting\n1BAD=x\nA-B=y\nNCCL_IB_DISABLE=1")  # and no newline at the end
    assert prolog(settings).stdout == "export NCCL_IB_DISABLE=1\n"


def test_the_image_installs_it_where_slurm_conf_names_it():
    from trainer.slurm.conf import IMAGE_TASK_PROLOG

    script = (ROOT / "ami" / "scripts" / "45-slurm.sh").read_text()
    assert f"files/gpufleet-task-prolog.sh {IMAGE_TASK_PROLOG}" in script
