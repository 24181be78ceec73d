"""The cluster in a box: `gpufleet demo` or `python -m infra.demo` (see infra.demo.cli)."""
from __future__ import annotations


def configure(parser) -> None:
    from infra.demo.cli import DESCRIPTION, configure  # lazy: infra.demo's fakes load without the CLI (~0.4 s)

    parser.description = DESCRIPTION
    configure(parser)


def run(args) -> int:
    from infra.demo.cli import check, execute  # lazy: infra.demo's fakes load without the CLI (~0.4 s)

    return execute(check(args))


def main(argv: list[str] | None = None) -> int:
    from infra.demo.cli import main  # lazy: infra.demo's fakes load without the CLI (~0.4 s)

    return main(argv)
