"""The gpufleet-guardrails CrossGuard pack: policies grouped by domain; `all_policies()` lists them."""
from __future__ import annotations

PACK_NAME = "gpufleet-guardrails"
MODULES = ("aws_s3", "aws_ec2", "aws_iam", "aws_data", "aws_observability", "gpu", "azure_rules", "compliance",
           "registries", "tencent_rules")


def all_policies() -> list:
    """Every policy of the pack, in module order (importing a module builds its policies; nothing runs)."""
    import importlib

    return [p for m in MODULES for p in importlib.import_module(f"policies.{m}").POLICIES]
