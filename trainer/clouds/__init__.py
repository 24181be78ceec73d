"""One module per cloud: its object store, job queue, stop-notice watcher, node platform and Slurm node provider.

Each implements interfaces that trainer.loop, trainer.node, trainer.jobs and trainer.slurm define; the core picks
one through :func:`adapter` by name and imports it lazily, so no core module imports a cloud module and a
cloud's SDK loads only where that cloud is used. A cloud module provides ``open_store(uri)``,
``open_queue(url, region)``, ``start_watcher(notice, settings)``, ``NodePlatform(node)``, ``job_issuer(settings)``
and ``instance_facts()``, with which jobs get credentials of their own (trainer.node.jobcreds), and
``explain(exc)``: the one line (a UsageError for the user's setup, a Fault for a runtime fault) that its SDK's
credential and connection errors become at the command boundary, or None. Its Slurm side, ``<cloud>_nodes``
(:func:`node_adapter`), provides
Slurm's ``NodeProvider(config)``, ``node_name`` and ``munge_key``; it builds on the cloud module, never the
other way round.
"""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from trainer.errors import UsageError

CLOUDS = ("aws", "azure", "tencent")


def adapter(cloud: str) -> ModuleType:
    if cloud not in CLOUDS:
        raise UsageError(f"cloud {cloud!r} is not supported; expected one of {', '.join(CLOUDS)}")
    return importlib.import_module(f"trainer.clouds.{cloud}")


def node_adapter(cloud: str) -> ModuleType:
    """The cloud's Slurm side (trainer.clouds.<cloud>_nodes): NodeProvider, node_name, munge_key."""
    adapter(cloud)  # a cloud that is not supported: its one line
    return importlib.import_module(f"trainer.clouds.{cloud}_nodes")


def explain(exc: BaseException):
    """UsageError or Fault telling ``exc`` (or the error that caused it) in one line, or None.

    Only the clouds already in use are asked: an SDK is never imported to explain an error.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for cloud in CLOUDS:
            module = sys.modules.get(f"trainer.clouds.{cloud}")
            told = module.explain(exc) if module else None
            if told is not None:
                return told
        exc = exc.__cause__ or exc.__context__
    return None


def node_cloud(settings: dict, environ=os.environ) -> str | None:
    """The cloud whose metadata service this process may contact, or None (never contact one).

    A cloud node's /etc/gpufleet/node.json names its cloud. Elsewhere only an explicit pointer counts:
    botocore's ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (unless ``AWS_EC2_METADATA_DISABLED=true``) means AWS,
    ``TENCENTCLOUD_METADATA_ENDPOINT`` (gpufleet's; Tencent's SDKs have none) means Tencent Cloud.
    A laptop, CI or a test with neither sends nothing to a metadata address.
    """
    cloud = settings.get("cloud")
    if cloud:
        return cloud
    if environ.get("TENCENTCLOUD_METADATA_ENDPOINT"):
        return "tencent"
    if environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") and \
            environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
        return "aws"
    return None
