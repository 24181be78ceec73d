"""cloud-init user-data for GPU nodes: write /etc/gpufleet/node.json, then start preflight and the agent.

node.json's schema is the trainer's (trainer.node.node_schema), so what is written is what the node reads.

The image (ami/) carries everything else; user-data only configures and starts. Pure: no Pulumi, no I/O.
"""
from __future__ import annotations

import json

import yaml

from trainer.node import node_schema

NODE_JSON_PATH = node_schema.PATH
UNITS = ("gpufleet-preflight.service", "gpufleet-agent.service")
AWS_USER_DATA_LIMIT = 16 * 1024  # bytes of user data EC2 accepts before base64
TENCENT_USER_DATA_LIMIT = 16 * 1024  # bytes of base64 user data a Tencent launch configuration accepts


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so node.json reads as it is written."""


def _str(dumper: yaml.SafeDumper, value: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def render_user_data(node: dict) -> str:
    """cloud-config text ("#cloud-config" first) that writes node.json (0644 root) and starts the units."""
    settings = node_schema.check(node, complete=True)
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
