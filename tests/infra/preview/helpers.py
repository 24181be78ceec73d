"""Stack configs for the preview tests."""
from __future__ import annotations

from pathlib import Path

from infra import config

REPO = Path(__file__).resolve().parents[3]


def stack_raw(name: str, **overrides) -> tuple[dict, frozenset]:
    """A repository stack's config with overrides; `{"secure": ...}` overrides are secret keys."""
    raw, secrets = config.read_stack_file(REPO / f"Pulumi.{name}.yaml")
    raw = {**raw, **overrides}
    return raw, frozenset(secrets | {k for k, v in overrides.items() if isinstance(v, dict) and set(v) == {"secure"}})
