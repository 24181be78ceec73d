"""`python -m trainer preflight`: check this node's hardware against its instance type's row in node.json.

Checks GPU count against the instance type, EFA devices against what the launch template
attaches, the NVIDIA fabric manager on NVSwitch types, and the NCCL network plugin on EFA types.
Each check prints its finding; the exit status is 0 when all pass, 1 otherwise. A Slurm node runs the same
checks against its Slurm definition as its health check (trainer.slurm.nodes.health), which drains a node
that fails. The probe is injectable: the logic needs no GPU.
"""
from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from trainer.errors import ArgumentParser, UsageError
from trainer.node import node_schema
from trainer.node.platform import open_platform

log = logging.getLogger("gpufleet.preflight")

NODE_JSON = node_schema.PATH
NCCL_PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64", "/opt/aws-ofi-nccl/lib",
                    "/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.check}: {self.detail}"


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


class HostProbe:
    """What this machine has, read from the NVIDIA driver, libfabric, sysfs and systemd."""

    def gpu_count(self) -> int:
        try:
            import pynvml  # lazy: optional (nvidia-ml-py)

            pynvml.nvmlInit()
            try:
                return pynvml.nvmlDeviceGetCount()
            finally:
                pynvml.nvmlShutdown()
        except Exception:
            out = _run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"])
            return len([ln for ln in (out or "").splitlines() if ln.strip()])

    def efa_devices(self) -> int:
        out = _run(["fi_info", "-p", "efa", "-t", "FI_EP_RDM"])
        if out is not None:
            return len({ln.split(":", 1)[1].strip() for ln in out.splitlines()
                        if ln.strip().startswith("domain:")})
        return len(glob.glob("/sys/class/infiniband/*efa*"))

    def fabric_manager_active(self) -> bool:
        out = _run(["systemctl", "is-active", "nvidia-fabricmanager"])
        return (out or "").strip() == "active"

    def nccl_net_plugin(self) -> str | None:
        dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(NCCL_PLUGIN_DIRS)
        for d in dirs:
            found = sorted(glob.glob(os.path.join(d, "libnccl-net*.so*")))
            if found:
                return found[0]
        return None


def check(expected: dict, probe) -> list[Finding]:
    """Compare ``probe`` with node.json's row for this type: {"gpus", "efa", "nvswitch", ...}."""
    findings = []
    gpus = probe.gpu_count()
    findings.append(Finding("gpus", gpus == expected["gpus"], f"{gpus} found, {expected['gpus']} expected"))
    want_efa = int(expected.get("efa", 0))
    if want_efa:
        efa = probe.efa_devices()
        findings.append(Finding("efa", efa >= want_efa, f"{efa} EFA devices found, {want_efa} expected"))
        plugin = probe.nccl_net_plugin()
        findings.append(Finding("nccl-net-plugin", plugin is not None,
                                plugin or "no libnccl-net*.so on LD_LIBRARY_PATH or the usual library dirs"))
    else:
        findings.append(Finding("efa", True, "not used by this instance type"))
    if expected.get("nvswitch"):
        active = probe.fabric_manager_active()
        findings.append(Finding("fabric-manager", active,
                                "nvidia-fabricmanager active" if active else "nvidia-fabricmanager is not active"))
    else:
        findings.append(Finding("fabric-manager", True, "not needed (no NVSwitch)"))
    return findings


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer preflight", description=__doc__.splitlines()[0])
    p.add_argument("--node-json", default=NODE_JSON, help="node settings (default %(default)s)")
    p.add_argument("--instance-type", help="default: from the instance metadata")
    return p


def main(argv: list[str] | None = None, probe=None) -> int:
    args = parser().parse_args(argv)
    node = node_schema.load(args.node_json)
    instance_type = args.instance_type or open_platform(node).instance_type()
    if not instance_type:
        raise UsageError("--instance-type: required off a cloud node (no instance metadata)")
    types = node.get("instance_types", {})
    if instance_type not in types:
        raise UsageError(f"--instance-type: {instance_type!r} is not in node.json (allowed: {', '.join(sorted(types))})")
    findings = check(types[instance_type], probe or HostProbe())
    for f in findings:
        print(f.line())
    ok = all(f.ok for f in findings)
    print(f"preflight {'passed' if ok else 'FAILED'} on {instance_type}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
