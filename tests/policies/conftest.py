"""One policy pack process per stack config for the whole session, driven through the Analyzer protocol."""
from __future__ import annotations

import pytest

from infra.preview.analyzer import PolicyPack
from tests.policies.fixtures import PROJECT, STACKS


class Packs:
    """Starts a pack per stack config on first use (the config reaches the pack as the CLI passes it)."""

    def __init__(self):
        self.running: dict[str, PolicyPack] = {}

    def get(self, stack: str) -> PolicyPack:
        if stack not in self.running:
            pack = PolicyPack(stack, PROJECT, STACKS[stack])
            pack.start()
            self.running[stack] = pack
        return self.running[stack]

    def run(self, stack: str, resources: list[dict], policy_config=None) -> dict:
        return self.get(stack).analyze(resources, policy_config)

    def close(self) -> None:
        for pack in self.running.values():
            pack.close()


@pytest.fixture(scope="session")
def packs():
    running = Packs()
    yield running
    running.close()


def names(verdicts: dict, level: str | None = None) -> set[str]:
    return {v["policy"] for v in verdicts["violations"] if level is None or v["level"] == level}
