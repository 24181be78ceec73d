"""`python -m infra.preview`: formats, --out, --diff, exit status and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import jsonschema
import pytest

from infra.preview import __main__ as cli
from infra.preview import runner
from tests.infra.preview import fake_program
from tests.infra.preview.helpers import REPO

CIPHER = "v1:ZmFrZS1jaXBoZXJ0ZXh0LW5ldmVyLXNob3du"
URN = {"type": "string", "pattern": "^urn:pulumi:[^:]+::gpufleet::"}
SCHEMA = {
    "type": "object",
    "required": ["stack", "cloud", "config", "resources", "outputs", "policy", "cost"],
    "properties": {
        "stack": {"type": "string"}, "cloud": {"enum": ["aws", "azure", "tencent"]}, "config": {"type": "object"},
        "resources": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["type", "name", "urn", "parent", "inputs", "id", "custom", "provider",
                         "dependencies", "propertyDependencies"],
            "properties": {
                "type": {"type": "string", "pattern": "^[\\w-]+:[\\w/.-]*:\\w+$"}, "name": {"type": "string"},
                "urn": URN, "parent": {"anyOf": [URN, {"type": "null"}]}, "inputs": {"type": "object"},
                "id": {"type": ["string", "null"]}, "custom": {"type": "boolean"},
                "provider": {"type": ["string", "null"]},
                "dependencies": {"type": "array", "items": URN},
                "propertyDependencies": {"type": "object", "additionalProperties": {"type": "array", "items": URN}},
            }}},
        "outputs": {"type": "object"},
        "policy": {"type": "object", "required": ["violations"], "properties": {"violations": {
            "type": "array", "items": {"type": "object",
                                       "required": ["policy", "level", "severity", "urn", "message"]}}}},
        "cost": {"type": "object"}, "diff": {"type": "object"},
    },
}


@pytest.fixture
def fake(monkeypatch):
    """Run the CLI in-process on the test program instead of infra.program.main, without the
    policy pack (its verdicts on the real stacks are tested in test_stacks.py)."""
    monkeypatch.setattr(runner, "_main", fake_program.main)
    real_hook = runner.hook
    monkeypatch.setattr(runner, "hook", lambda name: None if name == "analyzer" else real_hook(name))


def run_main(capsys, *args):
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_output_follows_the_contract(fake, capsys):
    rc, out, err = run_main(capsys, "--stack", "dev", "--format", "json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["stack"] == "dev" and doc["outputs"]["nodes_max"] == 4
    assert "diff" not in doc
    assert doc["policy"] == {"pack": None, "violations": []}  # no policy pack: no verdicts


def test_table_is_the_default_and_out_writes_the_chosen_format(fake, capsys, tmp_path):
    rc, out, _ = run_main(capsys, "--stack", "prod")
    assert rc == 0 and out.startswith("Stack prod (aws, eu-north-1): partition gpu 4-4 x p5.48xlarge (gang)")
    target = tmp_path / "prod.json"
    rc, out, err = run_main(capsys, "--stack", "prod", "--format", "json", "--out", str(target))
    assert rc == 0 and out == "" and err == ""
    assert json.loads(target.read_text())["stack"] == "prod"


def test_markdown_is_rendered_by_the_review_module(fake, capsys):
    from infra.preview import markdown

    rc, out, _ = run_main(capsys, "--stack", "dev", "--format", "json")
    rc_md, md, _ = run_main(capsys, "--stack", "dev", "--format", "markdown")
    assert rc == rc_md == 0 and md == markdown.render(json.loads(out))


def test_diff_against_a_base_document(fake, capsys, tmp_path):
    base = tmp_path / "base.json"
    assert run_main(capsys, "--stack", "dev", "--format", "json", "--out", str(base))[0] == 0
    rc, out, _ = run_main(capsys, "--stack", "dev", "--format", "json", "--diff", str(base))
    diff = json.loads(out)["diff"]
    assert rc == 0 and diff["added"] == diff["removed"] == diff["changed"] == []
    rc, out, _ = run_main(capsys, "--stack", "prod", "--format", "json", "--diff", str(base))
    diff = json.loads(out)["diff"]
    assert diff["added"] and diff["removed"]  # other stack, other URNs


class FakePack:
    """Stands in for infra.preview.analyzer.PolicyPack; records how the preview drives it."""
    calls: list = []

    def __init__(self, stack, project, config):
        self.calls.append(("init", stack, project, config))

    def start(self):
        self.calls.append(("start",))

    def analyze(self, resources, policy_config):
        self.calls.append(("analyze", len(resources), policy_config))
        return {"pack": "fake", "violations": [
            {"policy": "p", "level": "mandatory", "severity": "high", "urn": resources[1]["urn"], "message": "m"}]}

    def close(self):
        self.calls.append(("close",))


def test_mandatory_violations_exit_1_after_printing_the_report(fake, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(FakePack, "calls", [])
    real_hook = runner.hook
    monkeypatch.setattr(runner, "hook", lambda name: SimpleNamespace(PolicyPack=FakePack) if name == "analyzer"
                        else real_hook(name))
    policy = tmp_path / "policy.json"
    policy.write_text('{"all": "mandatory"}')
    rc, out, err = run_main(capsys, "--stack", "dev", "--format", "json", "--policy-config", str(policy))
    assert rc == 1 and err == "preview: 1 mandatory policy violation(s)\n"
    doc = json.loads(out)
    assert doc["policy"]["violations"][0]["policy"] == "p"
    (_, stack, project, config), *rest = FakePack.calls
    assert (stack, project) == ("dev", "gpufleet")
    assert config["gpufleet:mode"] == "queue" and config["aws:region"] == "eu-west-1"
    assert rest == [("start",), ("analyze", len(doc["resources"]), {"all": "mandatory"}), ("close",)]


def test_the_policy_pack_is_closed_when_the_program_fails(capsys, monkeypatch):
    monkeypatch.setattr(FakePack, "calls", [])
    monkeypatch.setattr(runner, "_main", fake_program.failing)
    real_hook = runner.hook
    monkeypatch.setattr(runner, "hook", lambda name: SimpleNamespace(PolicyPack=FakePack) if name == "analyzer"
                        else real_hook(name))
    rc, _, err = run_main(capsys, "--stack", "dev")
    assert rc == 2 and "KeyError" in err
    assert [c[0] for c in FakePack.calls] == ["init", "start", "close"]


def test_secure_values_are_never_printed(fake, capsys, write_stack, tmp_path):
    path = write_stack("dev", name="test", **{"gpufleet:sshPublicKey": {"secure": CIPHER},
                                 "aws:secretKey": {"secure": CIPHER + "2"}})
    for fmt in ("json", "table", "markdown"):
        out_file = tmp_path / f"o.{fmt}"
        rc, out, err = run_main(capsys, "--config-file", str(path), "--format", fmt, "--out", str(out_file))
        rc2, out2, err2 = run_main(capsys, "--config-file", str(path), "--format", fmt)
        assert rc == rc2 == 0
        for text in (out, err, out2, err2, out_file.read_text()):
            assert "ZmFrZS1jaXBoZXJ0ZXh0" not in text
    doc = json.loads(out_file.with_suffix(".json").read_text())
    assert doc["stack"] == "test" and doc["config"]["sshPublicKey"] == "[secret]"


# --- one-line errors, exit 2 (real CLI, in a subprocess) ------------------------------------------

def run_cli(*args, cwd=REPO):
    proc = subprocess.run([sys.executable, "-m", "infra.preview", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def bad_inputs(tmp_path, write_stack):
    yaml_error = tmp_path / "Pulumi.broken.yaml"
    yaml_error.write_text("config:\n  gpufleet:cloud: aws\n   bad: [indent\n")
    not_json = tmp_path / "base.json"
    not_json.write_text("{not json")
    no_resources = tmp_path / "other.json"
    no_resources.write_text('{"stack": "dev"}')
    policy = tmp_path / "policy.yaml"
    policy.write_text("- a list\n")
    return {
        "missing file": ((["--config-file", str(tmp_path / "nope.yaml")]), "--config-file: "),
        "yaml error": ((["--config-file", str(yaml_error)]), "valid YAML (parse error at line 3)"),
        "bad value": ((["--config-file", str(write_stack(**{"gpufleet:nodes": {"min": 3, "desired": 3, "max": 2}}))]),
                      "gpufleet:nodes: "),
        "unknown type": ((["--config-file", str(write_stack(**{"gpufleet:instanceTypes": ["p9.huge"]}))]),
                         "gpufleet:instanceTypes: 'p9.huge' is not allowed"),
        "unknown key": ((["--config-file", str(write_stack(**{"gpufleet:colour": "blue"}))]), "gpufleet:colour: "),
        "unknown stack": ((["--stack", "staging"]), "--stack: 'staging' is not allowed; known stacks: "),
        "path as stack": ((["--stack", "../etc/passwd"]), "--stack: '../etc/passwd' is not allowed"),
        "no source": (([]), "one of the arguments --stack --config-file is required"),
        "bad format": ((["--stack", "dev", "--format", "xml"]), "argument --format: invalid choice: 'xml'"),
        "diff missing": ((["--stack", "dev", "--diff", str(tmp_path / "none.json")]), "--diff: "),
        "diff not json": ((["--stack", "dev", "--diff", str(not_json)]), "a preview document written by --format json"),
        "diff not a preview": ((["--stack", "dev", "--diff", str(no_resources)]), "a preview document"),
        "policy config": ((["--stack", "dev", "--policy-config", str(policy)]), "--policy-config: "),
        "secret bad value": ((["--config-file", str(write_stack(
            "azure", **{"gpufleet:sshPublicKey": {"secure": CIPHER}}))]), "gpufleet:sshPublicKey: '[secret]'"),
    }


def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path, write_stack, capsys):
    for case, (args, fragment) in bad_inputs(tmp_path, write_stack).items():
        rc, out, err = run_main(capsys, *args)
        assert rc == 2, (case, err)
        assert out == "", case
        assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, (case, err)
        assert "Traceback" not in err and "ZmFrZS1jaXBoZXJ0ZXh0" not in err, case


@pytest.mark.parametrize("case", ["yaml error", "bad format", "unknown stack"])
def test_the_real_command_exits_2_with_one_line(case, tmp_path, write_stack):
    args, fragment = bad_inputs(tmp_path, write_stack)[case]
    rc, out, err = run_cli(*args)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and fragment in err and "Traceback" not in err


def test_program_failure_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "_main", fake_program.failing)
    rc, out, err = run_main(capsys, "--stack", "dev")
    assert rc == 2 and out == ""
    assert err.startswith("error: program failed: KeyError: 'no-such-instance-type' (at tests/infra/preview/")
    assert err.count("\n") == 1


def test_unwritable_out_is_exit_2(fake, capsys, tmp_path):
    rc, out, err = run_main(capsys, "--stack", "dev", "--out", str(tmp_path / "no" / "dir" / "x.txt"))
    assert rc == 2 and out == "" and err.startswith("error: --out: ") and err.count("\n") == 1
