"""GPU cluster guardrails: EFA layout and security groups, cluster placement, spot handling, quota, scale-to-zero.

Instance facts (GPUs, EFA interfaces) come from `infra.catalog`. Auto scaling groups, launch templates,
placement groups, security groups and lifecycle hooks are linked through property dependencies.
"""
from __future__ import annotations

from infra.catalog import CATALOG
from policies.common import (UNKNOWN, Resource, Stack, flag, get, items, number, resource_policy, stack_policy,
                             stack_value)
from policies.tokens import (ASG, AZ_AUTOSCALE, AZ_VMSS, LAUNCH_TEMPLATE, LIFECYCLE_HOOK, PLACEMENT_GROUP,
                            SECURITY_GROUP, SG_EGRESS_RULE, SG_INGRESS_RULE, SG_RULE)

EFA_KINDS = ("efa", "efa-only")
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
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


def monthly_max_usd(instance_types: list[str], max_nodes: float, spot: bool) -> float:
    """Worst-case monthly cost of a group at its maximum size, priced by its dearest type."""
    rows = [CATALOG[t] for t in instance_types if t in CATALOG]
    if not rows:
        return 0.0
    hourly = max(r.spot_price_hour if spot else r.price_hour for r in rows)
    return hourly * max_nodes * 730


# --- linking ---------------------------------------------------------------------------------------

def templates_of(stack: Stack, asg: Resource) -> list[Resource]:
    return stack.targets(asg, [LAUNCH_TEMPLATE], "launchTemplate", "mixedInstancesPolicy")


def groups_of(stack: Stack, template: Resource) -> list[Resource]:
    return stack.referrers(template, [ASG], "launchTemplate", "mixedInstancesPolicy")


def group_types(stack: Stack, asg: Resource) -> list[str]:
    overrides = items(get(asg.props, "mixedInstancesPolicy", "launchTemplate", "overrides", default=[]))
    types = [get(o, "instanceType") for o in overrides]
    types += [t.props.get("instanceType") for t in templates_of(stack, asg)]
    return [t for t in dict.fromkeys(types) if isinstance(t, str)]


def template_types(stack: Stack, template: Resource) -> list[str]:
    types = [template.props.get("instanceType")]
    for asg in groups_of(stack, template):
        types += group_types(stack, asg)
    return [t for t in dict.fromkeys(types) if isinstance(t, str)]


def efa_nics(template: Resource) -> list:
    return [n for n in items(template.props.get("networkInterfaces")) if get(n, "interfaceType") in EFA_KINDS]


def is_spot(stack: Stack, asg: Resource) -> bool:
    share = number(get(asg.props, "mixedInstancesPolicy", "instancesDistribution",
                       "onDemandPercentageAboveBaseCapacity"))
    if get(asg.props, "mixedInstancesPolicy") is not None and share is not None and share < 100:
        return True
    return any(get(t.props, "instanceMarketOptions", "marketType") == "spot" for t in templates_of(stack, asg))


# --- checks ----------------------------------------------------------------------------------------

def check_efa_layout(stack: Stack, ctx):
    gang = stack_value("gpufleet:mode") == "gang"
    for template in stack.of(LAUNCH_TEMPLATE):
        nics = template.props.get("networkInterfaces")
        if nics is UNKNOWN:
            continue
        for instance_type in template_types(stack, template):
            for problem in efa_layout_problems(instance_type, items(nics)):
                yield f"launch template '{template.name}': {problem}", template.urn
            row = CATALOG.get(instance_type)
            multi = any((number(g.props.get("maxSize")) or 0) > 1 for g in groups_of(stack, template))
            if gang and multi and row is not None and row.efa and not efa_nics(template):
                yield (f"launch template '{template.name}': multi-node gang group on {instance_type} "
                       f"attaches none of its {row.max_efa} EFA interfaces"), template.urn


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


def uses_efa(stack: Stack, asg: Resource) -> bool:
    """The group's nodes talk over EFA: its launch template attaches EFA interfaces or, with the template
    outside this stack, its instance types have EFA."""
    templates = templates_of(stack, asg)
    if templates:
        return any(efa_nics(t) for t in templates)
    return any(CATALOG[t].efa for t in group_types(stack, asg) if t in CATALOG)


def check_efa_cluster(stack: Stack, ctx):
    if stack_value("gpufleet:mode") == "queue":  # independent single-node jobs: no collective traffic
        return
    for asg in stack.of(ASG):
        max_size = number(asg.props.get("maxSize"))
        if max_size is None or max_size <= 1 or not uses_efa(stack, asg):
            continue
        groups = stack.targets(asg, [PLACEMENT_GROUP], "placementGroup")
        if asg.props.get("placementGroup") is None:
            yield f"multi-node EFA group '{asg.name}' has no placement group", asg.urn
        for group in groups:
            if group.props.get("strategy") not in ("cluster", UNKNOWN):
                yield (f"placement group '{group.name}' of '{asg.name}' uses strategy "
                       f"{group.props.get('strategy')}, not cluster"), asg.urn
        subnets, zones = asg.props.get("vpcZoneIdentifiers"), asg.props.get("availabilityZones")
        for label, value in (("subnets", subnets), ("availability zones", zones)):
            if isinstance(value, list) and len(value) > 1:
                yield (f"multi-node EFA group '{asg.name}' spans {len(value)} {label}; "
                       f"EFA needs one subnet in one AZ"), asg.urn


def check_spot_lifecycle(stack: Stack, ctx):
    for asg in stack.of(ASG):
        if not any(t in CATALOG for t in group_types(stack, asg)) or not is_spot(stack, asg):
            continue
        if asg.props.get("capacityRebalance") is not UNKNOWN and flag(asg.props.get("capacityRebalance")) is not True:
            yield f"spot GPU group '{asg.name}' does not enable capacityRebalance", asg.urn
        if asg.props.get("initialLifecycleHooks") is UNKNOWN:
            continue
        hooks = [h for h in items(asg.props.get("initialLifecycleHooks")) if isinstance(h, dict)]
        hooks += [h.props for h in stack.referrers(asg, [LIFECYCLE_HOOK], "autoscalingGroupName")]
        if not any(h.get("lifecycleTransition") == TERMINATING for h in hooks):
            yield f"spot GPU group '{asg.name}' has no {TERMINATING} lifecycle hook to checkpoint before shutdown", asg.urn


def _autoscale_capacity(stack: Stack, vmss: Resource, bound: str) -> list[float]:
    settings = stack.referrers(vmss, [AZ_AUTOSCALE], "targetResourceUri")
    return [number(get(p, "capacity", bound)) for s in settings for p in items(s.props.get("profiles"))]


def group_sizes(stack: Stack, group_type: str) -> list[tuple[Resource, list[str], float]]:
    """(group, instance types, maximum node count) for every ASG or VMSS whose size is known."""
    out = []
    for asg in stack.of(ASG) if group_type == ASG else []:
        size = number(asg.props.get("maxSize"))
        if size is not None:
            out.append((asg, group_types(stack, asg), size))
    for vmss in stack.of(AZ_VMSS) if group_type == AZ_VMSS else []:
        sizes = [s for s in _autoscale_capacity(stack, vmss, "maximum") if s is not None]
        sizes.append(number(get(vmss.props, "sku", "capacity")) or 0)
        sku = get(vmss.props, "sku", "name")
        out.append((vmss, [sku] if isinstance(sku, str) else [], max(sizes)))
    return out


def _detail(groups) -> str:
    return ", ".join(f"{g.name}: {size:g} x {'/'.join(types)}" for g, types, size in groups)


def gpu_quota(group_type: str):
    def check(stack: Stack, ctx):
        groups = [(g, types, size) for g, types, size in group_sizes(stack, group_type)
                  if any(t in CATALOG for t in types)]
        total = sum(size * max(CATALOG[t].gpus for t in types if t in CATALOG) for _, types, size in groups)
        if total > ctx.config["maxGpus"]:
            yield (f"GPU groups can reach {total:g} GPUs, over the quota of {ctx.config['maxGpus']:g} "
                   f"({_detail(groups)})"), groups[0][0].urn
    return check


def check_queue_scale_to_zero(props: dict, ctx):
    if stack_value("gpufleet:mode") != "queue":
        return
    size = number(props.get("minSize"))
    if size is not None and size > 0:
        yield f"queue-mode group keeps minSize {size:g} nodes running when the queue is empty"


def check_vmss_scale_to_zero(stack: Stack, ctx):
    if stack_value("gpufleet:mode") != "queue":
        return
    for vmss in stack.of(AZ_VMSS):
        minimums = [m for m in _autoscale_capacity(stack, vmss, "minimum") if m is not None]
        floor = min(minimums) if minimums else number(get(vmss.props, "sku", "capacity"))
        if floor:
            yield f"queue-mode scale set '{vmss.name}' keeps at least {floor:g} nodes running", vmss.urn


def monthly_ceiling(group_type: str):
    def check(stack: Stack, ctx):
        ceiling = number(ctx.config.get("monthlyCeilingUsd") or stack_value("gpufleet:budgetMonthlyUsd"))
        if not ceiling:
            return
        spot = flag(stack_value("gpufleet:spot")) is True
        groups = group_sizes(stack, group_type)
        cost = sum(monthly_max_usd(types, size, spot) for _, types, size in groups)
        if cost > ceiling:
            yield (f"GPU groups at their maximum size cost about ${cost:,.0f}/month, over the "
                   f"${ceiling:,.0f} ceiling ({_detail(groups)})"), groups[0][0].urn
    return check


_QUOTA = {"maxGpus": {"type": "integer", "minimum": 0, "default": 64,
                      "description": "Most GPUs all groups of the stack may reach together."}}
POLICIES = [
    stack_policy(
        "aws-ec2-launchtemplate-efa-layout",
        "Launch templates attach either the instance type's full EFA set, one per network card, or none.",
        severity="high", frameworks=_GPU, check=check_efa_layout,
        remediation="Attach one interface per network card 0..N-1 (N = the type's EFA count): card 0 deviceIndex 0 "
                    "interfaceType 'efa', the others deviceIndex 1 'efa-only' (or 'efa'); derive them from infra.catalog."),
    stack_policy(
        "aws-ec2-securitygroup-efa-self-traffic",
        "Security groups on EFA interfaces allow all traffic in from and out to themselves.",
        severity="high", frameworks=_GPU, check=check_efa_security_group,
        remediation="Add an ingress and an egress rule with protocol '-1' referencing the security group itself "
                    "(self true, or SecurityGroupIngress/EgressRule with referencedSecurityGroupId)."),
    stack_policy(
        "aws-autoscaling-group-efa-cluster",
        "Multi-node EFA groups of gang stacks launch into one cluster placement group in one subnet.",
        severity="high", frameworks=_GPU, check=check_efa_cluster,
        remediation="Create an aws.ec2.PlacementGroup with strategy 'cluster', pass it as placementGroup, and give "
                    "the group exactly one subnet in vpcZoneIdentifiers."),
    stack_policy(
        "aws-autoscaling-group-spot-lifecycle",
        "Spot GPU groups rebalance capacity and hold a terminate lifecycle hook for the last checkpoint.",
        severity="medium", frameworks=_GPU, check=check_spot_lifecycle,
        remediation="Set capacityRebalance true and add an autoscaling:EC2_INSTANCE_TERMINATING lifecycle hook "
                    "(heartbeat long enough to write a checkpoint) that the trainer agent completes."),
    stack_policy(
        "aws-autoscaling-group-gpu-quota",
        "The stack's GPU groups together stay within the configured GPU quota.",
        severity="medium", frameworks=_GPU, check=gpu_quota(ASG), config=_QUOTA,
        remediation="Lower nodes.max or use a smaller type, or raise maxGpus in the policy config once the "
                    "EC2 service quota for the instance family is raised."),
    resource_policy(
        "aws-autoscaling-group-queue-scale-to-zero",
        "Queue-mode auto scaling groups can scale down to zero nodes.",
        types=[ASG], severity="medium", frameworks=_GPU, check=check_queue_scale_to_zero, mandatory=False,
        remediation="Set minSize 0 (nodes.min 0) so idle queue clusters cost nothing."),
    stack_policy(
        "azure-compute-vmss-queue-scale-to-zero",
        "Queue-mode scale sets can scale down to zero nodes.",
        severity="medium", frameworks=_GPU, check=check_vmss_scale_to_zero, mandatory=False,
        remediation="Give the scale set's autoscale profile capacity.minimum '0'."),
    stack_policy(
        "azure-compute-vmss-gpu-quota",
        "The stack's GPU scale sets together stay within the configured GPU quota.",
        severity="medium", frameworks=_GPU, check=gpu_quota(AZ_VMSS), config=_QUOTA,
        remediation="Lower nodes.max or raise maxGpus once the regional vCPU quota for the VM family is raised."),
    *[stack_policy(
        name,
        "The stack's GPU groups at their maximum size stay under the monthly cost ceiling.",
        severity="low", frameworks=["gpufleet-cost"], check=monthly_ceiling(group_type), mandatory=False,
        config={"monthlyCeilingUsd": {"type": "number", "minimum": 0,
                                      "description": "Monthly ceiling in USD; defaults to gpufleet:budgetMonthlyUsd."}},
        remediation="Lower nodes.max, use spot capacity or a cheaper type, or raise budgetMonthlyUsd.")
      for name, group_type in (("aws-autoscaling-group-monthly-ceiling", ASG),
                               ("azure-compute-vmss-monthly-ceiling", AZ_VMSS))],
]
