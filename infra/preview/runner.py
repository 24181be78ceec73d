"""Run the real Pulumi program in-process on Pulumi's mock runtime and build the preview document.

``run_program`` drives a program the way the Pulumi Python host does (``run_in_stack``: a root
``pulumi:pulumi:Stack``, the program, then the stack outputs), but against ``RecordingMonitor``, a
mock resource monitor that answers from ``PreviewMocks`` and records every registration: type,
name, URN, parent, inputs as the provider receives them, id, provider and dependency URNs.
Each run happens in a copy of the current ``contextvars`` context (Pulumi keeps its settings, config
and root stack in context variables) on its own event loop, so previews in one process are isolated
from each other and from the caller.

``preview`` is the whole offline preview: validate the config, run ``infra.program.main`` (the same
entry ``pulumi up`` runs), then the policy pack
(``infra.preview.analyzer.PolicyPack``, started while the program runs), the cost estimate and the
diff against a base document.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import logging
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from infra import config

PROJECT = "gpufleet"
STACK_TYPE = "pulumi:pulumi:Stack"
SECRET = "[secret]"
UNKNOWN = "[unknown]"
_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parents[1]


class ProgramError(Exception):
    """The program failed under the mock runtime; str() is one line."""


@dataclass
class Captured:
    resources: list[dict]
    outputs: dict
    warnings: list[str] = field(default_factory=list)


# --- recording monitor ------------------------------------------------------------------------------

@functools.cache
def _monitor_class():
    """``RecordingMonitor``, defined on first use so that importing this module stays cheap."""
    from google.protobuf import struct_pb2  # lazy: pulumi (~0.3 s) off gpufleet's start-up
    from pulumi.runtime import mocks, rpc, settings
    from pulumi.runtime.proto import resource_pb2
    from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

    sig = rpc._special_sig_key
    special = {rpc._special_secret_sig: "secret", rpc._special_resource_sig: "resource",
               rpc._special_asset_sig: "asset", rpc._special_archive_sig: "archive",
               rpc._special_output_value_sig: "output"}

    def plain(value: Any) -> Any:
        """A protobuf property value as JSON-ready Python, secrets masked, references as URNs."""
        if isinstance(value, struct_pb2.Struct):
            kind = special.get(value[sig]) if sig in value else None
            if kind == "secret" or (kind == "output" and value.get("secret")):
                return SECRET
            if kind == "resource":
                return str(value["urn"])
            if kind == "output":
                return plain(value["value"]) if "value" in value else UNKNOWN
            items = ((k, plain(v)) for k, v in value.items() if k != sig)  # assets and archives keep their fields
            return {k: v for k, v in items if v is not None}
        if isinstance(value, struct_pb2.ListValue):
            return [plain(v) for v in value]
        if isinstance(value, str) and value == rpc.UNKNOWN:
            return UNKNOWN
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    class RecordingMonitor(mocks.MockMonitor):
        """A mock monitor that records what the program registers (components and reads included)."""

        def __init__(self, mocks_: mocks.Mocks):
            super().__init__(mocks_)
            self.records: dict[str, dict] = {}
            self.stack_outputs: dict = {}
            self.stack_urn = ""
            self._lock = threading.Lock()

        def _record(self, request, urn: str, custom: bool, id_: Optional[str], inputs: Any) -> None:
            deps = getattr(request, "dependencies", [])
            prop_deps = getattr(request, "propertyDependencies", {})
            with self._lock:
                self.records[urn] = {
                    "type": request.type, "name": request.name, "urn": urn,
                    "parent": request.parent or None, "inputs": inputs, "id": id_ or None,
                    "custom": custom, "provider": request.provider or None,
                    "dependencies": sorted(set(deps)),
                    "propertyDependencies": {k: sorted(set(v.urns)) for k, v in sorted(prop_deps.items())
                                             if v.urns},
                }

        def make_urn(self, parent: str, type_: str, name: str) -> str:
            """The engine's URN: the parent's whole type chain, the root stack left out."""
            if parent:
                qualified = parent.split("::")[2]
                if qualified != STACK_TYPE:
                    type_ = f"{qualified}${type_}"
            return f"urn:pulumi:{settings.get_stack()}::{settings.get_project()}::{type_}::{name}"

        def RegisterResource(self, request):
            urn = self.make_urn(request.parent, request.type, request.name)
            if request.type == STACK_TYPE:
                self.stack_urn = urn
            if not request.custom and not request.remote:
                # Components and the stack have no provider: nothing to mock.
                self._record(request, urn, False, None, plain(request.object))
                return resource_pb2.RegisterResourceResponse(urn=urn)
            _ensure_event_loop()
            args = mocks.MockResourceArgs(
                typ=request.type, name=request.name, inputs=rpc.deserialize_properties(request.object),
                provider=request.provider, resource_id=request.importId, custom=request.custom)
            id_, state = self.mocks.new_resource(args)
            obj = _sync_await(rpc.serialize_properties(state, {}))
            self.resources[urn] = mocks.MockMonitor.ResourceRegistration(urn, id_, state)
            self._record(request, urn, bool(request.custom), id_, plain(request.object))
            return resource_pb2.RegisterResourceResponse(urn=urn, id=id_, object=obj)

        def ReadResource(self, request):
            response = super().ReadResource(request)
            self._record(request, response.urn, True, request.id, plain(request.properties))
            return response

        def RegisterResourceOutputs(self, request):
            if request.urn == self.stack_urn:
                self.stack_outputs = dict(sorted(plain(request.outputs).items()))
            return super().RegisterResourceOutputs(request)

    return RecordingMonitor


class _LogCollector(logging.Handler):
    """Collects the program's ``pulumi.log`` messages: warnings are reported, errors fail the run."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.warnings: list[str] = []
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors.append(record.getMessage())
        elif record.levelno >= logging.WARNING:
            self.warnings.append(record.getMessage())


# --- running a program ------------------------------------------------------------------------------

def run_program(program: Callable[[], Any], *, stack: str, config_map: dict[str, str],
                secret_keys: frozenset[str], mocks, project: str = PROJECT) -> Captured:
    """Run ``program`` on the mock runtime in an isolated context; return what it registered."""
    return contextvars.copy_context().run(_run_isolated, program, stack, config_map, secret_keys, mocks, project)


def _run_isolated(program, stack, config_map, secret_keys, mocks, project) -> Captured:
    from pulumi.runtime import config as runtime_config  # lazy: pulumi (~0.3 s) off gpufleet's start-up
    from pulumi.runtime import mocks as pulumi_mocks
    from pulumi.runtime import settings
    from pulumi.runtime.stack import run_in_stack

    monitor = _monitor_class()(mocks)
    logs = _LogCollector()
    logger = logging.getLogger("gpufleet.preview.program")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(logs)
    settings.configure(pulumi_mocks.MockSettings(
        monitor=monitor, monitor_features=set(monitor.GetDeploymentInfo(None).supportedFeatures),
        engine=pulumi_mocks.MockEngine(logger), project=project, stack=stack, dry_run=False,
        organization="organization", callbacks=None))
    settings.ROOT.set(None)
    runtime_config.set_all_config(dict(config_map), list(secret_keys))

    previous = _current_loop()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(run_in_stack(program))
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 any program failure becomes one line
        raise ProgramError(one_line(exc)) from exc
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        asyncio.set_event_loop(previous)
        logger.removeHandler(logs)
    if logs.errors:
        raise ProgramError(_squash(logs.errors[0]))
    resources = sorted(monitor.records.values(), key=lambda r: (r["type"] != STACK_TYPE, r["urn"]))
    return Captured(resources, monitor.stack_outputs, logs.warnings)


def _current_loop():
    try:
        return asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return None


def _squash(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(exc: BaseException) -> str:
    """``Type: message (at infra/x.py:N)``: the deepest frame of the program (this repository, not
    the SDK in .venv nor this preview engine), when there is one."""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if path.is_relative_to(_REPO) and ".venv" not in path.parts and not path.is_relative_to(_HERE):
            where = f" (at {path.relative_to(_REPO)}:{frame.lineno})"
    return _squash(f"{type(exc).__name__}: {exc}") + where


# --- the preview document ---------------------------------------------------------------------------

def hook(name: str):
    """The module ``infra.preview.<name>`` (analyzer, cost, diff, markdown), imported when first needed.

    Tests replace this to leave the policy pack out (None for "analyzer")."""
    return importlib.import_module(f"infra.preview.{name}")


def _main() -> None:
    from infra import program  # lazy: pulumi (~0.3 s) off gpufleet's start-up

    program.main()


def preview(raw: dict[str, Any], secret_keys: frozenset[str], stack: str, *,
            program: Optional[Callable[[], Any]] = None, policy_config: Optional[dict] = None,
            base: Optional[dict] = None) -> dict:
    """The preview document of a stack config (``{"ns:key": value}`` as ``read_stack_file`` gives it).

    Raises ``config.ConfigError`` before running anything when the config is invalid, and
    ``ProgramError`` when the program fails. ``program`` defaults to ``infra.program.main``.
    """
    from infra.preview.mocks import PreviewMocks  # lazy: pulumi (~0.3 s) off gpufleet's start-up

    # Offline there is no key to decrypt `secure:` values: the program gets the opaque ciphertext.
    ciphertexts = {k: v["secure"] for k, v in raw.items() if k in secret_keys}
    raw = {**raw, **ciphertexts}
    try:
        cfg = config.parse(raw, stack, secret_keys)
    except config.ConfigError as exc:
        if any(c in str(exc) for c in ciphertexts.values()):
            raise config.ConfigError(exc.key, SECRET, exc.allowed) from None
        raise
    engine = config.to_engine_config(raw)
    masked_engine = {k: SECRET if k in secret_keys else v for k, v in engine.items()}
    analyzer = hook("analyzer")
    pack = analyzer.PolicyPack(stack, PROJECT, masked_engine) if analyzer else None
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The policy pack's process starts while the program runs: each spends most of its time
        # importing the Pulumi SDKs, and they do so on different cores.
        starting = pool.submit(pack.start) if pack else None
        try:
            try:
                captured = run_program(program or _main, stack=stack, config_map=engine,
                                       secret_keys=secret_keys, mocks=PreviewMocks(stack, cfg.region))
            except ProgramError as exc:
                raise ProgramError(redact(str(exc), set(ciphertexts.values()))) from exc
            doc: dict[str, Any] = redact({
                "stack": stack, "cloud": cfg.cloud, "project": PROJECT,
                "config": _config_view(cfg, secret_keys),
                "resources": captured.resources, "outputs": captured.outputs,
                "warnings": captured.warnings,
            }, set(ciphertexts.values()))
            if pack:
                starting.result()
                doc["policy"] = pack.analyze(doc["resources"], policy_config)
            else:
                doc["policy"] = {"pack": None, "violations": []}
        finally:
            if pack:
                wait([starting])
                pack.close()
    doc["cost"] = hook("cost").estimate(cfg)
    if base is not None:
        doc["warnings"] = [*doc["warnings"], *base_warnings(base, doc)]
        doc["diff"] = hook("diff").compute(base, doc)
    return doc


def base_warnings(base: dict, doc: dict) -> list[str]:
    """A base preview of another stack or cloud still diffs, but every line of it is the stacks' difference."""
    told = []
    for key in ("stack", "cloud"):
        if base.get(key) and base[key] != doc[key]:
            told.append(f"--diff: the base is a preview of {key} {base[key]!r}, not {doc[key]!r}: "
                        f"the diff shows how the two {key}s differ, not a change to {doc[key]!r}")
    return told


def _config_view(cfg: config.StackConfig, secret_keys: frozenset[str]) -> dict:
    view = cfg.model_dump(mode="json", by_alias=True, exclude_none=True)
    for key in secret_keys:
        ns, _, name = key.partition(":")
        if ns == config.NAMESPACE and name in view:
            view[name] = SECRET
    return view


def redact(value: Any, secrets: set[str]) -> Any:
    """``value`` with every occurrence of each string in ``secrets`` replaced by ``[secret]``."""
    if not secrets:
        return value
    if isinstance(value, str):
        for s in secrets:
            value = value.replace(s, SECRET)
        return value
    if isinstance(value, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    return value


def mandatory_violations(doc: dict) -> list[dict]:
    return [v for v in doc.get("policy", {}).get("violations", []) if v.get("level") == "mandatory"]
