"""The Pulumi program: read the validated config, build the stack of its cloud, export its outputs."""
from __future__ import annotations

import sys

import pulumi

from infra import config


def build(cfg: config.StackConfig) -> dict[str, pulumi.Input]:
    """Create every resource of the stack; return the outputs to export."""
    for warning in cfg.warnings:
        pulumi.log.warn(warning)
    if cfg.cloud == "aws":
        from infra.aws.stack import build_aws  # lazy: only the stack's cloud's provider SDK loads

        return build_aws(cfg)
    if cfg.cloud == "tencent":
        from infra.tencent.stack import build_tencent  # lazy: only the stack's cloud's provider SDK loads

        return build_tencent(cfg)
    from infra.azure.stack import build_azure  # lazy: only the stack's cloud's provider SDK loads

    return build_azure(cfg)


def main() -> None:
    try:
        cfg = config.load()
    except config.ConfigError as exc:
        # One line for a user error: under `pulumi up` this is what the user reads.
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for name, value in build(cfg).items():
        pulumi.export(name, value)
