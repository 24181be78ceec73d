"""cloud-init user-data for GPU nodes: write /etc/gpufleet/node.json, then start preflight and the agent.

The image (ami/) carries everything else; user-data only configures and starts. Pure: no Pulumi, no I/O.
"""
from __future__ import annotations

import json
import re

import yaml

NODE_JSON_PATH = "/etc/gpufleet/node.json"
UNITS = ("gpufleet-preflight.service", "gpufleet-agent.service")
AWS_USER_DATA_LIMIT = 16 * 1024  # bytes of user data EC2 accepts before base64
TENCENT_USER_DATA_LIMIT = 16 * 1024  # bytes of base64 user data a Tencent launch configuration accepts

REQUIRED = ("cloud", "stack", "region", "mode", "node_count", "bucket", "queue_url", "asg_name",
            "log_group", "metric_namespace", "instance_types")
AZURE_REQUIRED = ("client_id", "resource_group", "subscription_id")
TENCENT_REQUIRED = ("app_id", "role_name", "cos_endpoint")
# Names of settings that would be secrets; node.json is world-readable and user-data is not secret storage.
_SECRET_NAME = re.compile(r"secret|password|passwd|token|credential|private_key|access_key|connection_string|sas",
                          re.IGNORECASE)
_SAS_SIGNATURE = re.compile(r"[?&]sig=", re.IGNORECASE)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so node.json reads as it is written."""


def _str(dumper: yaml.SafeDumper, value: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def _check_no_secrets(value, path: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if _SECRET_NAME.search(str(key)):
                raise ValueError(f"node.{path}{key}: secrets do not belong in user-data (use the node's identity)")
            _check_no_secrets(item, f"{path}{key}.")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_no_secrets(item, f"{path}{i}.")
    elif isinstance(value, str) and _SAS_SIGNATURE.search(value):
        raise ValueError(f"node.{path.rstrip('.')}: a SAS-signed URL is a secret; give the plain URL")


def checked_settings(node: dict) -> dict:
    """The node.json document: the contract's keys checked, hooks defaulting to null."""
    missing = [k for k in REQUIRED if k not in node]
    if missing:
        raise ValueError(f"node settings: missing {', '.join(missing)}")
    if node["cloud"] not in ("aws", "azure", "tencent"):
        raise ValueError(f"node.cloud: {node['cloud']!r} is not one of aws, azure, tencent")
    if node["mode"] not in ("queue", "gang"):
        raise ValueError(f"node.mode: {node['mode']!r} is not one of queue, gang")
    if not isinstance(node["instance_types"], dict) or not node["instance_types"]:
        raise ValueError("node.instance_types: a non-empty map of instance type -> {gpus, efa, nvswitch, ...}")
    for cloud, required in (("azure", AZURE_REQUIRED), ("tencent", TENCENT_REQUIRED)):
        if node["cloud"] == cloud:
            given = node.get(cloud) or {}
            absent = [k for k in required if not given.get(k)]
            if absent:
                raise ValueError(f"node.{cloud}: missing {', '.join(absent)}")
    _check_no_secrets(node, "")
    return {"launch_hook": None, "terminate_hook": None, **node}


def render_user_data(node: dict) -> str:
    """cloud-config text ("#cloud-config" first) that writes node.json (0644 root) and starts the units."""
    settings = checked_settings(node)
    doc = {
        "write_files": [{
            "path": NODE_JSON_PATH,
            "owner": "root:root",
            "permissions": "0644",
            "content": json.dumps(settings, indent=2, sort_keys=True) + "\n",
        }],
        # Enabled, so they come back after a reboot; --no-block keeps cloud-final from waiting on preflight.
        "runcmd": [
            ["systemctl", "daemon-reload"],
            ["systemctl", "enable", *UNITS],
            ["systemctl", "start", "--no-block", *UNITS],
        ],
    }
    text = "#cloud-config\n" + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120)
    if settings["cloud"] == "aws" and len(text.encode()) > AWS_USER_DATA_LIMIT:
        raise ValueError(f"user-data is {len(text.encode())} bytes; EC2 accepts at most {AWS_USER_DATA_LIMIT}")
    encoded = 4 * -(-len(text.encode()) // 3)
    if settings["cloud"] == "tencent" and encoded > TENCENT_USER_DATA_LIMIT:
        raise ValueError(f"user-data is {encoded} bytes in base64; a launch configuration accepts at most "
                         f"{TENCENT_USER_DATA_LIMIT}")
    return text
