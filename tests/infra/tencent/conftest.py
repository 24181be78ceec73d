"""The tencent stack on Pulumi's mock runtime (tests/infra/mock_run.py)."""
from __future__ import annotations

import pytest

from infra.tencent.stack import build_tencent
from tests.infra.mock_run import Resource, Run, run_program, stack_config

__all__ = ["Resource", "Run", "run_stack", "tencent_config"]


def run_stack(cfg) -> Run:
    return run_program(build_tencent, cfg)


def tencent_config(**overrides):
    """Pulumi.tencent.yaml, with `gpufleet:<key>` values replaced (None removes the key)."""
    return stack_config("tencent", **overrides)


@pytest.fixture(scope="session")
def tencent_run() -> Run:
    """The tencent stack as committed, run once for the whole session."""
    return run_stack(tencent_config())
