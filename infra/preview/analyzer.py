"""Run the CrossGuard pack in policies/ over a preview's resources through the Analyzer gRPC protocol.

This does what the Pulumi CLI does for `pulumi preview --policy-pack policies --policy-pack-config FILE`:
- start the pack like the CLI's `pulumi-analyzer-policy-python` shim: the interpreter of the
  `virtualenv` named in PulumiPolicy.yaml runs `python -u -m pulumi.policy <engine> .` in policies/,
  with the stack config in PULUMI_CONFIG and PULUMI_PROJECT/STACK/DRY_RUN/ORGANIZATION set;
- read the port it prints, call Handshake (the Python host leaves it unimplemented) and ConfigureStack;
- GetAnalyzerInfo, GetPluginInfo, then Configure with the pack's defaults, the pack's initial config
  and the user's config (`{"all": level}` and `{"<policy>": level | {"enforcementLevel": ..., prop: ...}}`)
  merged and checked against each policy's config schema;
- Analyze every registered resource (as the engine's step generator does) with the provider of a custom
  resource (an explicit one from the preview, else the default provider the engine builds from the
  package's config keys), then AnalyzeStack over all resources but providers, with parent,
  dependencies and property dependencies;
- stop the process.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import grpc
import jsonschema
import yaml
from google.protobuf import empty_pb2, json_format, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from infra.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
PACK_DIR = REPO / "policies"
# Offline there is no engine; the Python policy host only talks to it to log a crash.
ENGINE_ADDRESS = "127.0.0.1:0"
ORGANIZATION = "organization"
LEVELS = ("advisory", "mandatory", "disabled", "remediate")   # in the proto's EnforcementLevel order
SEVERITIES = {0: None, 1: "low", 2: "medium", 3: "high", 4: "critical"}
UNKNOWN_SENTINEL = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"   # the engine's marshalled unknown value
PREVIEW_UNKNOWN = "[unknown]"                                # how the offline preview writes one
START_TIMEOUT_S = 60
RPC_TIMEOUT_S = 120
_MAX_MESSAGE = 400 * 1024 * 1024


class PackError(Exception):
    """The policy pack could not start or failed while analysing; str() is one line."""


# --- starting the pack ------------------------------------------------------------------------------

def pack_spec(pack_dir: Path = PACK_DIR) -> dict:
    """PulumiPolicy.yaml of the pack."""
    spec = yaml.safe_load((pack_dir / "PulumiPolicy.yaml").read_text())
    return spec if isinstance(spec, dict) else {}


def pack_command(pack_dir: Path = PACK_DIR) -> list[str]:
    """The command the CLI's Python policy shim runs: the pack virtualenv's python, else this one."""
    runtime = pack_spec(pack_dir).get("runtime")
    venv = runtime.get("options", {}).get("virtualenv") if isinstance(runtime, dict) else None
    python = sys.executable
    if venv:
        candidate = (pack_dir / venv / "bin" / "python")
        if candidate.exists():
            python = str(candidate)
    return [python, "-u", "-m", "pulumi.policy", ENGINE_ADDRESS, "."]


def pack_env(stack: str, project: str, config: dict[str, str]) -> dict[str, str]:
    """The environment the CLI gives a policy pack (constructEnv): config as JSON plus the stack identity."""
    env = dict(os.environ)
    env.update(PULUMI_CONFIG=json.dumps(config), PULUMI_PROJECT=project, PULUMI_STACK=stack,
               PULUMI_DRY_RUN="true", PULUMI_ORGANIZATION=ORGANIZATION)
    return env


class PolicyPack:
    """A running policy pack process and a gRPC client to it. Use as a context manager."""

    def __init__(self, stack: str, project: str, config: dict[str, str], pack_dir: Path = PACK_DIR):
        self.stack, self.project, self.config, self.pack_dir = stack, project, dict(config), pack_dir
        self.process: Optional[subprocess.Popen] = None
        self.channel = None
        self.stub = None
        self.info = None
        self.version = self.host_version = None

    def __enter__(self) -> "PolicyPack":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(pack_command(self.pack_dir), cwd=self.pack_dir, stdout=subprocess.PIPE,
                                        stderr=self._stderr, env=pack_env(self.stack, self.project, self.config))
        try:
            port = self._read_port()
            self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.max_send_message_length", _MAX_MESSAGE)])
            grpc.channel_ready_future(self.channel).result(timeout=START_TIMEOUT_S)
            self.stub = analyzer_pb2_grpc.AnalyzerStub(self.channel)
            self._handshake()
            self._configure_stack()
            self.info = self._call("GetAnalyzerInfo", _empty())
            self.host_version = self._call("GetPluginInfo", _empty()).version
            # Like the CLI: PulumiPolicy.yaml's version wins over the one the pack reports.
            self.version = str(pack_spec(self.pack_dir).get("version") or self.info.version)
        except BaseException:
            self.close()
            raise

    def _read_port(self) -> int:
        ready, _, _ = select.select([self.process.stdout], [], [], START_TIMEOUT_S)
        line = self.process.stdout.readline().decode().strip() if ready else ""
        if not line.isdigit():
            try:
                self.process.wait(timeout=5)  # let a crashing pack finish writing its error
            except subprocess.TimeoutExpired:
                pass
            raise PackError(f"policy pack {self.pack_dir.name}/ did not start: {self._last_error() or line!r}")
        return int(line)

    def _last_error(self) -> str:
        self._stderr.seek(0)
        lines = [ln for ln in self._stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""

    def _call(self, method: str, request):
        try:
            return getattr(self.stub, method)(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise PackError(f"policy pack {method} failed: {' '.join(str(detail).split())[:300]}") from None

    def _handshake(self) -> None:
        request = analyzer_pb2.AnalyzerHandshakeRequest(engine_address=ENGINE_ADDRESS,
                                                        root_directory=str(self.pack_dir),
                                                        program_directory=str(self.pack_dir))
        try:
            self.stub.Handshake(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise PackError(f"policy pack Handshake failed: {exc.details()}") from None

    def _configure_stack(self) -> None:
        request = analyzer_pb2.AnalyzerStackConfigureRequest(
            stack=self.stack, project=self.project, organization=ORGANIZATION, dry_run=True)
        request.config.update({k: v for k, v in self.config.items()})
        self._call("ConfigureStack", request)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # the Python host stops its server on KeyboardInterrupt
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None:
            self.process.stdout.close()
            self._stderr.close()
            self.process = None

    # --- policies and their config ---------------------------------------------------------------

    def policies(self) -> list[dict]:
        """Every policy's metadata, as GetAnalyzerInfo tells it."""
        out = []
        for p in self.info.policies:
            schema = json_format.MessageToDict(p.configSchema.properties) if p.HasField("configSchema") else {}
            out.append({
                "name": p.name, "description": p.description, "level": LEVELS[p.enforcementLevel],
                "severity": SEVERITIES.get(p.severity), "type": "stack" if p.policy_type == 2 else "resource",
                "frameworks": list(p.tags) or ([p.framework.name] if p.framework.name else []),
                "remediation": p.remediation_steps, "config_schema": schema,
                "required": list(p.configSchema.required) if p.HasField("configSchema") else [],
            })
        return out

    def configure(self, policy_config: Optional[dict]) -> dict[str, dict]:
        """Send Configure with the reconciled config; return it ({policy: {"enforcementLevel", ...props}})."""
        initial = {k: json_format.MessageToDict(v.properties) | (
            {"enforcementLevel": LEVELS[v.enforcementLevel]} if v.enforcementLevel else {})
            for k, v in self.info.initialConfig.items()}
        merged = reconcile(self.policies(), initial, policy_config or {})
        request = analyzer_pb2.ConfigureAnalyzerRequest()
        for name, cfg in merged.items():
            entry = request.policyConfig[name]
            entry.enforcementLevel = LEVELS.index(cfg["enforcementLevel"])
            entry.properties.update({k: v for k, v in cfg.items() if k != "enforcementLevel"})
        self._call("Configure", request)
        return merged

    # --- analysis --------------------------------------------------------------------------------

    def analyze(self, resources: list[dict], policy_config: Optional[dict] = None) -> dict:
        """Configure, Analyze each resource, AnalyzeStack over all but providers; the verdicts as a dict."""
        merged = self.configure(policy_config)
        by_urn = {r["urn"]: r for r in resources}
        diagnostics = []
        analyzed = 0
        for r in resources:
            request = analyzer_pb2.AnalyzeRequest(type=r["type"], urn=r["urn"], name=r["name"],
                                                  properties=_struct(r.get("inputs")),
                                                  options=_options(r))
            provider = self._provider(r, by_urn)
            if provider is not None:
                request.provider.CopyFrom(provider)
            response = self._call("Analyze", request)
            diagnostics += [(d, r["urn"]) for d in response.diagnostics]
            analyzed += 1
        stack_request = analyzer_pb2.AnalyzeStackRequest()
        for r in resources:
            if r["type"].startswith("pulumi:providers:"):
                continue
            item = stack_request.resources.add(type=r["type"], urn=r["urn"], name=r["name"],
                                               parent=r.get("parent") or "",
                                               dependencies=r.get("dependencies") or [])
            item.properties.CopyFrom(_struct(r.get("inputs")))
            item.options.CopyFrom(_options(r))
            for prop, urns in (r.get("propertyDependencies") or {}).items():
                item.propertyDependencies[prop].urns.extend(urns)
            provider = self._provider(r, by_urn)
            if provider is not None:
                item.provider.CopyFrom(provider)
        diagnostics += [(d, None) for d in self._call("AnalyzeStack", stack_request).diagnostics]
        return self._verdicts(diagnostics, merged, analyzed)

    def _provider(self, resource: dict, by_urn: dict):
        """The provider the engine would send: the explicit one, else the package's default provider."""
        if not resource.get("custom") or resource["type"].startswith("pulumi:providers:"):
            return None
        ref = resource.get("provider")
        if ref:
            urn = ref.rsplit("::", 1)[0]
            explicit = by_urn.get(urn)
            if explicit is None:
                return None
            return analyzer_pb2.AnalyzerProviderResource(type=explicit["type"], urn=urn, name=explicit["name"],
                                                         properties=_struct(explicit.get("inputs")))
        package = resource["type"].split(":", 1)[0]
        props = {k.split(":", 1)[1]: _decode(v) for k, v in self.config.items() if k.split(":", 1)[0] == package}
        return analyzer_pb2.AnalyzerProviderResource(
            type=f"pulumi:providers:{package}", name="default",
            urn=f"urn:pulumi:{self.stack}::{self.project}::pulumi:providers:{package}::default",
            properties=_struct(props))

    def _verdicts(self, diagnostics, merged: dict, analyzed: int) -> dict:
        meta = {p["name"]: p for p in self.policies()}
        violations, skipped = [], []
        for d, resource_urn in diagnostics:
            message = d.message
            if message.startswith(d.description):
                message = message[len(d.description):].strip()
            entry = {
                "policy": d.policyName, "level": LEVELS[d.enforcementLevel],
                "severity": SEVERITIES.get(d.severity) or meta.get(d.policyName, {}).get("severity"),
                "urn": d.urn or resource_urn, "message": message or d.description,
                "description": d.description,
                "remediation": meta.get(d.policyName, {}).get("remediation", ""),
                "frameworks": meta.get(d.policyName, {}).get("frameworks", []),
            }
            # The host reports a policy that read an unknown value as an advisory "can't run" note.
            (skipped if message.startswith("can't run policy") else violations).append(entry)
        order = {"mandatory": 0, "remediate": 1, "advisory": 2}
        violations.sort(key=lambda v: (order.get(v["level"], 3), v["policy"], v["urn"] or ""))
        return {
            "pack": self.info.name, "version": self.version, "policy_sdk": self.host_version,
            "resources_analyzed": analyzed,
            "violations": violations, "skipped": skipped,
            "policies": [{**p, "level": merged[p["name"]]["enforcementLevel"]} for p in meta.values()],
        }


# --- config reconciliation (the CLI's ReconcilePolicyPackConfig) ------------------------------------

def reconcile(policies: list[dict], initial: dict, given: dict) -> dict[str, dict]:
    """Defaults from each policy's schema and level, then the pack's initial config, then `given`.

    `given` is the CLI's --policy-pack-config document. Unknown policy names, bad levels and values
    that break a policy's config schema raise ConfigError (key, value, what is allowed).
    """
    if not isinstance(given, dict):
        raise ConfigError("--policy-config", given, 'a map {"<policy>": level | {"enforcementLevel": ..., ...}}')
    result = {p["name"]: {"enforcementLevel": p["level"],
                          **{k: s["default"] for k, s in p["config_schema"].items() if "default" in s}}
              for p in policies}
    for source in (initial, given):
        if "all" in source:
            level = _level(source["all"] if isinstance(source["all"], str) else
                           (source["all"] or {}).get("enforcementLevel"), "all")
            for cfg in result.values():
                cfg["enforcementLevel"] = level
        for name, value in source.items():
            if name == "all":
                continue
            if name not in result:
                raise ConfigError(f"--policy-config {name}", value, f"policy names of the pack: {', '.join(sorted(result))}")
            if isinstance(value, str):
                result[name]["enforcementLevel"] = _level(value, name)
            elif isinstance(value, dict):
                if "enforcementLevel" in value:
                    result[name]["enforcementLevel"] = _level(value["enforcementLevel"], name)
                result[name].update({k: v for k, v in value.items() if k != "enforcementLevel"})
            else:
                raise ConfigError(f"--policy-config {name}", value, "a level or an object of settings")
    for p in policies:
        props = {k: v for k, v in result[p["name"]].items() if k != "enforcementLevel"}
        schema = {"type": "object", "properties": p["config_schema"], "required": p["required"],
                  "additionalProperties": False}
        error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(schema).iter_errors(props))
        if error is not None:
            where = ".".join(str(x) for x in error.absolute_path)
            key = f"--policy-config {p['name']}" + (f".{where}" if where else "")
            allowed = (f"settings: {', '.join(sorted(p['config_schema'])) or 'none'}"
                       if error.validator == "additionalProperties" else error.message)
            raise ConfigError(key, error.instance, allowed)
    return result


def _level(value: Any, name: str) -> str:
    if value not in LEVELS:
        raise ConfigError(f"--policy-config {name}.enforcementLevel", value, f"one of {', '.join(LEVELS)}")
    return value


# --- marshalling ------------------------------------------------------------------------------------

def _empty():
    return empty_pb2.Empty()


def _engine_value(value: Any) -> Any:
    """A preview value as the engine marshals it: "[unknown]" becomes the unknown sentinel."""
    if isinstance(value, dict):
        return {k: _engine_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_engine_value(v) for v in value]
    if value == PREVIEW_UNKNOWN:
        return UNKNOWN_SENTINEL
    return value


def _struct(props: Optional[dict]):
    out = struct_pb2.Struct()
    if props:
        out.update(_engine_value({k: v for k, v in props.items() if v is not None}))
    return out


def _options(resource: dict):
    return analyzer_pb2.AnalyzerResourceOptions(parent=resource.get("parent") or "")


def _decode(value: str) -> Any:
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def analyze(resources: list[dict], stack: str, project: str, config: dict[str, str],
            policy_config: Optional[dict] = None) -> dict:
    """Run the pack over a preview's resources (see the module docstring); returns
    {"pack", "version", "violations": [{policy, level, severity, urn, message, remediation, ...}],
    "policies": [...], "skipped": [...], "resources_analyzed"}."""
    with PolicyPack(stack, project, config) as pack:
        return pack.analyze(resources, policy_config)
