"""Scaler (queue mode): the function in infra/tencent/scaler_fn.py on an SCF timer, once a minute, with
a CAM role that may read the job queue's counts and set this group's desired capacity, nothing else.

Limits: the group follows the backlog within about a minute (the timer), counts come from TDMQ's API
(no alarm evaluation delay), and a failed run is retried by the next tick. The function is deployed from
a zip of scaler_fn.py, infra/scaling.py and trainer/clouds/tencent_api.py that the program writes to the
system's temporary directory (content-addressed: unchanged code is never redeployed); SCF's provider
takes a local zip path.
"""
from __future__ import annotations

import hashlib
import io
import json
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pulumi
from tencentcloud_iac_pulumi import cam, scf

from infra.tencent import derive

_HERE = Path(__file__).resolve().parent
SOURCES = {"scaler_fn.py": _HERE / "scaler_fn.py", "scaling.py": _HERE.parent / "scaling.py",
           "tencent_api.py": _HERE.parents[1] / "trainer" / "clouds" / "tencent_api.py"}
HANDLER = "scaler_fn.main_handler"


def scaler_zip() -> bytes:
    """The function's code: the same bytes for the same sources (fixed timestamps, sorted entries)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(SOURCES):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, SOURCES[name].read_bytes())
    return out.getvalue()


def scaler_zip_path() -> str:
    data = scaler_zip()
    path = Path(tempfile.gettempdir()) / f"gpufleet-scaler-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not path.exists():
        path.write_bytes(data)
    return str(path)


@dataclass(frozen=True)
class ScalerArgs:
    names: derive.Names
    region: str
    uin: pulumi.Input[str]
    group_id: pulumi.Input[str]
    min_size: int
    max_size: int
    tags: dict


class Scaler(pulumi.ComponentResource):
    def __init__(self, name: str, args: ScalerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:Scaler", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        n = args.names
        self.role = cam.Role(f"{name}-role", name=n.scaler_role, document=json.dumps(derive.assume_role("scf.qcloud.com")),
                             description="gpufleet scaler function", console_login=False, tags=args.tags, opts=child)
        self.policy = cam.Policy(
            f"{name}-policy", name=n.scaler_role, description="gpufleet scaler: queue counts, group size",
            document=pulumi.Output.all(args.uin, args.group_id).apply(lambda v: json.dumps(derive.scaler_policy(
                region=args.region, uin=v[0], queue=n.queue, group_id=v[1]))),
            opts=child)
        attachment = cam.RolePolicyAttachment(f"{name}-policy-attachment", role_id=self.role.id,
                                              policy_id=self.policy.id, opts=child)
        self.function = scf.Function(
            f"{name}-function", name=n.scaler, description="nodes = waiting + running jobs, every minute",
            runtime=derive.SCALER_RUNTIME, handler=HANDLER, zip_file=scaler_zip_path(), mem_size=128,
            timeout=derive.SCALER_TIMEOUT_S, role=self.role.name, enable_public_net=True,
            environment=pulumi.Output.from_input(args.group_id).apply(lambda gid: {
                "GPUFLEET_REGION": args.region, "GPUFLEET_QUEUE": n.queue, "GPUFLEET_GROUP_ID": gid,
                "GPUFLEET_MIN": str(args.min_size), "GPUFLEET_MAX": str(args.max_size)}),
            triggers=[{"name": "every-minute", "type": "timer", "trigger_desc": derive.SCALER_CRON}],
            tags=args.tags, opts=pulumi.ResourceOptions(parent=self, depends_on=[attachment]))
        self.register_outputs({"function": self.function.name})
