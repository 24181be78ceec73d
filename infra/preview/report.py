"""The default human format of a preview document: a resource tree, outputs, policy verdicts, cost."""
from __future__ import annotations

import json
from collections import defaultdict

STACK_TYPE = "pulumi:pulumi:Stack"


def table(doc: dict) -> str:
    """Plain text: one line per resource, indented under its parent, then outputs, policy and cost."""
    lines = [_header(doc), ""]
    lines += _tree(doc["resources"])
    if doc.get("outputs"):
        lines += ["", "Outputs"]
        width = max(map(len, doc["outputs"]))
        lines += [f"  {k:<{width}}  {_value(v)}" for k, v in doc["outputs"].items()]
    lines += ["", *_policy(doc.get("policy") or {})]
    if (cost := doc.get("cost") or {}).get("monthly_usd"):
        lines += ["", *_cost(cost)]
    if doc.get("warnings"):
        lines += ["", "Warnings", *(f"  {w}" for w in doc["warnings"])]
    return "\n".join(lines) + "\n"


def _header(doc: dict) -> str:
    cfg = doc.get("config", {})
    resources = doc["resources"]
    custom = sum(1 for r in resources if r["custom"])
    components = sum(1 for r in resources if not r["custom"] and r["type"] != STACK_TYPE)
    nodes = cfg.get("nodes", {})
    fleet = (f"{cfg.get('mode')} mode, {nodes.get('min')}-{nodes.get('max')} x "
             f"{', '.join(cfg.get('instanceTypes', []))}{' (spot)' if cfg.get('spot') else ''}")
    return (f"Stack {doc['stack']} ({doc['cloud']}, {cfg.get('region')}): {fleet}\n"
            f"{custom} resources to create in {components} components")


def _tree(resources: list[dict]) -> list[str]:
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
    w_type = max([len("TYPE")] + [len(t) for t, _, _ in rows])
    w_name = max([len("NAME")] + [len(n) for _, n, _ in rows])
    out = [f"{'TYPE':<{w_type}}  {'NAME':<{w_name}}  ID"]
    out += [f"{t:<{w_type}}  {n:<{w_name}}  {i}".rstrip() for t, n, i in rows]
    return out


def _value(v) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def _policy(policy: dict) -> list[str]:
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
        out.append(f"  [{v.get('level')}/{v.get('severity')}] {v.get('policy')} {name}: {v.get('message')}")
    return out


def _cost(cost: dict) -> list[str]:
    from infra.preview.markdown import money

    cur = cost.get("currency") or "USD"
    monthly = cost["monthly_usd"]
    levels = " / ".join(f"{k} {money(monthly[k], cur)}" for k in ("min", "desired", "max") if k in monthly)
    line = f"Cost per month ({cost.get('purchase', '')} prices of {cost.get('price_date', '?')}): {levels}"
    if cur != "USD":
        line = line.replace("Cost per month (", f"Cost per month in {cur} (", 1)
    budget = (cost.get("budget") or {}).get("monthly_usd")
    return [line + (f"; budget {money(budget, cur)}" if budget is not None else "")]
