"""`gpufleet`, the installed console script: run from a directory outside the project, without PYTHONPATH."""
from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import cli

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "gpufleet"


@pytest.fixture(scope="module")
def gpufleet() -> Path:
    """The console script of the venv running the tests; it must belong to this checkout."""
    if not SCRIPT.is_file():
        pytest.fail(f"{SCRIPT} is missing: `make venv` installs the project (pip install -e .)", pytrace=False)
    return SCRIPT


def installed_env() -> dict[str, str]:
    """No PYTHONPATH: the installed package, nothing else; wide help lines, so no path is wrapped."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "COLUMNS": "500"}


def call(gpufleet: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(gpufleet), *args], cwd=cwd, env=installed_env(), capture_output=True, text=True,
                          timeout=300)


def test_the_script_runs_this_checkout(gpufleet, tmp_path):
    proc = call(gpufleet, "preview", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # The project root comes from the installed package, whatever the working directory.
    assert f"(default: {REPO})" in " ".join(proc.stdout.split()), \
        f"{gpufleet} runs another checkout: `make venv` here (pip install --no-deps -e .)"


def test_preview_of_a_stack_from_outside_the_project(gpufleet, tmp_path):
    proc = call(gpufleet, "preview", "--stack", "dev", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["stack"] == "dev" and doc["cloud"] == "aws" and doc["resources"]
    assert doc["policy"]["pack"], "the policy pack ran"


def test_project_dir_is_where_stack_looks(gpufleet, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "Pulumi.dev.yaml", project / "Pulumi.mine.yaml")
    out = tmp_path / "mine.json"
    proc = call(gpufleet, "preview", "--stack", "mine", "--project-dir", str(project), "--format", "json",
               "--out", str(out), cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, ""), proc.stderr
    doc = json.loads(out.read_text())
    assert doc["stack"] == "mine" and doc["config"]["region"] == "eu-west-1"

    proc = call(gpufleet, "preview", "--stack", "dev", "--project-dir", str(project), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"error: --stack: 'dev' is not allowed; known stacks: mine (in {project})\n"


@pytest.mark.parametrize("args, fragment", [
    (["preview", "--stack", "staging"], "error: --stack: 'staging' is not allowed; known stacks: azure, dev, prod"),
    (["preview", "--stack", "dev", "--format", "xml"], "argument --format: invalid choice: 'xml'"),
    (["preview", "--stack", "dev", "--colour"], "error: unrecognized arguments: --colour"),
    (["preview", "--stack", "dev", "--project-dir", "/nonexistent"], "error: --project-dir: '/nonexistent'"),
    (["preview"], "one of the arguments --stack --config-file is required"),
    (["deploy"], "argument COMMAND: invalid choice: 'deploy'"),
    ([], "the following arguments are required: COMMAND"),
    (["catalog", "show"], "argument COMMAND: invalid choice: 'show'"),
    (["jobs", "submit", "--queue-url", "https://sqs.eu-west-1.amazonaws.com/1/q", "--dry-run", "--", "--stepz", "5"],
     "unrecognized arguments: --stepz"),
])
def test_user_errors_are_one_line_exit_2(gpufleet, tmp_path, args, fragment):
    proc = call(gpufleet, *args, cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.count("\n") == 1 and fragment in proc.stderr and "Traceback" not in proc.stderr


def test_catalog_list(gpufleet, tmp_path):
    proc = call(gpufleet, "catalog", "list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any(line.split()[:2] == ["p5.48xlarge", "aws"] for line in proc.stdout.splitlines())


def test_catalog_refresh_against_moto(gpufleet, tmp_path, moto_endpoint):
    proc = call(gpufleet, "catalog", "refresh", "--region", "eu-west-1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].endswith("types checked, 0 differ")


def test_jobs_submit_hands_its_words_to_the_trainer(gpufleet, tmp_path):
    proc = call(gpufleet, "jobs", "submit", "--queue-url", "https://sqs.eu-west-1.amazonaws.com/1/q", "--dry-run",
               "--job-id", "j1", "--sweep", "lr=1e-3,3e-4", "--", "--steps", "5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    jobs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(j["spec"], j["kind"], j["job_id"], j["args"]) for j in jobs] == [
        (1, "trainer", "j1.lr-1e-3", ["--steps", "5", "--lr", "1e-3"]),
        (1, "trainer", "j1.lr-3e-4", ["--steps", "5", "--lr", "3e-4"])]


# This module is also a command (configure + run), to show that a command is one entry of cli.COMMANDS.
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--times", type=int, default=1, help="how many greetings")


def run(args: argparse.Namespace) -> int:
    if args.times < 0:
        raise cli.UsageError(f"--times: {args.times} is not allowed; expected 0 or more")
    print(" ".join(["hello"] * args.times))
    return 0


def test_a_command_is_one_entry_of_the_table(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "hello", (__name__, "say hello"))
    assert cli.main(["hello", "--times", "2"]) == 0
    assert capsys.readouterr().out == "hello hello\n"
    assert cli.main(["hello", "--times", "-1"]) == 2
    assert capsys.readouterr().err == "error: --times: -1 is not allowed; expected 0 or more\n"
    with pytest.raises(SystemExit):
        cli.main(["hello", "--help"])
    assert "--times TIMES  how many greetings (default: 1)" in capsys.readouterr().out


def _levels(parser: argparse.ArgumentParser, path: list[str]):
    """(command words, parser) for every level of the command tree."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _levels(sub, [*path, name])


def test_help_on_every_level_lists_its_commands_flags_choices_and_defaults(gpufleet, tmp_path):
    levels = list(_levels(cli.build_parser(), []))
    assert {tuple(p) for p, _ in levels} >= {(), ("preview",), ("catalog",), ("catalog", "list"),
                                             ("catalog", "refresh"), ("jobs",), ("jobs", "submit")}
    for path, parser in levels:
        proc = call(gpufleet, *path, "--help", cwd=tmp_path)
        assert (proc.returncode, proc.stderr) == (0, ""), (path, proc.stderr)
        text = " ".join(proc.stdout.split())
        if parser.get_default("passthrough"):  # the trainer's own parser answers
            assert "--queue-url" in text and "--sweep" in text and "--dry-run" in text, path
            continue
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(name in text for name in action.choices), (path, text)
                continue
            assert all(flag in text for flag in action.option_strings), (path, action.option_strings)
            for choice in action.choices or ():
                assert choice in text, (path, choice)
            if action.default not in (None, argparse.SUPPRESS):
                assert f"(default: {action.default})" in text, (path, action.dest)
    top = " ".join(call(gpufleet, "--help", cwd=tmp_path).stdout.split())
    assert all(name in top for name in cli.COMMANDS)


def test_ctrl_c_exits_130_without_a_traceback(gpufleet, tmp_path):
    fifo = tmp_path / "Pulumi.fifo.yaml"
    os.mkfifo(fifo)
    proc = subprocess.Popen([str(gpufleet), "preview", "--config-file", str(fifo)], cwd=tmp_path,
                            env=installed_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        writer = None
        while writer is None:  # opens once the command is reading the stack file, i.e. inside the command
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO or proc.poll() is not None:
                    pytest.fail(f"the command ended before reading its stack file: {proc.communicate()}")
                time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        os.close(writer)
    finally:
        proc.kill()
    assert proc.returncode == 130 and out == "" and "Traceback" not in err, err


def test_python_m_infra_preview_works_from_outside_the_project(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "infra.preview", "--stack", "nope"], cwd=tmp_path,
                          env=installed_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --stack: 'nope' is not allowed; known stacks: ")
    assert f"(in {REPO})" in proc.stderr
