"""``python -m infra.preview`` (also ``gpufleet preview``): what a stack would create, offline (no cloud
account, no Pulumi CLI).

    python -m infra.preview (--stack NAME | --config-file PATH) [--format table|json|markdown]
                            [--policy-config FILE] [--diff BASE.json] [--out FILE] [--project-dir DIR]

Exit status: 0 clean; 1 mandatory policy violations; 2 bad input or a failing program, told in one
line on stderr; 130 on Ctrl-C, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from infra import ROOT, cli, config
from infra.config import ConfigError
from infra.preview import report, runner

FORMATS = ("table", "json", "markdown")


def configure(p: argparse.ArgumentParser) -> None:
    """The preview's flags (on ``python -m infra.preview`` and on ``gpufleet preview``)."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", metavar="NAME",
                        help="preview Pulumi.<NAME>.yaml of the project, or of --project-dir")
    source.add_argument("--config-file", metavar="PATH", help="preview this Pulumi stack file")
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="table: resources as a tree; json: the preview document; markdown: a pull-request comment")
    p.add_argument("--policy-config", metavar="FILE", help="policy pack config (JSON or YAML)")
    p.add_argument("--diff", metavar="BASE.json", help="a base preview (--format json) to compare with")
    p.add_argument("--out", metavar="FILE", help="write the report here instead of stdout")
    p.add_argument("--project-dir", metavar="DIR", type=Path, default=ROOT,
                   help="the project whose Pulumi.<NAME>.yaml --stack reads")


def stack_file(name: str, project: Path = ROOT) -> Path:
    """``Pulumi.<name>.yaml`` of ``project``; any other name is a ConfigError listing the known stacks."""
    if not project.is_dir():
        raise ConfigError("--project-dir", str(project), "a directory holding Pulumi.<stack>.yaml files")
    known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in project.glob("Pulumi.*.yaml"))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name not in known:
        raise ConfigError("--stack", name, f"known stacks: {', '.join(known) or 'none'} (in {project})")
    return project / f"Pulumi.{name}.yaml"


def stack_name(path: Path) -> str:
    """``Pulumi.<name>.yaml`` gives ``<name>``; any other file its stem."""
    m = re.fullmatch(r"Pulumi\.(.+)\.ya?ml", path.name)
    return m.group(1) if m else path.stem


def _read_doc(flag: str, path: str, allowed: str) -> dict:
    import yaml  # lazy: yaml (~15 ms) off gpufleet's start-up

    try:
        text = Path(path).read_text()
        doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        raise ConfigError(flag, path, allowed) from None
    if not isinstance(doc, dict):
        raise ConfigError(flag, path, allowed)
    return doc


def render(doc: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "markdown":
        return runner.hook("markdown").render(doc)
    return report.table(doc)


def run(args: argparse.Namespace) -> int:
    try:
        path = stack_file(args.stack, args.project_dir) if args.stack else Path(args.config_file)
        raw, secret_keys = config.read_stack_file(path)
        policy_config = (_read_doc("--policy-config", args.policy_config, "a readable JSON or YAML map")
                         if args.policy_config else None)
        base = (_read_doc("--diff", args.diff, "a preview document written by --format json")
                if args.diff else None)
        if base is not None and not isinstance(base.get("resources"), list):
            raise ConfigError("--diff", args.diff, "a preview document written by --format json")
        doc = runner.preview(raw, secret_keys, args.stack or stack_name(path),
                             policy_config=policy_config, base=base)
        text = render(doc, args.format)
        if args.out:
            try:
                Path(args.out).write_text(text)
            except OSError as exc:
                raise ConfigError("--out", args.out, f"a writable file path ({exc.strerror})") from None
        else:
            sys.stdout.write(text)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except runner.ProgramError as exc:
        print(f"error: program failed: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 a failing hook: one line, no traceback
        print(f"error: {runner.one_line(exc)}", file=sys.stderr)
        return 2
    mandatory = runner.mandatory_violations(doc)
    if mandatory:
        print(f"preview: {len(mandatory)} mandatory policy violation(s)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m infra.preview", description="Offline preview of a gpufleet stack.")
    configure(parser)
    return cli.guarded(lambda: run(parser.parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    import gc

    # A short-lived process: collecting cycles among the SDK's many objects costs more than it frees.
    gc.disable()
    raise SystemExit(main())
