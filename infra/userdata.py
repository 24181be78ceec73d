"""cloud-init user-data for the machines of a stack. Pure: no Pulumi, no I/O.

The image (ami/) carries everything else; user-data only configures and starts:
- a Slurm GPU node (``render_node_user_data``): /etc/gpufleet/node.json, the stack's network file systems
  (cloud-init ``mounts``), then gpufleet-node.service (``gpufleet-trainer setup node``: munge key, slurmd
  configless from the controller, the node's notice watcher);
- the controller (``render_controller_user_data``): /etc/gpufleet/controller.json and nodes.json (power saving),
  /etc/slurm/slurm.conf and gres.conf (served to the nodes by slurmctld), the mounts, then
  gpufleet-controller.service (``gpufleet-trainer setup controller``: munge key, state directory, slurmctld,
  the bridge).

node.json's and controller.json's schema is the trainer's (trainer.node.node_schema), so what is written is what
the machine reads. Nothing secret goes in user-data: the documents are checked by node_schema's guard (no key
named like a secret, no SAS-signed URL); the munge key is only named (the secret that holds it).
"""
from __future__ import annotations

import json
import re

import yaml

from infra import catalog, metrics, slurm
from infra.aws import efa
from infra.config import Partition, StackConfig
from trainer.node import node_schema

NODE_JSON_PATH = node_schema.PATH
CONTROLLER_JSON_PATH = node_schema.CONTROLLER_PATH
NODES_JSON_PATH = "/etc/gpufleet/nodes.json"  # trainer.slurm.nodes.CONFIG: power saving's settings
SLURM_CONF_PATH = "/etc/slurm/slurm.conf"
GRES_CONF_PATH = "/etc/slurm/gres.conf"
NODE_UNIT = "gpufleet-node.service"
CONTROLLER_UNIT = "gpufleet-controller.service"
AWS_USER_DATA_LIMIT = 16 * 1024  # bytes of user data EC2 accepts before base64
TENCENT_USER_DATA_LIMIT = 16 * 1024  # bytes of base64 user data a Tencent launch configuration accepts
NODES_CONFIG_REQUIRED = ("provider", "cloud", "stack", "region", "slurm_conf", "partitions")
# fstab options every network mount gets: _netdev (wait for the network; systemd cannot tell that an "efs" mount is
# remote), and for EFS efs-utils' mount helper with TLS (its fstab form: "fs-id:/ /mnt/efs efs _netdev,tls,iam").
NETWORK_OPTIONS = ("_netdev",)
EFS_OPTIONS = ("_netdev", "tls")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so node.json reads as it is written."""


def _str(dumper: yaml.SafeDumper, value: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def _dump(doc: dict) -> str:
    return "#cloud-config\n" + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120)


def _check_size(text: str, cloud: str) -> str:
    size = len(text.encode())
    if cloud == "aws" and size > AWS_USER_DATA_LIMIT:
        raise ValueError(f"user-data is {size} bytes; EC2 accepts at most {AWS_USER_DATA_LIMIT}")
    encoded = 4 * -(-size // 3)
    if cloud == "tencent" and encoded > TENCENT_USER_DATA_LIMIT:
        raise ValueError(f"user-data is {encoded} bytes in base64; a launch configuration accepts at most "
                         f"{TENCENT_USER_DATA_LIMIT}")
    return text


def _file(path: str, content: str) -> dict:
    return {"path": path, "owner": "root:root", "permissions": "0644", "content": content}


def _json(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _options(options: str, required: tuple[str, ...]) -> str:
    given = [o for o in options.split(",") if o]
    return ",".join([*required, *(o for o in given if o not in required)])


def mount_entries(mounts: list[dict]) -> list[list[str]]:
    """cloud-init ``mounts`` entries (fstab fields) of checked ``mounts``: EFS through efs-utils' mount helper over
    TLS, NFS as given; every one ``_netdev``. cloud-init makes the mount points and mounts them before runcmd."""
    entries = []
    for m in mounts:
        required = EFS_OPTIONS if m["type"] == "efs" else NETWORK_OPTIONS
        entries.append([m["source"], m["target"], m["type"], _options(m["options"], required), "0", "0"])
    return entries


def _start(unit: str) -> list[list[str]]:
    # Enabled, so it runs again after a reboot; --no-block keeps cloud-final from waiting on it (a node's setup
    # waits for its Slurm name).
    return [["systemctl", "daemon-reload"], ["systemctl", "enable", unit], ["systemctl", "start", "--no-block", unit]]


def instance_types(cloud: str, part: Partition) -> dict:
    """node.json's instance_types: what the preflight expects of each type of the partition (GPUs, EFA devices
    on AWS, NVSwitch, InfiniBand)."""
    rows = {}
    for name in part.instance_types:
        row = catalog.CATALOG[name]
        rows[name] = {"gpus": row.gpus,
                      "efa": efa.efa_count(efa.layout(row, part.multi_node)) if cloud == "aws" else 0,
                      "nvswitch": row.nvswitch, "infiniband_gbps": row.infiniband_gbps}
    return rows


def node_json(cfg: StackConfig, part: Partition, *, bucket: str, asg_name: str, log_group: str, own: dict,
              slurm_: dict | None, mounts: list | None, registry: str | None = None) -> dict:
    """A partition's /etc/gpufleet/node.json, the one builder of every cloud's stack, checked by the node schema
    as its writer: the stack's bucket, metric dimension (``asg_name``), log group and namespace, the partition's
    instance types, the registry, the teams (whose Unix users setup makes), Slurm's settings, the mounts and the
    cloud's own object (``own``, under the cloud's name)."""
    doc = {"cloud": cfg.cloud, "stack": cfg.stack, "region": cfg.region, "bucket": bucket, "asg_name": asg_name,
           "log_group": log_group, "metric_namespace": metrics.namespace(cfg.stack),
           "instance_types": instance_types(cfg.cloud, part), "registry": registry, cfg.cloud: own,
           "teams": [t.name for t in cfg.teams]}
    doc.update({k: v for k, v in (("slurm", slurm_), ("mounts", mounts)) if v is not None})
    return node_schema.check(doc, complete=True)


def controller_json(cfg: StackConfig, *, bucket: str, queue_url: str, log_group: str, slurm_: dict, mounts: list,
                    own: dict | None = None, team_queues: dict[str, str] | None = None, **more) -> dict:
    """The controller's /etc/gpufleet/controller.json, the one builder of every cloud's stack, checked by the
    node schema as its writer: the bridge's queue and bucket, the first partition (Slurm's default: its name, GPUs
    and instance type), slurmctld's state directory, the mounts, the teams (each with its queue's URL where
    ``team_queues`` gives one: the bridge reads each under its team's account), the cloud's own object (``own``)
    and ``more`` (Azure's shared file system)."""
    queues = team_queues or {}
    first = cfg.partitions[0]
    doc = {"cloud": cfg.cloud, "stack": cfg.stack, "region": cfg.region, "bucket": bucket, "queue_url": queue_url,
           "log_group": log_group, "metric_namespace": metrics.namespace(cfg.stack), "slurm": slurm_,
           "partition": first.name, "gpus": first.primary.gpus, "instance_type": first.instance_types[0],
           "state_dir": slurm.STATE_DIR, "mounts": mounts, "teams": [{**t.as_json(), **({"queue_url": queues[t.name]} if t.name in queues else {})}
                     for t in cfg.teams], **more}
    if own is not None:
        doc[cfg.cloud] = own
    return node_schema.check_controller(doc, complete=True)


def render_node_user_data(node: dict) -> str:
    """A Slurm GPU node's cloud-config: node.json (0644 root; it must have its "slurm" object), the mounts, then
    gpufleet-node.service enabled and started."""
    settings = node_schema.check(node, complete=True)
    if "slurm" not in settings:
        raise ValueError("node.slurm: missing; a Slurm node needs controller_addr, controller_port and munge (the "
                         "secret that holds the munge key)")
    doc: dict = {"write_files": [_file(NODE_JSON_PATH, _json(settings))]}
    if settings.get("mounts"):
        doc["mounts"] = mount_entries(settings["mounts"])
    doc["runcmd"] = _start(NODE_UNIT)
    return _check_size(_dump(doc), settings["cloud"])


def check_nodes_config(config) -> dict:
    """The power saving settings (/etc/gpufleet/nodes.json) as far as the controller's user-data relies on them:
    the common keys, slurm_conf where user-data writes slurm.conf, and nothing secret. Each cloud's provider
    checks its own partition keys."""
    if not isinstance(config, dict):
        raise ValueError(f"nodes_config: expected an object, got {type(config).__name__}")
    missing = [k for k in NODES_CONFIG_REQUIRED if k not in config]
    if missing:
        raise ValueError(f"nodes_config: missing {', '.join(missing)}")
    if config["slurm_conf"] != SLURM_CONF_PATH:
        raise ValueError(f"nodes_config.slurm_conf: {config['slurm_conf']!r}; the controller's user-data writes "
                         f"slurm.conf to {SLURM_CONF_PATH}")
    if not (isinstance(config["partitions"], dict) and config["partitions"]):
        raise ValueError("nodes_config.partitions: expected a non-empty map of partition -> its settings")
    node_schema.check_no_secrets(config, "nodes_config")
    return config


_HOSTNAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")


def render_controller_user_data(controller: dict, slurm_conf: str, gres_conf: str, nodes_config: dict) -> str:
    """The controller's cloud-config: controller.json and nodes.json (0644 root), slurm.conf and gres.conf (0644
    root, served to the nodes: the cluster must be configless), the mounts, then gpufleet-controller.service
    enabled and started."""
    settings = node_schema.check_controller(controller, complete=True)
    check_nodes_config(nodes_config)
    if nodes_config["cloud"] != settings["cloud"]:
        raise ValueError(f"nodes_config.cloud: {nodes_config['cloud']!r}; the controller is on {settings['cloud']}")
    for name, text in (("slurm_conf", slurm_conf), ("gres_conf", gres_conf)):
        if not isinstance(text, str) or not text.endswith("\n"):
            raise ValueError(f"{name}: expected the rendered file's text (trainer.slurm.conf)")
    parameters = [ln.split("=", 1)[1] for ln in slurm_conf.splitlines() if ln.startswith("SlurmctldParameters=")]
    if not any("enable_configless" in p.split(",") for p in parameters):
        raise ValueError("slurm_conf: SlurmctldParameters has no enable_configless; the nodes fetch slurm.conf and "
                         "gres.conf from the controller (render a cloud cluster, not the box's)")
    hosts = [ln.split("=", 1)[1].split("(")[0] for ln in slurm_conf.splitlines() if ln.startswith("SlurmctldHost=")]
    if len(hosts) != 1 or not _HOSTNAME.match(hosts[0]):
        raise ValueError(f"slurm_conf: SlurmctldHost {hosts!r}; expected one host name")
    # slurmctld runs only on the host whose short name is SlurmctldHost's
    doc: dict = {"preserve_hostname": False, "hostname": hosts[0], "write_files": [
        _file(CONTROLLER_JSON_PATH, _json(settings)),
        _file(NODES_JSON_PATH, _json(nodes_config)),
        _file(SLURM_CONF_PATH, slurm_conf),
        _file(GRES_CONF_PATH, gres_conf),
    ]}
    if settings.get("mounts"):
        doc["mounts"] = mount_entries(settings["mounts"])
    doc["runcmd"] = _start(CONTROLLER_UNIT)
    return _check_size(_dump(doc), settings["cloud"])
