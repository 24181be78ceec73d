"""GPU cluster guardrails: EFA layout and security groups, cluster placement, GPU quota, scale-to-zero, cost.

Instance facts (GPUs, EFA interfaces) come from `infra.catalog`. On AWS the GPU nodes are Slurm CLOUD nodes that
the controller launches with EC2 CreateFleet: each Slurm partition is a `gpufleet:aws:Partition` component whose
properties say what it is (instance types, maxNodes, alwaysOn, spot, onDemandBase, gang, subnetIds) and whose
children are its launch template and, for a multi-node gang, its cluster placement group (linked by parent URN).
Security groups are linked to launch templates through property dependencies. Azure's partitions are
`gpufleet:azure:Partition` components with the same properties (and vmSize); their GPU quota, scale to zero and
monthly ceiling are judged here the same way. Tencent's (in CNY) are in tencent_rules.
"""
from __future__ import annotations

from typing import Optional

from infra.catalog import CATALOG
from policies.common import (UNKNOWN, Resource, Stack, flag, get, items, number, resource_policy, stack_policy,
                             stack_value)
from policies.tokens import (AZ_PARTITION, LAUNCH_TEMPLATE, PARTITION, PLACEMENT_GROUP, SECURITY_GROUP,
                             SG_EGRESS_RULE, SG_INGRESS_RULE, SG_RULE)

EFA_KINDS = ("efa", "efa-only")
_GPU = ["gpufleet-gpu"]


# --- derivations -----------------------------------------------------------------------------------

def efa_layout_problems(instance_type: str, nics: list) -> list[str]:
    """Why a launch template's interfaces do not match `instance_type`'s EFA set ([] when they do)."""
    row = CATALOG.get(instance_type)
    if row is None:
        return []
    efa = [n for n in nics if get(n, "interfaceType") in EFA_KINDS]
    if not efa:
        return []
    if row.max_efa == 0:
        return [f"{instance_type} supports no EFA but the template attaches {len(efa)} EFA interface(s)"]
    if len(efa) != row.max_efa:
        return [f"{len(efa)} EFA interface(s) for {instance_type}, which has {row.max_efa}: attach all or none"]
    cards = [number(get(n, "networkCardIndex", default=0)) for n in efa]
    if any(c is None for c in cards):
        return []
    problems = []
    if sorted(cards) != list(range(row.max_efa)):
        problems.append(f"EFA interfaces must take network cards 0..{row.max_efa - 1} once each, "
                        f"got {sorted(int(c) for c in cards)}")
    slots = [(number(get(n, "networkCardIndex", default=0)), number(get(n, "deviceIndex"))) for n in nics]
    if len(set(slots)) != len(slots):
        problems.append("two interfaces share a network card and device index")
    if (0, 0) not in slots:
        problems.append("no primary interface (network card 0, device index 0)")
    return problems


def monthly_max_usd(instance_types: list[str], max_nodes: float, spot: bool, on_demand_base: float = 0) -> float:
    """Worst-case monthly cost of a node group at its maximum size, priced by its dearest type in the catalog's
    currency (USD on AWS and Azure, CNY on Tencent): with `spot`, the first `on_demand_base` nodes at the on-demand
    price and the rest at the spot price."""
    rows = [CATALOG[t] for t in instance_types if t in CATALOG]
    if not rows:
        return 0.0
    on_demand = min(max(on_demand_base, 0), max_nodes) if spot else max_nodes
    hourly = (max(r.price_hour for r in rows) * on_demand
              + max(r.spot_price_hour for r in rows) * (max_nodes - on_demand))
    return hourly * 730


# --- partitions ------------------------------------------------------------------------------------

def partition_types(part: Resource) -> list[str]:
    """A partition's instance types (AWS, Tencent) or VM sizes (Azure: instanceTypes and vmSize)."""
    types = items(part.props.get("instanceTypes")) + [part.props.get("vmSize")]
    return [t for t in dict.fromkeys(types) if isinstance(t, str)]


def partition_label(part: Resource) -> str:
    name = part.props.get("partition")
    return f"partition '{name}'" if isinstance(name, str) else f"partition '{part.name}'"


def is_gang(props: dict) -> Optional[bool]:
    """A partition's gang flag (missing means a queue partition); None while unknown."""
    value = props.get("gang")
    if value is None:
        return False
    return flag(value)


def is_multi_node_gang(part: Resource) -> bool:
    size = number(part.props.get("maxNodes"))
    return is_gang(part.props) is True and size is not None and size > 1


def templates_of(stack: Stack, part: Resource) -> list[Resource]:
    return stack.children(part, [LAUNCH_TEMPLATE])


def placement_groups_of(stack: Stack, part: Resource) -> list[Resource]:
    """The partition's placement groups: its own children, and any its launch templates name (placement)."""
    groups = stack.children(part, [PLACEMENT_GROUP])
    for template in templates_of(stack, part):
        groups += stack.targets(template, [PLACEMENT_GROUP], "placement")
    return list({g.urn: g for g in groups}.values())


def template_types(stack: Stack, template: Resource) -> list[str]:
    """The instance types a launch template starts: its own, and those of the partition it belongs to."""
    types = [template.props.get("instanceType")]
    part = stack.parent_of(template)
    if part is not None and part.type == PARTITION:
        types += partition_types(part)
    return [t for t in dict.fromkeys(types) if isinstance(t, str)]


def efa_nics(template: Resource) -> list:
    return [n for n in items(template.props.get("networkInterfaces")) if get(n, "interfaceType") in EFA_KINDS]


def uses_efa(stack: Stack, part: Resource) -> bool:
    """The partition's nodes talk over EFA: its launch template attaches EFA interfaces or, with no template of
    its own in this stack, its properties count EFA interfaces or its instance types have EFA."""
    templates = templates_of(stack, part)
    if templates:
        return any(efa_nics(t) for t in templates)
    if (number(part.props.get("efaInterfaces")) or 0) > 0:
        return True
    return any(CATALOG[t].efa for t in partition_types(part) if t in CATALOG)


# --- checks ----------------------------------------------------------------------------------------

def check_efa_layout(stack: Stack, ctx):
    for template in stack.of(LAUNCH_TEMPLATE):
        nics = template.props.get("networkInterfaces")
        if nics is UNKNOWN:
            continue
        part = stack.parent_of(template)
        multi = part is not None and part.type == PARTITION and is_multi_node_gang(part)
        for instance_type in template_types(stack, template):
            for problem in efa_layout_problems(instance_type, items(nics)):
                yield f"launch template '{template.name}': {problem}", template.urn
            row = CATALOG.get(instance_type)
            if multi and row is not None and row.efa and not efa_nics(template):
                yield (f"launch template '{template.name}': multi-node gang {partition_label(part)} on "
                       f"{instance_type} attaches none of its {row.max_efa} EFA interfaces"), template.urn


def _self_rule(stack: Stack, sg: Resource, direction: str) -> bool:
    inline = [r for r in items(sg.props.get(direction)) if isinstance(r, dict)]
    if any(str(r.get("protocol")) in ("-1", "all") and flag(r.get("self")) for r in inline):
        return True
    for rule in stack.referrers(sg, [SG_RULE], "securityGroupId"):
        if (rule.props.get("type") == direction and str(rule.props.get("protocol")) in ("-1", "all")
                and flag(rule.props.get("self"))):
            return True
    rule_type = SG_INGRESS_RULE if direction == "ingress" else SG_EGRESS_RULE
    for rule in stack.referrers(sg, [rule_type], "securityGroupId"):
        if str(rule.props.get("ipProtocol")) == "-1" and sg.urn in rule.deps("referencedSecurityGroupId"):
            return True
    return False


def check_efa_security_group(stack: Stack, ctx):
    for template in stack.of(LAUNCH_TEMPLATE):
        if not efa_nics(template):
            continue
        groups = stack.targets(template, [SECURITY_GROUP], "networkInterfaces")
        if not groups:
            yield f"launch template '{template.name}' puts EFA interfaces in no security group of this stack", template.urn
            continue
        if any(_self_rule(stack, g, "ingress") and _self_rule(stack, g, "egress") for g in groups):
            continue
        names = ", ".join(g.name for g in groups)
        yield (f"EFA security group(s) {names} of launch template '{template.name}' do not allow all traffic "
               f"in from and out to themselves"), template.urn


def check_efa_cluster(stack: Stack, ctx):
    for part in stack.of(PARTITION):
        if not is_multi_node_gang(part) or not uses_efa(stack, part):
            continue
        label = partition_label(part)
        groups = placement_groups_of(stack, part)
        if not groups:
            yield f"multi-node EFA gang {label} has no cluster placement group", part.urn
        elif len(groups) > 1:
            yield (f"multi-node EFA gang {label} has {len(groups)} placement groups "
                   f"({', '.join(g.name for g in groups)}); its nodes must share one"), part.urn
        for group in groups:
            if group.props.get("strategy") not in ("cluster", UNKNOWN):
                yield (f"placement group '{group.name}' of {label} uses strategy "
                       f"{group.props.get('strategy')}, not cluster"), part.urn
        subnets = part.props.get("subnetIds")
        if isinstance(subnets, list) and len(subnets) != 1:
            yield (f"multi-node EFA gang {label} launches into {len(subnets)} subnets; "
                   f"EFA needs exactly one subnet in one AZ"), part.urn


def group_sizes(stack: Stack, part_type: str) -> list[tuple[Resource, list[str], float]]:
    """(partition, instance types, maximum node count) for every Slurm partition of `part_type` whose size is known."""
    out = []
    for part in stack.of(part_type):
        size = number(part.props.get("maxNodes"))
        if size is not None:
            out.append((part, partition_types(part), size))
    return out


def _label(group: Resource) -> str:
    return group.props.get("partition") if isinstance(group.props.get("partition"), str) else group.name


def _detail(groups) -> str:
    return ", ".join(f"{_label(g)}: {size:g} x {'/'.join(types)}" for g, types, size in groups)


def _gpus(group: Resource, types: list[str]) -> float:
    """GPUs of a node: the dearest catalog type's, else the partition's own gpusPerNode."""
    known = [CATALOG[t].gpus for t in types if t in CATALOG]
    return max(known) if known else (number(group.props.get("gpusPerNode")) or 0)


def gpu_quota(part_type: str):
    """A stack check: the partitions of `part_type` at their maximum size stay within ctx.config's maxGpus."""
    def check(stack: Stack, ctx):
        groups = [(g, types, size) for g, types, size in group_sizes(stack, part_type) if _gpus(g, types)]
        total = sum(size * _gpus(g, types) for g, types, size in groups)
        if total > ctx.config["maxGpus"]:
            yield (f"GPU partitions can reach {total:g} GPUs, over the quota of {ctx.config['maxGpus']:g} "
                   f"({_detail(groups)})"), groups[0][0].urn
    return check


def check_partition_scale_to_zero(props: dict, ctx):
    if is_gang(props) is not False:
        return
    floor = number(props.get("alwaysOn"))
    if floor:
        name = props.get("partition")
        label = f"queue partition '{name}'" if isinstance(name, str) else "queue partition"
        yield f"{label} keeps {floor:g} node(s) powered up (alwaysOn) when no job needs them"


def partition_monthly(part: Resource, types: list[str], size: float) -> float:
    """A partition's worst month at its maximum size (catalog currency): its first onDemandBase nodes on demand,
    the rest at the spot price when it runs spot."""
    spot = flag(part.props.get("spot")) is True
    return monthly_max_usd(types, size, spot, number(part.props.get("onDemandBase")) or 0)


CURRENCY = {"USD": ("monthlyCeilingUsd", "gpufleet:budgetMonthlyUsd", "$"),
            "CNY": ("monthlyCeilingCny", "gpufleet:budgetMonthlyCny", "¥")}


def monthly_ceiling(part_type: str, currency: str = "USD"):
    """A stack check: the partitions of `part_type` at their maximum size cost less a month than the ceiling (policy
    config, else the stack's budget in `currency`, the catalog's currency for the cloud)."""
    config_key, budget_key, symbol = CURRENCY[currency]

    def check(stack: Stack, ctx):
        ceiling = number(ctx.config.get(config_key) or stack_value(budget_key))
        if not ceiling:
            return
        groups = group_sizes(stack, part_type)
        cost = sum(partition_monthly(g, types, size) for g, types, size in groups)
        if cost > ceiling:
            yield (f"GPU partitions at their maximum size cost about {symbol}{cost:,.0f}/month, over the "
                   f"{symbol}{ceiling:,.0f} ceiling ({_detail(groups)})"), groups[0][0].urn
    return check


_QUOTA = {"maxGpus": {"type": "integer", "minimum": 0, "default": 64,
                      "description": "Most GPUs all partitions of the stack may reach together."}}
_CEILING = {"monthlyCeilingUsd": {"type": "number", "minimum": 0,
                                  "description": "Monthly ceiling in USD; defaults to gpufleet:budgetMonthlyUsd."}}
POLICIES = [
    stack_policy(
        "aws-ec2-launchtemplate-efa-layout",
        "Launch templates attach either the instance type's full EFA set, one per network card, or none.",
        severity="high", frameworks=_GPU, check=check_efa_layout,
        remediation="Attach one interface per network card 0..N-1 (N = the type's EFA count): card 0 deviceIndex 0 "
                    "interfaceType 'efa', the others deviceIndex 1 'efa-only' (or 'efa'); derive them from "
                    "infra.catalog for every instance type of the partition."),
    stack_policy(
        "aws-ec2-securitygroup-efa-self-traffic",
        "Security groups on EFA interfaces allow all traffic in from and out to themselves.",
        severity="high", frameworks=_GPU, check=check_efa_security_group,
        remediation="Add an ingress and an egress rule with protocol '-1' referencing the security group itself "
                    "(self true, or SecurityGroupIngress/EgressRule with referencedSecurityGroupId)."),
    stack_policy(
        "aws-slurm-partition-efa-cluster",
        "Multi-node EFA gang partitions launch into one cluster placement group in exactly one subnet.",
        severity="high", frameworks=_GPU, check=check_efa_cluster,
        remediation="Give the partition one child aws.ec2.PlacementGroup with strategy 'cluster' (the node provider "
                    "passes it to CreateFleet) and exactly one subnet in subnetIds."),
    stack_policy(
        "aws-slurm-partition-gpu-quota",
        "The stack's Slurm partitions at their maximum size together stay within the configured GPU quota.",
        severity="medium", frameworks=_GPU, check=gpu_quota(PARTITION), config=_QUOTA,
        remediation="Lower the partitions' nodes.max or use a smaller type, or raise maxGpus in the policy config "
                    "once the EC2 service quota for the instance family is raised."),
    resource_policy(
        "aws-slurm-partition-queue-scale-to-zero",
        "Queue (non-gang) Slurm partitions power every node down when no job needs it.",
        types=[PARTITION], severity="medium", frameworks=_GPU, check=check_partition_scale_to_zero, mandatory=False,
        remediation="Set the partition's nodes.min 0 (alwaysOn 0) so an idle queue partition holds no GPU node."),
    stack_policy(
        "aws-slurm-partition-monthly-ceiling",
        "The stack's Slurm partitions at their maximum size stay under the monthly cost ceiling.",
        severity="low", frameworks=["gpufleet-cost"], check=monthly_ceiling(PARTITION), mandatory=False,
        config=_CEILING,
        remediation="Lower the partitions' nodes.max, use spot capacity or a cheaper type, or raise budgetMonthlyUsd."),
    stack_policy(
        "azure-slurm-partition-gpu-quota",
        "The stack's Slurm partitions at their maximum size together stay within the configured GPU quota.",
        severity="medium", frameworks=_GPU, check=gpu_quota(AZ_PARTITION), config=_QUOTA,
        remediation="Lower the partitions' nodes.max or use a smaller size, or raise maxGpus in the policy config "
                    "once the regional vCPU quota for the VM family is raised."),
    resource_policy(
        "azure-slurm-partition-queue-scale-to-zero",
        "Queue (non-gang) Slurm partitions power every node down when no job needs it.",
        types=[AZ_PARTITION], severity="medium", frameworks=_GPU, check=check_partition_scale_to_zero,
        mandatory=False,
        remediation="Set the partition's nodes.min 0 (alwaysOn 0) so an idle queue partition holds no GPU VM."),
    stack_policy(
        "azure-slurm-partition-monthly-ceiling",
        "The stack's Slurm partitions at their maximum size stay under the monthly cost ceiling.",
        severity="low", frameworks=["gpufleet-cost"], check=monthly_ceiling(AZ_PARTITION), mandatory=False,
        config=_CEILING,
        remediation="Lower the partitions' nodes.max, use spot capacity (a smaller onDemandBase) or a cheaper size, "
                    "or raise budgetMonthlyUsd."),
]
