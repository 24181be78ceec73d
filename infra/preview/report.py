"""The default human format of a preview document: a resource tree, outputs, policy verdicts with their
remediation, cost, and with --diff the changes. It fits the terminal: long types, names and ids are
elided in the middle (their ends tell them apart), prose is wrapped.
"""
from __future__ import annotations

import json
import shutil
import textwrap
from collections import defaultdict

from infra.preview.markdown import money

STACK_TYPE = "pulumi:pulumi:Stack"
MIN_WIDTH = 60


def terminal_width() -> int:
    """The terminal's columns ($COLUMNS first), 100 when there is no terminal."""
    return shutil.get_terminal_size((100, 24)).columns


def elide(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and end around an ellipsis."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    keep = width - 1
    return text[:keep - keep // 2] + "…" + text[len(text) - keep // 2:]


def _wrap(text: str, width: int, indent: str, more: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=more,
                         break_long_words=True, break_on_hyphens=False) or [indent.rstrip()]


def table(doc: dict, width: int | None = None) -> str:
    """Plain text no wider than ``width`` (default: the terminal's): one line per resource, indented under
    its parent, then outputs, policy verdicts and remediation, cost, changes (with --diff), warnings."""
    width = max(MIN_WIDTH, width or terminal_width())
    lines = [*_wrap(_header(doc).splitlines()[0], width, "", "  "), _header(doc).splitlines()[1], ""]
    lines += _tree(doc["resources"], width)
    if doc.get("outputs"):
        lines += ["", "Outputs"]
        key_width = min(max(map(len, doc["outputs"])), width // 3)
        lines += [f"  {elide(k, key_width):<{key_width}}  {elide(_value(v), width - key_width - 4)}"
                  for k, v in doc["outputs"].items()]
    lines += ["", *_policy(doc.get("policy") or {}, width)]
    if "idle" in ((cost := doc.get("cost") or {}).get("monthly_usd") or {}):
        lines += ["", *_cost(cost, width)]
    if doc.get("diff"):
        lines += ["", *_diff(doc["diff"], width)]
    if doc.get("warnings"):
        lines += ["", "Warnings", *(w for warning in doc["warnings"] for w in _wrap(warning, width, "  ", "    "))]
    return "\n".join(lines) + "\n"


def _header(doc: dict) -> str:
    cfg = doc.get("config", {})
    resources = doc["resources"]
    custom = sum(1 for r in resources if r["custom"])
    components = sum(1 for r in resources if not r["custom"] and r["type"] != STACK_TYPE)
    fleet = "; ".join(_partition(p) for p in cfg.get("partitions") or []) or _single_group(cfg)
    controller = (cfg.get("controller") or {}).get("instanceType")
    if controller:
        fleet += f"; controller {controller}"
    return (f"Stack {doc['stack']} ({doc['cloud']}, {cfg.get('region')}): {fleet}\n"
            f"{custom} resources to create in {components} components")


def _partition(p: dict) -> str:
    """A Slurm partition: its name, nodes (always on - max), types and how they run."""
    nodes = p.get("nodes") or {}
    how = [w for w, on in (("spot", p.get("spot")), ("gang", p.get("gang"))) if on]
    return (f"partition {p.get('name')} {nodes.get('min', 0)}-{nodes.get('max')} x "
            f"{', '.join(p.get('instanceTypes', []))}" + (f" ({', '.join(how)})" if how else ""))


def _single_group(cfg: dict) -> str:
    """A document without partitions (written before Slurm): the single group's keys."""
    nodes = cfg.get("nodes", {})
    return (f"{cfg.get('mode')} mode, {nodes.get('min')}-{nodes.get('max')} x "
            f"{', '.join(cfg.get('instanceTypes', []))}{' (spot)' if cfg.get('spot') else ''}")


def _tree(resources: list[dict], width: int) -> list[str]:
    children: dict[str | None, list[dict]] = defaultdict(list)
    urns = {r["urn"] for r in resources}
    for r in resources:
        children[r["parent"] if r["parent"] in urns else None].append(r)
    rows: list[tuple[str, str, str]] = []

    def walk(parent: str | None, prefix: str) -> None:
        kids = sorted(children.get(parent, []), key=lambda r: (r["custom"], r["type"], r["name"]))
        for i, r in enumerate(kids):
            last = i == len(kids) - 1
            branch = "" if parent is None else ("└─ " if last else "├─ ")
            rows.append((prefix + branch + r["type"], r["name"], r["id"] or ""))
            walk(r["urn"], prefix + ("" if parent is None else ("   " if last else "│  ")))

    walk(None, "")
    # Columns in proportion to the terminal: the tree and type first, then the name; the id gets the rest.
    w_type = min(max([len("TYPE")] + [len(t) for t, _, _ in rows]), width * 45 // 100)
    w_name = min(max([len("NAME")] + [len(n) for _, n, _ in rows]), width * 25 // 100)
    w_id = width - w_type - w_name - 4
    out = [f"{'TYPE':<{w_type}}  {'NAME':<{w_name}}  ID"]
    out += [f"{elide(t, w_type):<{w_type}}  {elide(n, w_name):<{w_name}}  {elide(i, w_id)}".rstrip()
            for t, n, i in rows]
    return out


def _value(v) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def _policy(policy: dict, width: int) -> list[str]:
    pack = policy.get("pack")
    violations = policy.get("violations", [])
    if not pack:
        return ["Policy: no policy pack ran"]
    if not violations:
        return [f"Policy ({pack}): no violations"]
    order = {"mandatory": 0, "remediate": 1, "advisory": 2}
    out = [f"Policy ({pack}): {len(violations)} violation(s)"]
    for v in sorted(violations, key=lambda v: (order.get(v.get("level"), 3), v.get("policy", ""))):
        name = (v.get("urn") or "").rsplit("::", 1)[-1] or "stack"
        out += _wrap(f"[{v.get('level')}/{v.get('severity')}] {v.get('policy')} {name}: {v.get('message')}",
                     width, "  ", "      ")
        if v.get("remediation"):
            out += _wrap(f"fix: {v['remediation']}", width, "      ", "           ")
    return out


def _diff(diff: dict, width: int) -> list[str]:
    """The changes against the --diff base: counts, then each resource added, removed, renamed or changed."""
    s = diff.get("summary", {})
    out = [f"Changes against the base: {s.get('added', 0)} to add, {s.get('removed', 0)} to remove, "
           f"{s.get('renamed', 0)} renamed, {s.get('updated', 0)} to update, {s.get('replaced', 0)} to replace"]
    rows = [("+", r["type"], r["name"], "") for r in diff.get("added", [])]
    rows += [("-", r["type"], r["name"], "") for r in diff.get("removed", [])]
    rows += [(">", r["type"], r["from"].rsplit("::", 1)[-1], "-> " + r["to"].rsplit("::", 1)[-1])
             for r in diff.get("renamed", [])]
    rows += [("!" if c["replace"] else "~", c["type"], c["name"], ", ".join(c["paths"]))
             for c in diff.get("changed", [])]
    w_type = min(max([len(t) for _, t, _, _ in rows] or [0]), width * 45 // 100)
    for mark, rtype, name, detail in rows:
        line = f"  {mark} {elide(rtype, w_type):<{w_type}}  {name}"
        out.append(elide(line + (f"  {detail}" if detail else ""), width))
    policy = diff.get("policy", {})
    for word, key in (("new", "appeared"), ("gone", "disappeared")):
        for v in policy.get(key, []):
            out.append(elide(f"  policy {word}: [{v.get('level')}] {v.get('policy')} "
                             f"{(v.get('urn') or '').rsplit('::', 1)[-1] or 'stack'}", width))
    delta = (diff.get("cost") or {}).get("delta_monthly_usd") or {}
    cur = (diff.get("cost") or {}).get("currency") or "USD"
    if any(delta.values()):
        out.append("  cost per month: " + " / ".join(f"{k} {v:+,.2f} {cur}" for k, v in delta.items()))
    return out


def _cost(cost: dict, width: int) -> list[str]:
    cur = cost.get("currency") or "USD"
    monthly = cost["monthly_usd"]
    sizes = " / ".join(f"{k} {money(monthly[k], cur)}" for k in ("idle", "full") if k in monthly)
    line = f"Cost per month (list prices of {cost.get('price_date', '?')}): {sizes}"
    if cur != "USD":
        line = line.replace("Cost per month (", f"Cost per month in {cur} (", 1)
    budget = (cost.get("budget") or {}).get("monthly_usd")
    told = f"budget {money(budget, cur)}" if budget is not None else ""
    if told and len(line) + len(told) + 2 <= width:
        return [f"{line}; {told}"]
    return [*_wrap(line, width, "", "  "), *([f"  {told}"] if told else [])]
