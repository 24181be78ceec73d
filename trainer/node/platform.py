"""The machine a job runs on, as the per-node task (trainer.slurm.task) and preflight need it: the dimensions of its
metrics, its instance type, and secrets and registry logins through the machine's identity.

The base class is a machine of no cloud (a laptop, CI, the box): no dimensions, no secrets, no registry login.
A cloud module in trainer.clouds may subclass it as ``NodePlatform``; :func:`open_platform` picks one through the
registry.
"""
from __future__ import annotations

from trainer.clouds import adapter, node_cloud
from trainer.errors import UsageError


class Platform:
    name = "local"

    def metric_dimensions(self) -> dict[str, str]:
        """The dimension values of this node's metrics (trainer.node.metric_names): none off any group."""
        return {}

    def instance_type(self) -> str | None:
        """This node's instance type from the platform, or None when it cannot tell."""
        return None

    def secret(self, source: str, name: str) -> str:
        """The value of a secret the node's identity may read (source "ssm" on AWS, "keyvault" on Azure)."""
        raise UsageError(f"env: {source}:{name}: the {self.name} platform cannot read {source} secrets (secrets are "
                         "read through a cloud node's identity: SSM parameters on AWS)")

    def registry_login(self, image: str):
        """Docker credentials (trainer.node.registry.RegistryLogin) for the registry ``image`` comes from, through
        the node's identity; None when the image is not on a registry this platform logs in to (a local image,
        Docker Hub, or any image off a cloud node)."""
        return None


def open_platform(node: dict) -> Platform:
    """The platform of this node: its cloud's (node.json names it) or the base one off any cloud."""
    cloud = node_cloud(node)
    if cloud is None:
        return Platform()
    return adapter(cloud).NodePlatform(node)
