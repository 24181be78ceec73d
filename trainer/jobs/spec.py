"""The job spec: one versioned JSON Schema (job.schema.json beside this file) that submit, the bridge and the
docs share, and the checks a schema cannot make (train's own flags, secrets written inline, the stack's size).

Version 1: ``{"spec": 1, "job_id", "kind": "trainer"|"image"|"code", "args" | "image"+"command" |
"code"+"command", "nodes", "gpus_per_node", "env", "timeout", "retries": {"on_error", "on_exit_codes"}, "array", "attempts"}`` (array: a sweep's member, which the bridge
runs as one Slurm job array; attempts: the history a retried job carries).

Messages without "spec" are version 0, today's ``{"job_id", "args"}`` of the built-in trainer: :func:`migrate`
turns them into version 1 (kind trainer, every other field at its default), explicitly and only that shape.
Every error is one line naming the field, the bad value and what is allowed (a UsageError).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from trainer.errors import UsageError
from trainer.loop.config import parse_args

SPEC_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("job.schema.json")
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
# Variable names that would hold a secret: their values must come from SSM or Key Vault, not the message.
SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY|API_KEY", re.IGNORECASE)
# A job's argv and environment travel on an exec: Linux caps one string at 128 KiB (MAX_ARG_STRLEN) and all of
# them with the node's environment at far less than ARG_MAX on a busy node; a job stays well below.
MAX_ARGS_BYTES = 96 * 1024


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _whole(pattern: str) -> str:
    """The schema's pattern as Python must read it: `$` there is the end of the string (JSON Schema's ECMA-262
    reading); Python's `$` also matches before a trailing newline, which let "run1\\n" through as a job id."""
    return pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern


def _pattern(validator, pattern, instance, schema_):
    import jsonschema  # lazy: jsonschema (~60 ms) only to validate; gpufleet's start-up imports this module

    if validator.is_type(instance, "string") and not re.search(_whole(pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


@lru_cache(maxsize=1)
def _validator():
    import jsonschema  # lazy: jsonschema (~60 ms) only to validate; gpufleet's start-up imports this module

    whole = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})
    return whole(schema())


@dataclass(frozen=True)
class Job:
    """A validated spec-1 job; ``to_dict`` is its message."""

    job_id: str
    kind: str = "trainer"
    args: tuple[str, ...] = ()
    image: str | None = None
    code: str | None = None
    command: tuple[str, ...] = ()
    nodes: int = 1
    gpus_per_node: int | None = None
    env: dict = field(default_factory=dict)
    timeout: int | None = None
    retries: dict = field(default_factory=lambda: {"on_error": 0, "on_exit_codes": []})
    attempts: tuple[dict, ...] = ()  # earlier attempts a message carries: its first attempt number follows them
    array: dict | None = None  # a sweep's member: {"id", "nonce", "index", "count"} (one Slurm job array)

    def to_dict(self) -> dict:
        out = {"spec": SPEC_VERSION, "job_id": self.job_id, "kind": self.kind}
        if self.kind == "trainer":
            out["args"] = list(self.args)
        else:
            out[self.kind] = self.image if self.kind == "image" else self.code
            out["command"] = list(self.command)
        out.update(nodes=self.nodes, gpus_per_node=self.gpus_per_node, env=dict(self.env), timeout=self.timeout,
                   retries=dict(self.retries))
        if self.array:
            out["array"] = dict(self.array)
        if self.attempts:
            out["attempts"] = [dict(a) for a in self.attempts]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


# An env value a record does not show: records keep a job's env names, and only the bridge keeps their values.
HIDDEN = {"hidden": True}


def hidden_values(spec: dict) -> dict:
    """The spec as a record keeps it: each inline env value replaced by HIDDEN (a value may be a secret under a
    name the denylist does not know: DB_PASS, OPENAI_KEY, DATABASE_URL); SSM and Key Vault names stay."""
    env = spec.get("env") or {}
    return {**spec, "env": {k: HIDDEN if isinstance(v, str) else v for k, v in env.items()}} if env else spec


def hidden_names(job: "Job") -> list[str]:
    return sorted(k for k, v in job.env.items() if v == HIDDEN)


FAILURES = ("failed", "timeout")  # the outcomes that count against retries.on_error


def retry_decision(retries: dict, attempts: tuple[dict, ...] | list[dict], exit_status: int) -> tuple[bool, str]:
    """Whether a failed attempt (``exit_status``) is tried again, and why, from the job's retries and its attempt
    history. An exit status in on_exit_codes always retries and never counts; every other failure or timeout
    counts against on_error; preemptions never count."""
    codes = set(retries.get("on_exit_codes") or ())
    if exit_status in codes:
        return True, f"exit status {exit_status} is in retries.on_exit_codes"
    budget = int(retries.get("on_error") or 0)
    failed = sum(1 for a in attempts if a.get("outcome") in FAILURES and a.get("exit_status") not in codes)
    if failed < budget:
        return True, f"retry {failed + 1} of {budget} (retries.on_error)"
    return False, f"{failed + 1} failure(s), retries.on_error is {budget}"


def job_bytes(job: "Job") -> int:
    """What the job puts on an exec: its args (trainer) or command and env values (image, code)."""
    strings = list(job.args) if job.kind == "trainer" else [*job.command, *(
        f"{k}={v}" for k, v in job.env.items() if isinstance(v, str))]
    return sum(len(s.encode()) + 1 for s in strings)


def check_job_id(job_id: object, where: str = "job_id") -> str:
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise UsageError(f"{where}: {job_id!r} is not allowed; expected 1-128 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return job_id


def migrate(raw: dict) -> dict:
    """A version-0 message ({"job_id", "args"}, before the spec existed) as version 1: kind trainer."""
    if not {"job_id", "args"} <= set(raw) <= {"job_id", "args", "attempts"}:
        raise UsageError(f"job message: no \"spec\" field, and not a version-0 message (job_id and args); "
                         f"got the keys {sorted(raw)}")
    return {"spec": SPEC_VERSION, **raw, "kind": "trainer"}


def _where(error) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return path.lstrip(".") or "job"


def _message(error, raw: dict) -> str:
    """One line for a schema error; the kind rules are told from the schema's own if/then branches."""
    where = _where(error)
    if error.validator == "not" and "then" in error.schema_path:
        rule = next(b for b in schema()["allOf"] if b["then"]["not"] == error.validator_value)
        wrong = sorted(k for alt in error.validator_value["anyOf"] for k in alt["required"] if k in raw)
        return (f"kind {raw.get('kind')!r} takes {' and '.join(rule['then']['required'])}, "
                f"not {', '.join(wrong)}")
    if error.validator == "pattern" and error.absolute_path and error.absolute_path[0] == "image":
        return f"image: {error.instance!r} is not a valid image reference; expected [registry/]name[:tag][@digest]"
    if error.validator == "additionalProperties" and not error.absolute_path:
        extra = sorted(set(raw) - set(schema()["properties"]))
        return f"unknown field(s) {', '.join(extra)}; expected {', '.join(schema()['properties'])}"
    if error.validator == "propertyNames" or (error.absolute_path and error.absolute_path[0] == "env"
                                              and error.validator in ("not", "pattern")):
        return (f"env: {error.instance!r} is not an allowed variable name; expected letters, digits and '_', "
                "not starting with a digit or GPUFLEET_ (gpufleet's own)")
    if where == "job_id" and error.validator in ("pattern", "type"):
        try:
            check_job_id(error.instance)
        except UsageError as exc:
            return str(exc)
    return error.message if where == "job" else f"{where}: {error.message}"


def _encodable(value: object, name: str, where: str = "job") -> None:
    """UsageError naming the first string of a message that UTF-8 cannot carry (a lone surrogate: how Python
    decodes an argument of undecodable bytes), instead of a traceback where the message is encoded."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{name}: {where}: not valid text (undecodable bytes); give it as UTF-8") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _encodable(key, name, where)
            _encodable(item, name, key if where == "job" else f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _encodable(item, name, f"{where}[{i}]")


def validate(raw: object, max_nodes: int | None = None) -> Job:
    """A spec-1 job from its decoded message (version 0 migrated), or UsageError with one line."""
    if not isinstance(raw, dict):
        raise UsageError(f"job message: expected a JSON object, got {type(raw).__name__}")
    if "spec" not in raw:
        raw = migrate(raw)
    job_id = raw.get("job_id")
    name = f"job {job_id}" if isinstance(job_id, str) and JOB_ID.fullmatch(job_id) else "job"
    if raw.get("spec") != SPEC_VERSION:
        raise UsageError(f"{name}: spec {raw.get('spec')!r} is not supported; expected {SPEC_VERSION}")
    import jsonschema  # lazy: jsonschema (~60 ms) only to validate; gpufleet's start-up imports this module

    _encodable(raw, name)
    errors = sorted(_validator().iter_errors(raw), key=jsonschema.exceptions.relevance)
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise UsageError(f"{name}: {_message(best, raw)}")
    defaults = schema()["properties"]["retries"]["properties"]
    retries = {k: raw.get("retries", {}).get(k, v["default"]) for k, v in defaults.items()}
    job = Job(job_id=job_id, kind=raw["kind"], args=tuple(raw.get("args", ())), image=raw.get("image"),
              code=raw.get("code"), command=tuple(raw.get("command", ())), nodes=raw.get("nodes", 1),
              gpus_per_node=raw.get("gpus_per_node"), env=dict(raw.get("env", {})), timeout=raw.get("timeout"),
              retries=retries, attempts=tuple(raw.get("attempts", ())), array=raw.get("array"))
    size = job_bytes(job)
    if size > MAX_ARGS_BYTES:
        what = "args" if job.kind == "trainer" else "command and env"
        raise UsageError(f"{name}: its {what} are {size} bytes, more than the {MAX_ARGS_BYTES} a command line can "
                         "safely carry; put long settings in a file the job reads (--config FILE)")
    for key, value in job.env.items():
        if isinstance(value, str) and SECRET_NAME.search(key):
            raise UsageError(f"{name}: env {key}: a secret does not belong in the job message; give the name of an "
                             "SSM parameter ({\"ssm\": NAME}, --env-from KEY=ssm:NAME) or a Key Vault secret")
    if max_nodes is not None and job.nodes > max_nodes:
        raise UsageError(f"{name}: nodes: {job.nodes} is not allowed; the stack runs at most {max_nodes} node(s)")
    if job.kind == "trainer":
        try:
            parse_args(list(job.args))
        except UsageError as exc:
            raise UsageError(f"{name}: {exc}") from None
    return job


def parse_job(body: str, max_nodes: int | None = None) -> Job:
    """A job from a queue message body (JSON), checked as :func:`validate` does."""
    try:
        raw = json.loads(body)
    except ValueError as exc:
        raise UsageError(f"job message: not JSON ({exc})") from None
    return validate(raw, max_nodes)
