"""Monthly cost estimate of a stack from list prices: pure arithmetic on the validated config.

Model (per month of ``HOURS_PER_MONTH`` hours, in the currency of the cloud's list prices: USD on AWS and
Azure, CNY on Tencent Cloud; ``currency`` names it), for ``nodes.min``, ``nodes.desired`` and ``nodes.max``:
- A node is its instance plus its boot disk (billed while the node exists, spot or not).
- Two columns side by side. on-demand: every node at the primary type's on-demand price (the
  autoscaling group launches on-demand capacity in the order of the type list, primary first).
  spot: the first ``onDemandBase`` nodes on-demand, the rest at the lowest planning spot price of the
  listed types (price-capacity-optimized favours the cheapest pools with capacity: the low end).
- ``monthly_usd``: the column the stack's ``spot`` setting selects, plus fixed items billed whatever
  the node count (AWS: KMS key, dashboard, VPC interface endpoints per AZ, ECR's among them; Azure: the
  Premium container registry and the Key Vault, each with its private endpoint and private DNS zone (a
  standard vault bills per operation only); Tencent: the KMS key), each with
  its unit price.
- Amounts keep their ``_usd`` key names whatever ``currency`` is, so that a preview diffs against one
  written before other currencies existed; a Tencent stack's amounts are CNY.
- Not included: usage-based charges (storage used, requests, data transfer, endpoint data processing,
  log and metric ingestion, alarms, registry storage beyond what a tier includes).
Instance prices are the catalog's reference-region list prices of ``catalog.PRICE_DATE``; the other unit
prices below are list prices of the same reference regions. None is a quote for the stack's region.
The Tencent unit prices, like the Tencent instance prices, were entered by hand (see ``infra.catalog``).
"""
from __future__ import annotations

from infra import catalog
from infra.config import StackConfig

HOURS_PER_MONTH = 730
LEVELS = ("min", "desired", "max")
# AWS list prices, us-east-1.
KMS_KEY_MONTH = 1.00                 # per customer managed key
DASHBOARD_MONTH = 3.00               # per CloudWatch dashboard (an account's first three are free)
ENDPOINT_AZ_HOUR = 0.01              # per interface VPC endpoint per AZ
GP3_GB_MONTH = 0.08                  # gp3 storage; the baseline 3000 IOPS / 125 MB/s are included
# Azure list prices, eastus: Premium SSD managed disks bill by tier, the smallest holding the size.
PREMIUM_SSD_TIERS = ((128, "P10", 19.71), (256, "P15", 38.02), (512, "P20", 73.22), (1024, "P30", 135.17))
ACR_PREMIUM_DAY = 1.667              # Premium container registry per day (the tier private endpoints need)
PRIVATE_ENDPOINT_HOUR = 0.01         # per private endpoint
PRIVATE_DNS_ZONE_MONTH = 0.50        # per hosted private DNS zone
# What the stacks create (tests/infra/review check these against the stacks' previews).
AWS_ROOT_VOLUME_GIB = 200            # per node, gp3
AWS_INTERFACE_ENDPOINTS = 10         # services with an interface endpoint in the stack's own VPC
AWS_QUEUE_MODE_AZS = 3               # subnets (AZs) in queue mode; gang mode uses one
AZURE_OS_DISK_GB = 256               # per node, Premium SSD
# Tencent list prices (CNY), ap-guangzhou.
TENCENT_SYSTEM_DISK_GB = 200         # per node, Premium Cloud Disk (CLOUD_PREMIUM)
CLOUD_PREMIUM_GB_MONTH = 0.35
TENCENT_KMS_KEY_MONTH = 3.00         # per customer master key
EXCLUDED = ("usage-based charges: storage used, requests, data transfer, endpoint data processing, "
            "log and metric ingestion, alarms, registry storage beyond what a tier includes")
TENCENT_EXCLUDED = ("usage-based charges: COS storage and requests, data transfer, CLS log ingestion, TDMQ CMQ "
                    "requests, invocations of the scaler function")


def _money(x: float) -> float:
    return round(x, 2)


def node_prices(cfg: StackConfig) -> dict:
    """On-demand (primary type) and spot (cheapest listed type) hourly instance prices."""
    primary = cfg.primary
    rows = [catalog.CATALOG[name] for name in cfg.instance_types]
    cheapest = min(rows, key=lambda t: t.spot_price_hour)  # min keeps the first of equal prices
    return {
        "on_demand": {"instance_type": primary.name, "usd_hour": primary.price_hour, "basis": "primary type"},
        "spot": {"instance_type": cheapest.name, "usd_hour": cheapest.spot_price_hour,
                 "basis": "primary type" if len(rows) == 1 else "cheapest of the listed types"},
    }


def node_disk(cfg: StackConfig) -> dict:
    """The boot disk every node carries, with its monthly price."""
    if cfg.cloud == "aws":
        return {"item": f"root volume {AWS_ROOT_VOLUME_GIB} GiB gp3",
                "usd_month": _money(AWS_ROOT_VOLUME_GIB * GP3_GB_MONTH)}
    if cfg.cloud == "tencent":
        return {"item": f"system disk {TENCENT_SYSTEM_DISK_GB} GB Premium Cloud Disk",
                "usd_month": _money(TENCENT_SYSTEM_DISK_GB * CLOUD_PREMIUM_GB_MONTH)}
    _, tier, price = next(t for t in PREMIUM_SSD_TIERS if t[0] >= AZURE_OS_DISK_GB)
    return {"item": f"OS disk {AZURE_OS_DISK_GB} GiB Premium SSD ({tier})", "usd_month": price}


def fixed_items(cfg: StackConfig) -> list[dict]:
    """Resources billed per month whatever the node count."""
    if cfg.cloud == "tencent":
        return _rows([("KMS customer master key", 1, TENCENT_KMS_KEY_MONTH)])
    if cfg.cloud == "azure":
        items = [("Container Registry, Premium tier", 1, ACR_PREMIUM_DAY * HOURS_PER_MONTH / 24),
                 ("private endpoint (registry)", 1, PRIVATE_ENDPOINT_HOUR * HOURS_PER_MONTH),
                 ("private DNS zone (privatelink.azurecr.io)", 1, PRIVATE_DNS_ZONE_MONTH),
                 ("private endpoint (Key Vault)", 1, PRIVATE_ENDPOINT_HOUR * HOURS_PER_MONTH),
                 ("private DNS zone (privatelink.vaultcore.azure.net)", 1, PRIVATE_DNS_ZONE_MONTH)]
        return _rows(items)
    items = [("KMS customer managed key", 1, KMS_KEY_MONTH), ("CloudWatch dashboard", 1, DASHBOARD_MONTH)]
    if cfg.network is None:  # the stack's own VPC: interface endpoints instead of a NAT gateway
        azs = 1 if cfg.mode == "gang" else AWS_QUEUE_MODE_AZS
        items.append((f"interface VPC endpoints ({AWS_INTERFACE_ENDPOINTS} services × {azs} AZ)",
                      AWS_INTERFACE_ENDPOINTS * azs, ENDPOINT_AZ_HOUR * HOURS_PER_MONTH))
    return _rows(items)


def _rows(items: list[tuple[str, int, float]]) -> list[dict]:
    return [{"item": item, "quantity": qty, "usd_month_each": _money(each), "monthly_usd": _money(qty * each)}
            for item, qty, each in items]


def node_month(count: int, on_demand_base: int, od_hour: float, spot_hour: float, disk_month: float = 0.0
               ) -> dict[str, float]:
    """Month of `count` nodes: all on-demand, and with spot above the on-demand base (disks in both)."""
    base = min(count, on_demand_base)
    disks = count * disk_month
    return {
        "on_demand_usd": count * od_hour * HOURS_PER_MONTH + disks,
        "spot_usd": (base * od_hour + (count - base) * spot_hour) * HOURS_PER_MONTH + disks,
    }


def estimate(cfg: StackConfig) -> dict:
    """The preview's ``cost`` document; see the module docstring for the model."""
    prices, disk, fixed = node_prices(cfg), node_disk(cfg), fixed_items(cfg)
    fixed_total = sum(f["monthly_usd"] for f in fixed)
    chosen = "spot_usd" if cfg.spot else "on_demand_usd"
    rows, monthly = {}, {}
    for level in LEVELS:
        count = getattr(cfg.nodes, level)
        month = node_month(count, cfg.on_demand_base, prices["on_demand"]["usd_hour"], prices["spot"]["usd_hour"],
                           disk["usd_month"])
        rows[level] = {"nodes": count, **{k: _money(v) for k, v in month.items()}}
        monthly[level] = _money(month[chosen] + fixed_total)

    limit = cfg.budget_monthly
    return {
        "currency": cfg.currency,
        "hours_per_month": HOURS_PER_MONTH,
        "price_date": catalog.PRICE_DATE,
        "price_region": catalog.PRICE_REGION[cfg.cloud],
        "region": cfg.region,
        "purchase": "spot" if cfg.spot else "on-demand",
        "on_demand_base": cfg.on_demand_base,
        "prices": prices,
        "node_disk": disk,
        "rows": rows,
        "fixed": fixed,
        "fixed_monthly_usd": _money(fixed_total),
        "monthly_usd": monthly,
        "budget": {
            "monthly_usd": limit,
            "within_at_desired": monthly["desired"] <= limit,
            "within_at_max": monthly["max"] <= limit,
            "headroom_at_max_usd": _money(limit - monthly["max"]),
            "used_at_max_pct": round(100.0 * monthly["max"] / limit, 1),
        },
        "excluded": TENCENT_EXCLUDED if cfg.cloud == "tencent" else EXCLUDED,
    }
