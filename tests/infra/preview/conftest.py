"""Fixtures of the preview tests."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra import config
from tests.infra.preview.helpers import REPO


@pytest.fixture
def write_stack(tmp_path):
    """Write a stack file from a repository stack with overrides; returns its path."""
    written = []

    def write(base: str = "dev", name: str = "", **overrides) -> Path:
        raw, _ = config.read_stack_file(REPO / f"Pulumi.{base}.yaml")
        written.append(name)
        path = tmp_path / f"Pulumi.{name or f'test{len(written)}'}.yaml"
        path.write_text(yaml.safe_dump({"config": {**raw, **overrides}}))
        return path
    return write
