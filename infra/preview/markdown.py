"""Render a preview JSON document as a pull-request comment (GitHub-flavoured Markdown).

Sections, in reading order: header and one-line summary; changes against the base branch (when the
document has ``diff``); policy verdicts, mandatory first; the program's warnings, if any; monthly cost;
resources by component and type; a Mermaid graph of the components and the links between them. The output depends only on the document
(everything is sorted), so the same preview always renders the same text.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict

STACK_TYPE = "pulumi:pulumi:Stack"
ROOT = "(stack)"
_SEVERITY = {"critical": 0, "high": 1, "medium": 2, "low": 3}
_LEVEL = {"mandatory": 0, "remediate": 1, "advisory": 2}
MAX_PATHS = 8
MAX_NAMES = 12
MAX_VALUE = 48


# --- small formatting helpers ------------------------------------------------------------------

SYMBOL = {"USD": "$", "CNY": "¥"}


def money(x: float, currency: str = "USD") -> str:
    return f"{SYMBOL.get(currency, currency + ' ')}{x:,.2f}"


def rate(x: float, currency: str = "USD") -> str:
    """An hourly price with the catalog's precision (2 to 4 decimals)."""
    whole, frac = f"{x:,.4f}".split(".")
    return f"{SYMBOL.get(currency, currency + ' ')}{whole}.{frac.rstrip('0').ljust(2, '0')}"


def signed_money(x: float, currency: str = "USD") -> str:
    return ("+" if x > 0 else "-" if x < 0 else "±") + money(abs(x), currency)


def currency_of(doc: dict) -> str:
    return (doc.get("cost") or {}).get("currency") or "USD"


def _cell(text: str) -> str:
    """Text safe inside a table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _value(v) -> str:
    if v is None:
        return "(none)"
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 1] + "…"


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


# --- structure of the stack --------------------------------------------------------------------

def _resources(doc: dict) -> list[dict]:
    return [r for r in doc.get("resources", []) if r.get("type") != STACK_TYPE]


def components(doc: dict) -> dict[str, str]:
    """URN of every custom resource -> URN of the component that holds it (ROOT for none)."""
    by_urn = {r["urn"]: r for r in _resources(doc)}
    owner = {}
    for res in by_urn.values():
        if not res["custom"] or res["type"].startswith("pulumi:providers:"):
            continue
        parent = by_urn.get(res.get("parent") or "")
        while parent is not None and parent["custom"]:
            parent = by_urn.get(parent.get("parent") or "")
        owner[res["urn"]] = parent["urn"] if parent else ROOT
    return owner


def _component_label(doc: dict, urn: str) -> str:
    if urn == ROOT:
        return ROOT
    res = next(r for r in _resources(doc) if r["urn"] == urn)
    return f"{res['name']} ({res['type']})"


def links(doc: dict, owner: dict[str, str]) -> set[tuple[str, str]]:
    """(A, B) component pairs where a resource (or component) of A depends on one of B."""
    home = {**owner, **{c: c for c in set(owner.values())}}
    edges = set()
    for res in _resources(doc):
        src = home.get(res["urn"])
        if src is None:
            continue
        deps = set(res.get("dependencies") or [])
        for urns in (res.get("propertyDependencies") or {}).values():
            deps.update(urns)
        for dep in deps:
            dst = home.get(dep)
            if dst is not None and dst != src:
                edges.add((src, dst))
    return edges


# --- sections ----------------------------------------------------------------------------------

def _violations(doc: dict) -> list[dict]:
    policy = doc.get("policy") or {}
    remedies = {p.get("name"): p.get("remediation", "") for p in policy.get("policies", [])}
    out = [{**v, "remediation": v.get("remediation") or remedies.get(v.get("policy"), "")}
           for v in policy.get("violations", [])]
    return sorted(out, key=_verdict_order)


def _verdict_order(v: dict) -> tuple:
    return (_LEVEL.get(v.get("level"), 9), _SEVERITY.get(v.get("severity"), 9), v.get("policy", ""),
            v.get("urn") or "")


def _urn_name(urn: str | None) -> str:
    return urn.rsplit("::", 1)[-1] if urn else ROOT


def _names(doc: dict) -> dict[str, str]:
    return {r["urn"]: r["name"] for r in _resources(doc)}


def _not_run(doc: dict) -> str:
    """Why the policy pack gave no verdicts, or "" when it ran."""
    policy = doc.get("policy") or {}
    return policy.get("error") or ("" if policy.get("pack") else "no policy analyzer in this checkout")


def _summary(doc: dict, owner: dict[str, str], violations: list[dict]) -> str:
    levels = Counter(v.get("level") for v in violations)
    if _not_run(doc):
        verdict = "⚠️ not run"
    elif levels.get("mandatory"):
        verdict = f"❌ {levels['mandatory']} mandatory"
    else:
        verdict = "✅ no mandatory violations"
    others = sum(n for level, n in levels.items() if level != "mandatory")
    if others:
        verdict += f", {others} advisory"
    parts = [f"**{_plural(len(owner), 'resource')}** in {_plural(len(set(owner.values())), 'component')}",
             f"policy: {verdict}"]
    cost = doc.get("cost") or {}
    m = cost.get("monthly_usd") or {}
    if "idle" in m and "full" in m:
        cur = currency_of(doc)
        parts.append(f"cost: {money(m['idle'], cur)}/month idle, {money(m['full'], cur)} at full size")
    return " · ".join(parts)


def _policy_section(doc: dict, violations: list[dict]) -> list[str]:
    policy = doc.get("policy") or {}
    pack = policy.get("pack")
    lines = ["### Policy verdicts", ""]
    reason = _not_run(doc)
    if reason:
        lines += [f"⚠️ The policy pack did not run: {_cell(reason)}", ""]
    elif not violations:
        count = f"{_plural(len(policy['policies']), 'policy')} of " if policy.get("policies") else ""
        lines += [f"✅ No policy violations ({count}`{pack}`)." if pack else "✅ No policy violations.", ""]
    if not violations:
        return lines
    names = _names(doc)
    lines += ["| level | severity | policy | resource | message | remediation |", "|---|---|---|---|---|---|"]
    for v in violations:
        icon = "❌" if v.get("level") == "mandatory" else "⚠️"
        where = names.get(v.get("urn") or "", _urn_name(v.get("urn")))
        lines.append(f"| {icon} {v.get('level', '')} | {v.get('severity', '')} | `{v.get('policy', '')}` | "
                     f"{_cell(where)} | {_cell(v.get('message', ''))} | {_cell(v.get('remediation', ''))} |")
    return lines + [""]


def _cost_section(cost: dict) -> list[str]:
    """Per partition its prices and its month idle and at full size, then the controller and the fixed items,
    the usage-based prices, the budget and what is not included."""
    if not cost.get("partitions") or "idle" not in (cost.get("monthly_usd") or {}):
        return []
    cur = cost.get("currency") or "USD"
    amount, rate_ = (lambda x: money(x, cur)), (lambda x: rate(x, cur))
    in_currency = "" if cur == "USD" else f" in {cur}"
    monthly = cost["monthly_usd"]
    lines = ["### Monthly cost", "",
             f"List prices{in_currency} of {cost['price_region']} as of {cost['price_date']}, "
             f"{cost['hours_per_month']} h/month (stack region {cost['region']}). Idle: the controller, the fixed "
             "items and the always-on nodes; full: every partition at its maximum size.", "",
             "| partition | nodes always on / max | on-demand | spot | idle | full |",
             "|---|---:|---|---|---:|---:|"]
    for p in cost["partitions"]:
        od, spot = p["prices"]["on_demand"], p["prices"]["spot"]
        lines.append(f"| `{p['name']}` ({p['purchase']}) | {p['always_on']} / {p['nodes_max']} | "
                     f"`{od['instance_type']}` {rate_(od['usd_hour'])}/h | "
                     f"`{spot['instance_type']}` {rate_(spot['usd_hour'])}/h | {amount(p['idle_usd'])} | "
                     f"{amount(p['full_usd'])} |")
    fixed = cost.get("fixed_monthly_usd", 0.0)
    lines += [f"| controller and fixed items | | | | {amount(fixed)} | {amount(fixed)} |",
              f"| **this stack** | | | | **{amount(monthly['idle'])}** | **{amount(monthly['full'])}** |", ""]
    for p in cost["partitions"]:
        od_basis, spot_basis = p["prices"]["on_demand"]["basis"], p["prices"]["spot"]["basis"]
        if p["purchase"] == "on-demand":
            how = f"on-demand at the {od_basis}"
        else:
            how = f"spot at the {spot_basis} (planning ratio to on-demand)"
            if p.get("on_demand_base"):
                how = f"the first {p['on_demand_base']} node(s) on-demand at the {od_basis}, the rest {how}"
        text = f"- `{p['name']}`: {how}"
        disk = p.get("node_disk")
        if disk:
            text += f"; each node also carries its {disk['item']} at {amount(disk['usd_month'])}/month"
        lines.append(text)
    if cost.get("fixed"):
        items = [f"{f['item']} {f['quantity']} × {amount(f['usd_month_each'])} = {amount(f['monthly_usd'])}"
                 for f in cost["fixed"]]
        lines.append("- controller and fixed items per month: " + "; ".join(items))
    if cost.get("usage"):
        items = [f"{u['item']} {rate_(u['usd_each'])} per {u['unit']}" for u in cost["usage"]]
        lines.append("- usage-based, not in the totals: " + "; ".join(items))
    budget = cost.get("budget")
    if budget:
        state = ("✅ within budget at full size" if budget["within_at_full"] else
                 "⚠️ over budget at full size" if budget["within_when_idle"] else "❌ over budget when idle")
        lines.append(f"- budget {amount(budget['monthly_usd'])}/month: {state} ({budget['used_at_full_pct']}% used "
                     f"at full size, headroom {signed_money(budget['headroom_at_full_usd'], cur)})")
    if cost.get("excluded"):
        lines.append(f"- not included: {cost['excluded']}")
    return lines + [""]


def _resource_section(doc: dict, owner: dict[str, str]) -> list[str]:
    by_urn = {r["urn"]: r for r in _resources(doc)}
    groups: dict[str, list[dict]] = defaultdict(list)
    for urn, comp in owner.items():
        groups[comp].append(by_urn[urn])
    order = sorted(groups, key=lambda c: _component_label(doc, c))
    lines = ["### Resources", "", "| component | type | count |", "|---|---|---:|"]
    for comp in order:
        label = _component_label(doc, comp)
        for rtype, n in sorted(Counter(r["type"] for r in groups[comp]).items()):
            lines.append(f"| {_cell(label)} | `{rtype}` | {n} |")
    lines.append("")
    for comp in order:
        members = sorted(groups[comp], key=lambda r: (r["type"], r["name"]))
        lines += [f"<details><summary>{_component_label(doc, comp)}: {_plural(len(members), 'resource')}</summary>",
                  ""]
        lines += [f"- `{r['type']}` {r['name']}" for r in members]
        lines += ["", "</details>", ""]
    return lines


def _mermaid(doc: dict, owner: dict[str, str]) -> list[str]:
    comps = sorted(set(owner.values()), key=lambda c: _component_label(doc, c))
    ids = {c: f"c{i}" for i, c in enumerate(comps)}
    lines = ["### Components", "", "An arrow A --> B: a resource of A depends on a resource of B.", "",
             "```mermaid", "graph LR"]
    for comp in comps:
        label = _component_label(doc, comp).replace('"', "#quot;")
        lines.append(f'  {ids[comp]}["{label}"]')
    for src, dst in sorted(links(doc, owner)):
        lines.append(f"  {ids[src]} --> {ids[dst]}")
    return lines + ["```", ""]


def _code(rtype: str) -> str:
    return f"`{rtype}`" if ":" in rtype else rtype


def _same_changes(changed: list[dict]) -> list[list[dict]]:
    """Changes grouped when they change the same paths the same way (a tag on every resource: one row);
    replacements first, then in URN order."""
    groups: dict[str, list[dict]] = {}
    for c in sorted(changed, key=lambda c: (not c["replace"], c["urn"])):
        key = json.dumps([c["replace"], c["values"]], sort_keys=True)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def _diff_section(doc: dict) -> list[str]:
    diff = doc["diff"]
    s = diff["summary"]
    delta = diff["cost"]["delta_monthly_usd"]
    cur = currency_of(doc)
    lines = ["### Changes against the base branch", ""]
    counts = [f"{s['added']} to add", f"{s['removed']} to remove", f"{s['updated']} to update",
              f"{s['replaced']} to replace", f"{s['renamed']} renamed"]
    lines.append(", ".join(counts) + f"; cost per month {signed_money(delta.get('idle', 0.0), cur)} idle, "
                 f"{signed_money(delta.get('full', 0.0), cur)} at full size.")
    lines.append("")
    rows = []
    for r in diff["added"]:
        rows.append(("➕ add", r["type"], r["name"], ""))
    for r in diff["removed"]:
        rows.append(("➖ remove", r["type"], r["name"], ""))
    for r in diff["renamed"]:
        old, new = _urn_name(r["from"]), _urn_name(r["to"])
        rows.append(("🏷️ rename", r["type"], f"{old} → {new}",
                     "same inputs; add an alias to keep it, or it is deleted and recreated"))
    for group in _same_changes(diff["changed"]):
        c = group[0]
        shown = []
        for path in c["paths"][:MAX_PATHS]:
            v = c["values"][path]
            mark = " (forces replacement)" if path in c["replace_paths"] else ""
            shown.append(f"`{path}`: `{_value(v['old'])}` → `{_value(v['new'])}`{mark}")
        if len(c["paths"]) > MAX_PATHS:
            shown.append(f"… and {len(c['paths']) - MAX_PATHS} more")
        types = sorted({g["type"] for g in group})
        names = [g["name"] for g in group]
        if len(names) > MAX_NAMES:
            names = names[:MAX_NAMES] + [f"… and {len(names) - MAX_NAMES} more"]
        rows.append(("🔁 replace" if c["replace"] else "✏️ update",
                     types[0] if len(types) == 1 else _plural(len(types), "type"), ", ".join(names),
                     "<br>".join(shown)))
    if rows:
        lines += ["| change | type | name | inputs |", "|---|---|---|---|"]
        lines += [f"| {a} | {_code(t)} | {_cell(n)} | {_cell(p)} |" for a, t, n, p in rows]
        lines.append("")
    for key, title in (("appeared", "New policy violations"), ("disappeared", "Resolved policy violations")):
        found = sorted(diff["policy"][key], key=_verdict_order)
        if found:
            lines.append(f"**{title}:**")
            lines += [f"- {v.get('level', '')} `{v.get('policy', '')}` on {_urn_name(v.get('urn'))}: "
                      f"{v.get('message', '')}" for v in found]
            lines.append("")
    if not rows and not any(diff["policy"].values()):
        lines += ["No changes.", ""]
    return lines


def render(doc: dict) -> str:
    """The PR-ready Markdown report of one preview document."""
    cfg = doc.get("config") or {}
    region = cfg.get("region") or (doc.get("cost") or {}).get("region", "")
    violations = _violations(doc)
    owner = components(doc)
    lines = [f"## gpufleet preview: `{doc['stack']}` ({doc['cloud']}, {region})", "",
             _summary(doc, owner, violations), ""]
    if "diff" in doc:
        lines += _diff_section(doc)
    lines += _policy_section(doc, violations)
    if doc.get("warnings"):
        lines += [f"<details><summary>⚠️ {_plural(len(doc['warnings']), 'program warning')}</summary>", ""]
        lines += [f"- {_cell(w)}" for w in sorted(doc["warnings"])] + ["", "</details>", ""]
    lines += _cost_section(doc.get("cost") or {})
    lines += _resource_section(doc, owner)
    lines += _mermaid(doc, owner)
    return "\n".join(lines).rstrip() + "\n"
