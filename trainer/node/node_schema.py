"""node.json: the node settings that user-data writes (infra.userdata) and the node's commands read.

One schema for both sides. The writer checks a complete document (``check(node, complete=True)``:
every required key, the cloud's own keys, no secrets); a reader (agent, preflight, rendezvous, train)
checks what the file holds (``load``: a JSON object whose keys have the right types), so a partial
node.json made by hand for a laptop or a test still works. Errors are ValueError with one line that
names the key; ``load`` turns them into UsageError naming the file.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from trainer.errors import UsageError

PATH = "/etc/gpufleet/node.json"
CLOUDS = ("aws", "azure", "tencent")
MODES = ("queue", "gang")
REQUIRED = ("cloud", "stack", "region", "mode", "node_count", "bucket", "queue_url", "asg_name",
            "log_group", "metric_namespace", "instance_types")
AZURE_REQUIRED = ("client_id", "resource_group", "subscription_id")
TENCENT_REQUIRED = ("app_id", "role_name", "cos_endpoint")
CLOUD_REQUIRED = {"azure": AZURE_REQUIRED, "tencent": TENCENT_REQUIRED}  # each under the key named by the cloud
HOOKS = ("launch_hook", "terminate_hook")
TEXT = ("stack", "region", "bucket", "queue_url", "asg_name", "log_group", "metric_namespace")
# Names of settings that would be secrets; node.json is world-readable and user-data is not secret storage.
_SECRET_NAME = re.compile(r"secret|password|passwd|token|credential|private_key|access_key|connection_string|sas",
                          re.IGNORECASE)
_SAS_SIGNATURE = re.compile(r"[?&]sig=", re.IGNORECASE)


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


def _kind(value) -> str:
    return "null" if value is None else {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__)


def check(node, complete: bool = False) -> dict:
    """The checked settings (hooks default to null); ValueError names the first bad key.

    ``complete``: the writer's check, every required key present and no secrets.
    """
    if not isinstance(node, dict):
        raise ValueError(f"node settings: expected a JSON object, got {_kind(node)}")
    if complete:
        missing = [k for k in REQUIRED if k not in node]
        if missing:
            raise ValueError(f"node settings: missing {', '.join(missing)}")
    if "cloud" in node and node["cloud"] not in CLOUDS:
        raise ValueError(f"node.cloud: {node['cloud']!r} is not one of {', '.join(CLOUDS)}")
    if "mode" in node and node["mode"] not in MODES:
        raise ValueError(f"node.mode: {node['mode']!r} is not one of {', '.join(MODES)}")
    for key in TEXT:
        if key in node and not (isinstance(node[key], str) and node[key]):
            raise ValueError(f"node.{key}: expected a non-empty string, got {_kind(node[key])}")
    for key in HOOKS:
        if node.get(key) is not None and not isinstance(node[key], str):
            raise ValueError(f"node.{key}: expected a string or null, got {_kind(node[key])}")
    count = node.get("node_count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"node.node_count: {count!r} is not allowed; expected an integer >= 1")
    types = node.get("instance_types", {"-": {}} if not complete else None)
    if not isinstance(types, dict) or not types or not all(isinstance(row, dict) for row in types.values()):
        raise ValueError("node.instance_types: a non-empty map of instance type -> {gpus, efa, nvswitch, ...}")
    for cloud, required in CLOUD_REQUIRED.items():
        own = node.get(cloud)
        if own is not None and not isinstance(own, dict):
            raise ValueError(f"node.{cloud}: expected an object, got {_kind(own)}")
        vault = (own or {}).get("key_vault") if cloud == "azure" else None
        if vault is not None and not (isinstance(vault, str) and vault):
            raise ValueError(f"node.azure.key_vault: expected a Key Vault name or null, got {_kind(vault)}")
        if complete and node["cloud"] == cloud:
            absent = [k for k in required if not (own or {}).get(k)]
            if absent:
                raise ValueError(f"node.{cloud}: missing {', '.join(absent)}")
    if complete:
        _check_no_secrets(node, "")
    return {"launch_hook": None, "terminate_hook": None, **node}


def load(path: str | Path, required: bool = True, hint: str = "user-data writes it on cluster nodes") -> dict:
    """The checked settings in ``path``; {} when it is absent and not required. UsageError in one line."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        if required:
            raise UsageError(f"--node-json: {path} does not exist ({hint})") from None
        return {}
    except OSError as exc:
        raise UsageError(f"--node-json: {path}: cannot read it ({exc.strerror})") from None
    try:
        return check(json.loads(text))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError too
        raise UsageError(f"--node-json: {path}: {exc}") from None
