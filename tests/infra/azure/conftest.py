"""The azure stack on Pulumi's mock runtime (tests/infra/mock_run.py)."""
from __future__ import annotations

import pytest

from infra.azure.stack import build_azure
from tests.infra.mock_run import Resource, Run, run_program, stack_config

__all__ = ["Resource", "Run", "run_stack", "azure_config"]


def run_stack(cfg) -> Run:
    return run_program(build_azure, cfg)


def azure_config(**overrides):
    """Pulumi.azure.yaml, with `gpufleet:<key>` values replaced (None removes the key)."""
    return stack_config("azure", **overrides)


@pytest.fixture(scope="session")
def azure_run() -> Run:
    """The azure stack as committed, run once for the whole session."""
    return run_stack(azure_config())
