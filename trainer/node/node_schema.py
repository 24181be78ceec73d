"""node.json: the node settings that user-data writes (infra.userdata) and the node's commands read.

One schema for both sides. The writer checks a complete document (``check(node, complete=True)``:
every required key, the cloud's own keys, no secrets); a reader (the per-node task, preflight, train)
checks what the file holds (``load``: a JSON object whose keys have the right types), so a partial
node.json made by hand for a laptop or a test still works. Errors are ValueError with one line that
names the key; ``load`` turns them into UsageError naming the file.

Two optional parts serve a Slurm node (checked here for node.json and for the controller's controller.json):
- ``slurm``: ``{"controller_addr", "controller_port", "munge"}``: where slurmctld listens (slurmd fetches its
  config from there, configless) and the secret that holds the stack's munge key: a reference (ARN, Key Vault
  secret URL, SSM name), never the key itself.
- ``mounts``: ``[{"source", "target", "type", "options"}]``: network file systems (EFS over TLS, NFS) that
  user-data has cloud-init mount.

``teams``: the stack's team names (``gpufleet:teams``): setup makes each team's Unix user, whom its jobs run as
(trainer.slurm.users); none given, the one team ``default``.

An AWS node also has ``aws``: ``{"job_role_arn", "bucket"}``: the role its credentials daemon assumes for each job
(narrowed to the job's prefix of the bucket), and that bucket's name; neither is a secret. A Tencent node has the
same two keys in its ``tencent`` object (the job role as ``qcs::cam::uin/<uin>:roleName/<name>``). An Azure node
has ``azure.team_client_ids``: each team's user-assigned identity, whose tokens its jobs get.

controller.json (``check_controller``, ``load_controller``) is the controller's: the bridge's settings, the
Slurm state directory, its own ``slurm`` object and ``mounts``, and the cloud's own keys as node.json has them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

from trainer.errors import UsageError

PATH = "/etc/gpufleet/node.json"
CONTROLLER_PATH = "/etc/gpufleet/controller.json"
CLOUDS = ("aws", "azure", "tencent")
# asg_name: the value of the nodes' group dimension of their metrics (trainer.node.metric_names.ASG), which the
# stack's dashboard and alarms read. Keys beyond these are ignored.
REQUIRED = ("cloud", "stack", "region", "asg_name", "log_group", "metric_namespace", "instance_types")
AZURE_REQUIRED = ("client_id", "resource_group", "subscription_id")
TENCENT_REQUIRED = ("app_id", "role_name", "cos_endpoint")
CLOUD_REQUIRED = {"azure": AZURE_REQUIRED, "tencent": TENCENT_REQUIRED}  # each under the key named by the cloud
TEXT = ("stack", "region", "asg_name", "log_group", "metric_namespace")
SLURM_KEYS = ("controller_addr", "controller_port", "munge")
MOUNT_KEYS = ("source", "target", "type", "options")
MOUNT_TYPES = ("efs", "aznfs", "nfs4", "nfs")
AWS_KEYS = ("job_role_arn", "bucket")
# An IAM role's ARN in any partition (aws, aws-cn, aws-us-gov), a path allowed.
_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+\Z")
_CAM_ROLE = re.compile(r"qcs::cam::uin/\d+:roleName/[\w+=,.@-]+\Z")  # a Tencent CAM role, as STS AssumeRole takes it
TLS_MOUNTS = {"efs": "EFS (amazon-efs-utils)", "aznfs": "Azure Files NFS (the AZNFS mount helper)"}
# controller.json: what the controller's setup and the bridge read (plus slurm, mounts and the cloud's own keys).
CONTROLLER_REQUIRED = ("cloud", "stack", "region", "bucket", "queue_url", "slurm", "partition", "gpus",
                       "instance_type", "state_dir")
CONTROLLER_TEXT = ("stack", "region", "bucket", "queue_url")
# A host name or an IPv4/IPv6 address: it goes on slurmd's command line (--conf-server) as it is.
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]*\Z")
# A secret reference is short: an ARN, a Key Vault secret URL, an SSM parameter or secret name. The key itself
# (1024 random bytes, 1368 in base64) is not a reference.
_MAX_REFERENCE = 512
_PARTITION = re.compile(r"[a-z][a-z0-9]{0,14}\Z")  # trainer.slurm.conf's partition names
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# Names of settings that would be secrets; node.json is world-readable and user-data is not secret storage.
_SECRET_NAME = re.compile(r"secret|password|passwd|token|credential|private_key|access_key|connection_string|sas",
                          re.IGNORECASE)
_SAS_SIGNATURE = re.compile(r"[?&]sig=", re.IGNORECASE)


def _check_no_secrets(value, path: str, doc: str = "node") -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if _SECRET_NAME.search(str(key)):
                raise ValueError(f"{doc}.{path}{key}: secrets do not belong in user-data (use the node's identity)")
            _check_no_secrets(item, f"{path}{key}.", doc)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_no_secrets(item, f"{path}{i}.", doc)
    elif isinstance(value, str) and _SAS_SIGNATURE.search(value):
        raise ValueError(f"{doc}.{path.rstrip('.')}: a SAS-signed URL is a secret; give the plain URL")


def check_no_secrets(value, doc: str) -> None:
    """The writer's guard for any document user-data carries (``doc`` names it in the error): no key named like a
    secret, no SAS-signed URL."""
    _check_no_secrets(value, "", doc)


def _unknown(doc: str, path: str, value: dict, allowed: tuple[str, ...]) -> None:
    for key in value:
        if key not in allowed:
            if _SECRET_NAME.search(str(key)):
                raise ValueError(f"{doc}.{path}.{key}: secrets do not belong in user-data (use the node's identity)")
            raise ValueError(f"{doc}.{path}.{key}: unknown key; expected {', '.join(allowed)}")


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _object(value, doc: str, name: str, keys: tuple[str, ...]) -> None:
    """``value`` is an object of exactly ``keys`` (ValueError names what is wrong)."""
    if not isinstance(value, dict):
        raise ValueError(f"{doc}.{name}: expected an object with {', '.join(keys)}, got {_kind(value)}")
    _unknown(doc, name, value, keys)
    missing = [k for k in keys if k not in value]
    if missing:
        raise ValueError(f"{doc}.{name}: missing {', '.join(missing)}")


def check_slurm(value, doc: str = "node") -> dict:
    """The ``slurm`` object: ``controller_addr`` (a host name or address), ``controller_port`` (1-65535) and
    ``munge`` (the reference of the secret holding the munge key). ValueError names the key."""
    _object(value, doc, "slurm", SLURM_KEYS)
    addr, port, munge = value["controller_addr"], value["controller_port"], value["munge"]
    if not (isinstance(addr, str) and _HOST.match(addr)):
        raise ValueError(f"{doc}.slurm.controller_addr: {addr!r} is not allowed; expected the controller's host "
                         "name or IP address")
    if not (_int(port) and 1 <= port <= 65535):
        raise ValueError(f"{doc}.slurm.controller_port: {port!r} is not allowed; expected an integer 1-65535")
    if not (isinstance(munge, str) and munge):
        got = "an empty string" if munge == "" else _kind(munge)
        raise ValueError(f"{doc}.slurm.munge: expected a non-empty string (the secret that holds the munge key), "
                         f"got {got}")
    if len(munge) > _MAX_REFERENCE or any(c.isspace() for c in munge):
        raise ValueError(f"{doc}.slurm.munge: expected the reference of the secret that holds the munge key (an "
                         "ARN, a Key Vault secret URL or a secret name), not the key itself")
    return value


def check_aws(value, doc: str = "node") -> dict:
    """The ``aws`` object: ``job_role_arn`` (an IAM role's ARN) and ``bucket`` (the stack bucket's name), both
    required. ValueError names the key."""
    _object(value, doc, "aws", AWS_KEYS)
    for key in AWS_KEYS:
        item = value[key]
        if not (isinstance(item, str) and item and not any(c.isspace() for c in item)):
            got = "an empty string" if item == "" else repr(item) if isinstance(item, str) else _kind(item)
            raise ValueError(f"{doc}.aws.{key}: expected a non-empty string without spaces, got {got}")
    if not _ROLE_ARN.match(value["job_role_arn"]):
        raise ValueError(f"{doc}.aws.job_role_arn: {value['job_role_arn']!r} is not allowed; expected an IAM role's "
                         "ARN, arn:aws:iam::<12-digit account>:role/<name>")
    return value


def check_mounts(value, doc: str = "node") -> list:
    """The ``mounts`` list: network file systems, each ``{"source": "host:/path" or "fs-id:/path", "target": an
    absolute path, "type": efs|aznfs|nfs4|nfs, "options": "opt,opt" or ""}``. EFS and Azure Files NFS are mounted
    over TLS (their mount helpers' default), so ``notls`` is refused for them. ValueError names the entry and key."""
    if not isinstance(value, list):
        raise ValueError(f"{doc}.mounts: expected a list of {{{', '.join(MOUNT_KEYS)}}}, got {_kind(value)}")
    targets: set[str] = set()
    for i, mount in enumerate(value):
        where = f"{doc}.mounts[{i}]"
        if not isinstance(mount, dict):
            raise ValueError(f"{where}: expected an object with {', '.join(MOUNT_KEYS)}, got {_kind(mount)}")
        _unknown(doc, f"mounts[{i}]", mount, MOUNT_KEYS)
        missing = [k for k in MOUNT_KEYS if k not in mount]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        source, target, kind, options = (mount[k] for k in MOUNT_KEYS)
        if not (isinstance(source, str) and ":" in source and source[0] != ":" and
                not any(c.isspace() for c in source)):
            raise ValueError(f"{where}.source: {source!r} is not allowed; expected host:/path or fs-id:/path (a "
                             "network file system)")
        path = PurePosixPath(target) if isinstance(target, str) else None
        if (path is None or not path.is_absolute() or str(path) != target or ".." in path.parts or target == "/" or
                any(c.isspace() for c in target)):
            raise ValueError(f"{where}.target: {target!r} is not allowed; expected an absolute, normalised path "
                             "other than /")
        if target in targets:
            raise ValueError(f"{where}.target: {target} is mounted twice")
        targets.add(target)
        if kind not in MOUNT_TYPES:
            raise ValueError(f"{where}.type: {kind!r} is not one of {', '.join(MOUNT_TYPES)}")
        if not isinstance(options, str) or any(c.isspace() for c in options):
            raise ValueError(f"{where}.options: expected comma-separated mount options without spaces, got "
                             f"{options!r}")
        if kind in TLS_MOUNTS and "notls" in options.split(","):
            raise ValueError(f"{where}.options: notls is not allowed; {TLS_MOUNTS[kind]} is mounted over TLS")
    return value


def _kind(value) -> str:
    return "null" if value is None else {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__)


def check(node, complete: bool = False) -> dict:
    """The checked settings; ValueError names the first bad key.

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
    for key in TEXT:
        if key in node and not (isinstance(node[key], str) and node[key]):
            raise ValueError(f"node.{key}: expected a non-empty string, got {_kind(node[key])}")
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
        ids = (own or {}).get("team_client_ids") if cloud == "azure" else None
        if ids is not None and not (isinstance(ids, dict) and ids and all(
                isinstance(t, str) and _PARTITION.match(t) and isinstance(c, str) and _WORD.match(c)
                for t, c in ids.items())):
            raise ValueError("node.azure.team_client_ids: expected {team name: the client id of its identity}")
        role = (own or {}).get("job_role_arn") if cloud == "tencent" else None
        if role is not None and not (isinstance(role, str) and _CAM_ROLE.match(role)):
            raise ValueError(f"node.tencent.job_role_arn: {role!r} is not allowed; expected a CAM role, "
                             "qcs::cam::uin/<uin>:roleName/<name>")
        if complete and node["cloud"] == cloud:
            absent = [k for k in required if not (own or {}).get(k)]
            if absent:
                raise ValueError(f"node.{cloud}: missing {', '.join(absent)}")
    if "slurm" in node:
        check_slurm(node["slurm"])
    if "mounts" in node:
        check_mounts(node["mounts"])
    if "aws" in node:
        check_aws(node["aws"])
    if "teams" in node:
        check_team_names(node["teams"])
    if complete:
        _check_no_secrets(node, "")
    return node


def check_team_names(value) -> list:
    """node.json's ``teams``: a non-empty list of distinct team names (trainer.slurm.accounts' TEAM_NAME)."""
    if not (isinstance(value, list) and value and all(isinstance(t, str) and _PARTITION.match(t) for t in value)):
        raise ValueError("node.teams: expected a non-empty list of team names (1-15 lowercase letters and digits, "
                         "starting with a letter)")
    if len(set(value)) != len(value):
        raise ValueError("node.teams: a team is named twice")
    return value


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


def check_controller(doc, complete: bool = False) -> dict:
    """The checked controller.json; ValueError names the first bad key (``controller.KEY``).

    ``complete``: the writer's check (infra's user-data): every required key, the cloud's own keys, no secrets.
    """
    if not isinstance(doc, dict):
        raise ValueError(f"controller settings: expected a JSON object, got {_kind(doc)}")
    missing = [k for k in CONTROLLER_REQUIRED if k not in doc]
    if missing:
        raise ValueError(f"controller settings: missing {', '.join(missing)}")
    if doc["cloud"] not in CLOUDS:
        raise ValueError(f"controller.cloud: {doc['cloud']!r} is not one of {', '.join(CLOUDS)}")
    for key in CONTROLLER_TEXT:
        if not (isinstance(doc[key], str) and doc[key]):
            raise ValueError(f"controller.{key}: expected a non-empty string, got {_kind(doc[key])}")
    check_slurm(doc["slurm"], "controller")
    if not (isinstance(doc["partition"], str) and _PARTITION.match(doc["partition"])):
        raise ValueError(f"controller.partition: {doc['partition']!r} is not allowed; expected 1-15 lowercase "
                         "letters and digits, starting with a letter")
    if not (_int(doc["gpus"]) and doc["gpus"] >= 0):
        raise ValueError(f"controller.gpus: {doc['gpus']!r} is not allowed; expected an integer >= 0")
    if not (isinstance(doc["instance_type"], str) and _WORD.match(doc["instance_type"])):
        raise ValueError(f"controller.instance_type: {doc['instance_type']!r} is not allowed; expected an instance "
                         "type name")
    state = doc["state_dir"]
    path = PurePosixPath(state) if isinstance(state, str) else None
    if path is None or not path.is_absolute() or str(path) != state or ".." in path.parts or state == "/":
        raise ValueError(f"controller.state_dir: {state!r} is not allowed; expected an absolute, normalised path "
                         "other than /")
    shared = doc.get("shared")
    if shared is not None:
        if not (isinstance(shared, dict) and all(isinstance(v, str) and v for v in shared.values())):
            raise ValueError("controller.shared: expected an object of non-empty strings (home, fs)")
        home = shared.get("home")
        if home is not None and not PurePosixPath(home).is_absolute():
            raise ValueError(f"controller.shared.home: {home!r} is not an absolute path")
    if "mounts" in doc:
        check_mounts(doc["mounts"], "controller")
    for cloud, required in CLOUD_REQUIRED.items():
        own = doc.get(cloud)
        if own is not None and not isinstance(own, dict):
            raise ValueError(f"controller.{cloud}: expected an object, got {_kind(own)}")
        if complete and doc["cloud"] == cloud:
            absent = [k for k in required if not (own or {}).get(k)]
            if absent:
                raise ValueError(f"controller.{cloud}: missing {', '.join(absent)}")
    if complete:
        _check_no_secrets(doc, "", "controller")
    return doc


def load_controller(path: str | Path) -> dict:
    """The checked controller.json at ``path``; UsageError in one line."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UsageError(f"--controller-json: {path} does not exist (the controller's user-data writes it)") from None
    except OSError as exc:
        raise UsageError(f"--controller-json: {path}: cannot read it ({exc.strerror})") from None
    try:
        return check_controller(json.loads(text))
    except ValueError as exc:
        raise UsageError(f"--controller-json: {path}: {exc}") from None
