"""Fixtures: the dev and prod stacks built once per session on the mock runtime."""
import pytest

from tests.infra.aws.harness import Built, build_stack, stack_config


@pytest.fixture(scope="session")
def dev() -> Built:
    return build_stack(stack_config("dev"))


@pytest.fixture(scope="session")
def prod() -> Built:
    return build_stack(stack_config("prod"))
