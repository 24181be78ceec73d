"""The machine the agent runs on, as the agent needs it: scale-in protection, whether it is going away,
letting the platform stop it, the launch check's verdict, secrets and registry logins through the node's
identity, and forming a gang.

The base class is a machine of no cloud (a laptop, CI): nothing to protect, never going away, no gang.
Each cloud module in trainer.clouds subclasses it; :func:`open_platform` picks one through the registry.
"""
from __future__ import annotations

import logging

from trainer.clouds import adapter, node_cloud
from trainer.errors import UsageError
from trainer.node.rendezvous import RendezvousError

log = logging.getLogger("gpufleet.platform")


class Platform:
    name = "local"

    def protect(self, on: bool) -> None:
        """Protect this node from scale-in while a job runs on it (on) or stop protecting it (off)."""

    def going_away(self) -> str | None:
        """Why this node is about to stop (a spot notice, a scale-in), or None."""
        return None

    def let_go(self) -> None:
        """The checkpoint is safe and the message handed back: let the platform stop this node now."""

    def metric_dimensions(self) -> dict[str, str]:
        """The dimension values of this node's metrics (trainer.node.metric_names): none off any group."""
        return {}

    def instance_type(self) -> str | None:
        """This node's instance type from the platform, or None when it cannot tell."""
        return None

    def report_launch(self, ok: bool) -> str:
        """Tell the platform whether this node passed its launch checks; a line saying what was done."""
        return "not on a cloud node: no lifecycle hook to complete"

    def secret(self, source: str, name: str) -> str:
        """The value of a secret the node's identity may read (source "ssm" on AWS, "keyvault" on Azure)."""
        raise UsageError(f"env: {source}:{name}: the {self.name} platform cannot read {source} secrets (secrets are "
                         "read through a cloud node's identity: SSM parameters on AWS)")

    def registry_login(self, image: str):
        """Docker credentials (trainer.node.registry.RegistryLogin) for the registry ``image`` comes from, through
        the node's identity; None when the image is not on a registry this platform logs in to (a local image,
        Docker Hub, or any image off a cloud node)."""
        return None

    def form_gang(self, nnodes: int, timeout_s: float):
        """This node's gang (trainer.node.rendezvous.Gang) once ``nnodes`` nodes are in service."""
        raise RendezvousError(f"gang mode needs a cloud node in a group; this is a {self.name} machine")

    def board(self, bucket: str):
        """The gang's assignment board (trainer.node.rendezvous.Board) in the cluster's bucket."""
        raise RendezvousError(f"gang mode needs a cloud node in a group; this is a {self.name} machine")


def open_platform(node: dict, **clients) -> Platform:
    """The platform of this node: its cloud's (node.json names it) or the base one off any cloud."""
    cloud = node_cloud(node)
    if cloud is None:
        return Platform()
    return adapter(cloud).NodePlatform(node, **clients)
