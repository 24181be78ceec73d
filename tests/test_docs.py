"""The docs (README.md and docs/) name every config key, every command and every flag of `gpufleet` and of
`python -m trainer`: a key, command or flag added without a word in the docs fails here; and the command
reference (docs/commands.md) and the config table (docs/stacks.md) are what `python -m infra.docgen` writes
from the code now."""
from __future__ import annotations

import argparse
import re

from infra import docgen
from tests.conftest import ROOT


def docs_text() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def commands_and_flags(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[tuple[str, str]]:
    """(command path, a subcommand's name or a --flag) of a parser and every subparser below it."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((" ".join(path), name))
                found += commands_and_flags(sub, (*path, name))
        else:
            found += [(" ".join(path), flag) for flag in action.option_strings
                      if flag.startswith("--") and flag != "--help"]
    return found


def undocumented(items: list[tuple[str, str]], text: str) -> list[tuple[str, str]]:
    return [(path, word) for path, word in items if not re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text)]


def test_every_config_key_has_a_row_in_the_stacks_doc():
    from infra import config

    stacks = (ROOT / "docs" / "stacks.md").read_text()
    assert [k for k in config.KEYS if f"| `{k}` |" not in stacks] == []


def test_every_gpufleet_command_and_flag_is_documented():
    from infra import cli

    assert undocumented(commands_and_flags(cli.build_parser(), ("gpufleet",)), docs_text()) == []


def test_every_trainer_command_and_flag_is_documented():
    text = docs_text()
    parsers = docgen.trainer_parsers()
    assert [cmd for cmd in parsers if f"python -m trainer {cmd}" not in text and f"trainer {cmd}" not in text] == []
    items = [item for cmd, p in parsers.items() for item in commands_and_flags(p, ("trainer", cmd))]
    assert undocumented(items, text) == []


def test_a_flag_missing_from_the_docs_is_found():
    parser = argparse.ArgumentParser()
    parser.add_argument("--documented")
    sub = parser.add_subparsers().add_parser("hidden-command")
    sub.add_argument("--never-written-anywhere")
    items = commands_and_flags(parser, ("x",))
    assert undocumented(items, "use --documented, and --documented-too") == [
        ("x", "hidden-command"), ("x hidden-command", "--never-written-anywhere")]


def test_the_command_reference_is_what_the_parsers_say():
    assert (ROOT / "docs" / "commands.md").read_text() == docgen.render_commands(), \
        "docs/commands.md is stale: run `python -m infra.docgen`"


def test_the_config_table_is_what_the_config_reader_says():
    from infra import config

    assert set(config.KEY_DOCS) == set(config.KEYS), "every key the reader takes has its meaning, and no other"
    stacks = (ROOT / "docs" / "stacks.md").read_text()
    assert stacks == docgen.with_config_table(stacks), "docs/stacks.md's config table is stale: run " \
        "`python -m infra.docgen`"
