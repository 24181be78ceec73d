"""Helpers shared by the policy modules.

Policies see resource inputs as the engine sends them: camelCase names, launch-template booleans as
the strings "true"/"false", and, during a real preview, unknown values. `plain()` turns the SDK's
unknown-checking proxies into ordinary dicts and lists where every unknown value is `UNKNOWN`, so a
check reads values without ever raising; a check treats `UNKNOWN` as "cannot tell yet" and stays quiet.

A check is a generator of violation messages: `check(resource, ctx)` for one resource,
`check(resources, ctx)` yielding `(message, urn)` for a stack policy.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import pulumi.runtime
from pulumi_policy import (EnforcementLevel, PolicyComplianceFramework, PolicyConfigSchema,
                           ResourceValidationPolicy, Severity, StackValidationPolicy)
from pulumi_policy.proxy import UnknownValueError, _is_unknown

from infra.config import EU_REGIONS


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _Unknown()
CLASSIFICATION_TAG = "data-classification"


def plain(value: Any) -> Any:
    """A plain copy of engine-sent properties; unknown values (at any depth) become UNKNOWN."""
    if _is_unknown(value):
        return UNKNOWN
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        out = {}
        for key in value:
            try:
                out[key] = plain(value[key])
            except UnknownValueError:
                out[key] = UNKNOWN
        return out
    if isinstance(value, Sequence):
        out_list = []
        for i in range(len(value)):
            try:
                out_list.append(plain(value[i]))
            except UnknownValueError:
                out_list.append(UNKNOWN)
        return out_list
    return value


def get(value: Any, *path: Any, default: Any = None) -> Any:
    """value[p0][p1]...; `default` when a step is missing or null, UNKNOWN when a step is unknown."""
    for key in path:
        if value is UNKNOWN:
            return UNKNOWN
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            return default
        if value is None:
            return default
    return value


def items(value: Any) -> list:
    """The elements of a list property; [] for a missing, unknown or non-list value."""
    if isinstance(value, list):
        return value
    return []


def flag(value: Any) -> Optional[bool]:
    """True/False for a boolean sent as bool or as "true"/"false"; None when missing or unknown."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def number(value: Any) -> Optional[float]:
    """A number sent as int, float or numeric string; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def json_doc(value: Any) -> Any:
    """A JSON policy document given as text or object; UNKNOWN if unknown, None if absent or not JSON."""
    if value is UNKNOWN:
        return UNKNOWN
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def as_list(value: Any) -> list:
    """A JSON-policy field that may be one value or a list of values."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def tags_of(props: dict) -> dict:
    """Resource tags as a dict ({} when there are none or they are not a map)."""
    tags = props.get("tags")
    return dict(tags) if isinstance(tags, dict) else {}


AWS_MANAGED_KEY = ("alias/aws/",)


def aws_managed_key(key: Any) -> bool:
    """A KMS key reference naming an AWS managed key (alias/aws/<service>, as an alias or an alias ARN)."""
    return isinstance(key, str) and (key.startswith(AWS_MANAGED_KEY) or ":alias/aws/" in key)


def type_chain(urn: str) -> list[str]:
    """The types in a URN's qualified type, outermost parent first: `urn:pulumi:s::p::A$B::n` -> [A, B]."""
    parts = urn.split("::", 3)
    return parts[2].split("$") if len(parts) == 4 else []


# --- stack context ---------------------------------------------------------------------------------

def stack_value(key: str, default: Any = None) -> Any:
    """A stack config value (e.g. "gpufleet:mode") as the engine passes it to the pack; JSON decoded."""
    raw = pulumi.runtime.get_config(key)
    if raw is None:
        return default
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def cloud_of(resource_type: str) -> str:
    return resource_type.split(":", 1)[0]


@dataclass
class Resource:
    """A plain view of one resource as the engine sent it to a stack policy."""
    type: str
    name: str
    urn: str
    props: dict
    parent: Optional[str] = None
    dependencies: list[str] = field(default_factory=list)
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    provider: dict = field(default_factory=dict)

    def deps(self, *prop_names: str) -> list[str]:
        """URNs this resource depends on through the given input properties (all dependencies if none)."""
        if not prop_names:
            return list(self.dependencies)
        return [u for p in prop_names for u in self.property_dependencies.get(p, [])]


def _resource(r) -> Resource:
    return Resource(
        type=r.resource_type, name=r.name, urn=r.urn, props=plain(r.props),
        parent=r.parent.urn if r.parent is not None else None,
        dependencies=[d.urn for d in r.dependencies],
        property_dependencies={k: [d.urn for d in v] for k, v in r.property_dependencies.items()},
        provider=plain(r.provider.props) if r.provider is not None else {})


class Stack:
    """The resources of a stack, indexed for linking through dependencies and parents."""

    def __init__(self, resources: Iterable[Resource]):
        self.resources = list(resources)
        self.by_urn = {r.urn: r for r in self.resources}

    def of(self, *types: str) -> list[Resource]:
        return [r for r in self.resources if r.type in types]

    def children(self, parent: Resource, types: Iterable[str]) -> list[Resource]:
        """Resources of `types` whose parent is `parent` (a component's own resources)."""
        types = set(types)
        return [r for r in self.resources if r.type in types and r.parent == parent.urn]

    def parent_of(self, resource: Resource) -> Optional[Resource]:
        return self.by_urn.get(resource.parent) if resource.parent else None

    def under(self, resource: Resource, component_type: str) -> Optional[Resource]:
        """The nearest ancestor of `component_type` in this stack, else None."""
        seen = set()
        parent = self.parent_of(resource)
        while parent is not None and parent.urn not in seen:
            if parent.type == component_type:
                return parent
            seen.add(parent.urn)
            parent = self.parent_of(parent)
        return None

    def referrers(self, target: Resource, types: Iterable[str], *prop_names: str) -> list[Resource]:
        """Resources of `types` that depend on `target` through `prop_names` (any dependency if none)."""
        types = set(types)
        return [r for r in self.resources if r.type in types and target.urn in r.deps(*prop_names)]

    def targets(self, source: Resource, types: Iterable[str], *prop_names: str) -> list[Resource]:
        """Resources of `types` that `source` depends on through `prop_names` (any dependency if none)."""
        types = set(types)
        return [self.by_urn[u] for u in dict.fromkeys(source.deps(*prop_names))
                if u in self.by_urn and self.by_urn[u].type in types]


@dataclass
class Context:
    """What a check may read besides the resource: its policy config (defaults filled in) and the stack."""
    config: dict
    provider: dict = field(default_factory=dict)
    resource_type: str = ""
    urn: str = ""

    def within(self, component_type: str) -> bool:
        """The resource was created under a component of `component_type` (read from its URN)."""
        return component_type in type_chain(self.urn)[:-1]

    def classification(self, props: Optional[dict] = None) -> Optional[str]:
        """The resource's data-classification tag, else the stack's gpufleet:dataClassification."""
        tagged = tags_of(props or {}).get(CLASSIFICATION_TAG)
        if isinstance(tagged, str):
            return tagged
        return stack_value("gpufleet:dataClassification")

    def region(self, props: dict, cloud: str) -> Any:
        """Where a resource lives: its own region/location, else its provider's, else the stack config."""
        key = "location" if cloud == "azure-native" else "region"
        for source in (props, self.provider):
            value = source.get(key)
            if value is not None:
                return value
        config_key = "azure-native:location" if cloud == "azure-native" else "aws:region"
        return stack_value(config_key)


# --- policy construction ---------------------------------------------------------------------------

SEVERITY = {"low": Severity.LOW, "medium": Severity.MEDIUM, "high": Severity.HIGH, "critical": Severity.CRITICAL}


def _schema(config: Optional[dict]) -> Optional[PolicyConfigSchema]:
    return PolicyConfigSchema(properties=config) if config else None


def _defaults(config: Optional[dict]) -> dict:
    return {k: v["default"] for k, v in (config or {}).items() if "default" in v}


def _common(name, description, severity, frameworks, remediation, mandatory, config):
    return dict(
        name=name, description=description,
        enforcement_level=EnforcementLevel.MANDATORY if mandatory else EnforcementLevel.ADVISORY,
        config_schema=_schema(config), severity=SEVERITY[severity],
        framework=PolicyComplianceFramework(name=frameworks[0]), tags=list(frameworks),
        remediation_steps=remediation)


def resource_policy(name: str, description: str, *, types: Iterable[str] | str, severity: str,
                    frameworks: list[str], remediation: str, check: Callable[[dict, Context], Iterable[str]],
                    mandatory: bool = True, config: Optional[dict] = None) -> ResourceValidationPolicy:
    """A policy over single resources of `types` (or, given a package name such as "aws", all of its
    resources); `check(props, ctx)` yields violation messages."""
    if isinstance(types, str):
        applies = lambda t, package=types: cloud_of(t) == package  # noqa: E731
    else:
        applies = frozenset(types).__contains__
    defaults = _defaults(config)

    def validate(args, report_violation):
        if not applies(args.resource_type):
            return
        ctx = Context(config={**defaults, **(args.get_config() or {})},
                      provider=plain(args.provider.props) if args.provider is not None else {},
                      resource_type=args.resource_type, urn=args.urn)
        for message in check(plain(args.props), ctx):
            report_violation(message, None)

    return ResourceValidationPolicy(validate=validate,
                                    **_common(name, description, severity, frameworks, remediation, mandatory, config))


def stack_policy(name: str, description: str, *, severity: str, frameworks: list[str], remediation: str,
                 check: Callable[[Stack, Context], Iterable[tuple[str, Optional[str]]]],
                 mandatory: bool = True, config: Optional[dict] = None) -> StackValidationPolicy:
    """A policy over the whole stack; `check(stack, ctx)` yields (message, urn) pairs."""
    defaults = _defaults(config)

    def validate(args, report_violation):
        stack = Stack(_resource(r) for r in args.resources)
        ctx = Context(config={**defaults, **(args.get_config() or {})})
        for message, urn in check(stack, ctx):
            report_violation(message, urn)

    return StackValidationPolicy(validate=validate,
                                 **_common(name, description, severity, frameworks, remediation, mandatory, config))


def eu_regions(cloud: str) -> list[str]:
    return list(EU_REGIONS["azure" if cloud == "azure-native" else cloud])
