"""Monthly cost estimate of a Slurm stack from list prices: pure arithmetic on the validated config.

Model (per month of ``HOURS_PER_MONTH`` hours, in the currency of the cloud's list prices: USD on AWS and
Azure, CNY on Tencent Cloud; ``currency`` names it). GPU nodes are Slurm CLOUD nodes: powered up when jobs need
them and down when idle, so a stack has two sizes worth pricing:
- ``idle``: the fixed items plus each partition's always-on nodes (``nodes.min``, never powered down);
- ``full``: the fixed items plus every partition at ``nodes.max``.
- ``fixed``: billed whatever the node count: the controller (always on, on demand) and its boot disk, the
  shared file systems where they are provisioned (Azure Files premium bills each share's provisioned size), and
  the per-cloud items, each with its unit price. AWS: the munge key's Secrets Manager secret, KMS key, dashboard,
  VPC interface endpoints per AZ (ECR's among them). Azure: the two premium NFS shares (home, slurm-state) and
  their private endpoint and private DNS zone; the controller subnet's NAT gateway and its Standard static public
  IP; the Premium container registry and the Key Vault, each with its private endpoint and private DNS zone (a
  standard vault bills per operation only). Tencent: the KMS key (launch templates are free; the CFS file
  systems bill what they store: usage).
- A node is its instance plus its boot disk (billed while the node exists, spot or not). A partition's nodes
  ``<name>-1..<name>-<onDemandBase>`` run on demand, the rest as its ``spot`` says: on-demand at the primary
  type's price (the node provider launches the type list in order, primary first), spot at the lowest planning
  spot price of the listed types (the providers favour the cheapest pools with capacity: the low end).
- ``usage``: usage-based items that a stack cannot do without (the shared file systems' storage on AWS and
  Tencent, the queries the DNS firewall of an AWS stack's own VPC processes, the data the Azure controller's NAT
  gateway processes), listed with their unit price and not summed:
  the bill depends on what users store and what the controller sends.
- Amounts keep their ``_usd`` key names whatever ``currency`` is, so that a preview diffs against one
  written before other currencies existed; a Tencent stack's amounts are CNY.
- Not included (``excluded``): the other usage-based charges (storage used, requests, data transfer, endpoint
  data processing, log and metric ingestion, registry storage beyond what a tier includes) and the alarms on
  every cloud: AWS's CloudWatch alarms, Azure's metric alert (the controller down), Tencent's Cloud Monitor alarm
  policies; each cloud's ``excluded`` names them.
Instance prices are the catalog's reference-region list prices of ``catalog.PRICE_DATE``; the other unit
prices below are list prices of the same reference regions. None is a quote for the stack's region. Each unit
price says where it was checked, or "unverified": written from memory, to be refreshed against the provider's
price page. The Tencent unit prices, like the Tencent instance prices, were entered by hand (see
``infra.catalog``).
"""
from __future__ import annotations

from infra import catalog
from infra.config import Partition, StackConfig

HOURS_PER_MONTH = 730
SIZES = ("idle", "full")

# --- AWS list prices, us-east-1 ----------------------------------------------------------------------------
KMS_KEY_MONTH = 1.00                 # per customer managed key (unverified)
DASHBOARD_MONTH = 3.00               # per CloudWatch dashboard; an account's first three are free (unverified)
ENDPOINT_AZ_HOUR = 0.01              # per interface VPC endpoint per AZ (unverified)
GP3_GB_MONTH = 0.08                  # gp3 storage; the baseline 3000 IOPS / 125 MB/s are included (unverified)
# $0.40 per secret per month, prorated (https://aws.amazon.com/secrets-manager/pricing/, as transcribed in
# api-evangelist/amazon-secrets-manager plans/amazon-secrets-manager-plans-pricing.yml); API calls are usage.
SECRET_MONTH = 0.40
# EFS Standard storage, $0.30 per GB-month (https://aws.amazon.com/efs/pricing/). Usage-based: not summed.
EFS_STANDARD_GB_MONTH = 0.30
# Route 53 Resolver DNS Firewall: $0.60 per million queries processed (first billion a month) and $0.0005 per
# domain name per month (https://aws.amazon.com/route53/pricing/, as transcribed in api-evangelist/amazon-route53-
# resolver plans/amazon-route53-resolver-plans-pricing.yml, read 2026-09-20). The queries are usage: listed, not
# summed. The stack's DNS_FIREWALL_DOMAINS domain names cost $0.0015 a month, under the cent the estimate counts
# in: not listed.
DNS_FIREWALL_MILLION_QUERIES = 0.60
# --- Azure list prices, eastus ------------------------------------------------------------------------------
# Premium SSD managed disks bill by tier, the smallest holding the size. P6 (64 GiB) is unverified; it agrees
# with a third-party table of East US list prices that also carries the P10-P30 prices below.
PREMIUM_SSD_TIERS = ((64, "P6", 10.21), (128, "P10", 19.71), (256, "P15", 38.02), (512, "P20", 73.22),
                     (1024, "P30", 135.17))
ACR_PREMIUM_DAY = 1.667              # Premium container registry per day (the tier private endpoints need) (unverified)
# $0.01 per private endpoint-hour (Azure Retail Prices API, "Virtual Network Private Link", Standard Private
# Endpoint, as transcribed in api-evangelist/microsoft-azure-private-link plans/...-plans-pricing.yml, read
# 2026-09-17). Its data processed ($0.01/GB) is usage, not summed (in ``excluded``).
PRIVATE_ENDPOINT_HOUR = 0.01
PRIVATE_DNS_ZONE_MONTH = 0.50        # per hosted private DNS zone (unverified)
# NAT gateway (Standard): $0.045 per gateway-hour and $0.045 per GB processed (East US; c3x.dev's
# azurerm_nat_gateway page, a third-party transcription of the list price: not checked against Microsoft's own
# page). The GB processed is usage: listed, not summed.
NAT_GATEWAY_HOUR = 0.045
NAT_GATEWAY_GB = 0.045
# Standard static public IPv4: $0.005 per hour, attached or not (East US; c3x.dev's azurerm_public_ip page and
# ChiefGyk3D/Clouds-Against-Humanity's "Azure cost lesson", read from the Azure Retail Prices API 2026-10-16:
# third-party transcriptions that agree).
PUBLIC_IP_STANDARD_HOUR = 0.005
# Azure Files premium (SSD, provisioned v1, LRS): billed per provisioned GiB-month whatever is stored, 100 GiB at
# least (the minimum premium share: learn.microsoft.com/azure/storage/files/understanding-billing). The price per
# GiB-month is unverified.
AZURE_FILES_PREMIUM_GIB_MONTH = 0.16
# --- Tencent Cloud list prices (CNY), ap-guangzhou ----------------------------------------------------------
CLOUD_PREMIUM_GB_MONTH = 0.35        # Premium Cloud Disk (CLOUD_PREMIUM) per GB-month (unverified)
TENCENT_KMS_KEY_MONTH = 3.00         # per customer master key (unverified)
# CFS general-purpose Standard storage per GiB-month, billed on the hourly peak of what is stored (billing
# model: tencentcloud.com/document/product/582/9553). The CNY price is unverified. Usage-based: not summed.
CFS_STANDARD_GB_MONTH = 0.35

# --- what the stacks create (tests/infra/review check these against the stacks' previews) -------------------
AWS_ROOT_VOLUME_GIB = 200            # per node, gp3 (infra/aws/partition.py ROOT_VOLUME_GIB)
AWS_CONTROLLER_ROOT_GIB = 50         # the controller's root volume, gp3 (infra/aws/controller.py ROOT_VOLUME_GIB)
AWS_INTERFACE_ENDPOINTS = 11         # services with an interface endpoint in the stack's own VPC
AWS_QUEUE_MODE_AZS = 3               # subnets (AZs) unless every partition is a gang; then one
DNS_FIREWALL_DOMAINS = 3             # the allowed domains and the "*" blocked (infra/aws/dns_firewall.py)
AZURE_OS_DISK_GB = 256               # per node, Premium SSD
AZURE_CONTROLLER_OS_DISK_GB = 64     # the controller's OS disk, Premium SSD (P6)
AZURE_FILES_SHARE_GIB = 100          # each NFS share's provisioned size (the premium minimum)
AZURE_FILES_SHARES = 2               # home and slurm-state, on one FileStorage account (infra/azure/shared_fs.py)
TENCENT_SYSTEM_DISK_GB = 200         # per node, Premium Cloud Disk (CLOUD_PREMIUM)
TENCENT_CONTROLLER_SYSTEM_DISK_GB = 50  # the controller's system disk, Premium Cloud Disk
TENCENT_CFS_FILE_SYSTEMS = 2         # home and slurm state, each CFS Standard (infra/tencent/shared_fs.py)

EXCLUDED = {
    "aws": "usage-based charges: storage used (S3, EFS at the price listed, EFS Infrequent Access, backups), "
           "requests, data transfer, EFS elastic throughput, endpoint data processing, log and metric ingestion, "
           "registry storage, Secrets Manager API calls; the CloudWatch alarms",
    "azure": "usage-based charges: storage used (blobs, registry storage beyond what the tier includes), "
             "requests, data transfer, NAT gateway data processed at the price listed, private endpoint data "
             "processing, private DNS queries, the DNS security policy's queries and their log's Log Analytics "
             "ingestion and retention (prices not known here), log and metric ingestion, Key Vault operations; the "
             "metric alert rule (the controller down, billed per monitored time series) and its action group's "
             "notifications",
    "tencent": "usage-based charges: COS storage and requests, CFS storage at the price listed, data transfer, CLS "
               "log ingestion, TDMQ CMQ requests; the Cloud Monitor alarm policies and their notifications; the "
               "munge key's SSM secret (billed per secret; the international site lists 0.4 USD per "
               "secret-month, its CNY list price is not known here)",
}


def _money(x: float) -> float:
    return round(x, 2)


def node_prices(part: Partition) -> dict:
    """A partition's hourly instance prices: on-demand (its primary type) and spot (its cheapest listed type)."""
    primary = part.primary
    rows = [catalog.CATALOG[name] for name in part.instance_types]
    cheapest = min(rows, key=lambda t: t.spot_price_hour)  # min keeps the first of equal prices
    return {
        "on_demand": {"instance_type": primary.name, "usd_hour": primary.price_hour, "basis": "primary type"},
        "spot": {"instance_type": cheapest.name, "usd_hour": cheapest.spot_price_hour,
                 "basis": "primary type" if len(rows) == 1 else "cheapest of the listed types"},
    }


def _premium_ssd(size_gb: int) -> tuple[str, float]:
    _, tier, price = next(t for t in PREMIUM_SSD_TIERS if t[0] >= size_gb)
    return tier, price


def node_disk(cfg: StackConfig) -> dict:
    """The boot disk every GPU node carries, with its monthly price."""
    if cfg.cloud == "aws":
        return {"item": f"root volume {AWS_ROOT_VOLUME_GIB} GiB gp3",
                "usd_month": _money(AWS_ROOT_VOLUME_GIB * GP3_GB_MONTH)}
    if cfg.cloud == "tencent":
        return {"item": f"system disk {TENCENT_SYSTEM_DISK_GB} GB Premium Cloud Disk",
                "usd_month": _money(TENCENT_SYSTEM_DISK_GB * CLOUD_PREMIUM_GB_MONTH)}
    tier, price = _premium_ssd(AZURE_OS_DISK_GB)
    return {"item": f"OS disk {AZURE_OS_DISK_GB} GiB Premium SSD ({tier})", "usd_month": price}


def controller_items(cfg: StackConfig) -> list[tuple[str, int, float]]:
    """The controller (always on, on demand) and its boot disk."""
    ctl = cfg.controller_type
    items = [(f"controller {ctl.name} (on-demand)", 1, ctl.price_hour * HOURS_PER_MONTH)]
    if cfg.cloud == "aws":
        items.append((f"controller root volume {AWS_CONTROLLER_ROOT_GIB} GiB gp3", 1,
                      AWS_CONTROLLER_ROOT_GIB * GP3_GB_MONTH))
    elif cfg.cloud == "azure":
        tier, price = _premium_ssd(AZURE_CONTROLLER_OS_DISK_GB)
        items.append((f"controller OS disk {AZURE_CONTROLLER_OS_DISK_GB} GiB Premium SSD ({tier})", 1, price))
    else:
        items.append((f"controller system disk {TENCENT_CONTROLLER_SYSTEM_DISK_GB} GB Premium Cloud Disk", 1,
                      TENCENT_CONTROLLER_SYSTEM_DISK_GB * CLOUD_PREMIUM_GB_MONTH))
    return items


def fixed_items(cfg: StackConfig) -> list[dict]:
    """Resources billed per month whatever the node count, the controller first."""
    items = controller_items(cfg)
    if cfg.cloud == "tencent":
        items.append(("KMS customer master key", 1, TENCENT_KMS_KEY_MONTH))
    elif cfg.cloud == "azure":
        items += [(f"Azure Files premium NFS share ({AZURE_FILES_SHARE_GIB} GiB provisioned)", AZURE_FILES_SHARES,
                   AZURE_FILES_SHARE_GIB * AZURE_FILES_PREMIUM_GIB_MONTH),
                  ("private endpoint (Azure Files)", 1, PRIVATE_ENDPOINT_HOUR * HOURS_PER_MONTH),
                  ("private DNS zone (privatelink.file.core.windows.net)", 1, PRIVATE_DNS_ZONE_MONTH),
                  ("NAT gateway (the controller subnet's outbound path)", 1, NAT_GATEWAY_HOUR * HOURS_PER_MONTH),
                  ("public IP address, Standard static (the NAT gateway's)", 1,
                   PUBLIC_IP_STANDARD_HOUR * HOURS_PER_MONTH),
                  ("Container Registry, Premium tier", 1, ACR_PREMIUM_DAY * HOURS_PER_MONTH / 24),
                  ("private endpoint (registry)", 1, PRIVATE_ENDPOINT_HOUR * HOURS_PER_MONTH),
                  ("private DNS zone (privatelink.azurecr.io)", 1, PRIVATE_DNS_ZONE_MONTH),
                  ("private endpoint (Key Vault)", 1, PRIVATE_ENDPOINT_HOUR * HOURS_PER_MONTH),
                  ("private DNS zone (privatelink.vaultcore.azure.net)", 1, PRIVATE_DNS_ZONE_MONTH)]
    else:
        items += [("Secrets Manager secret (munge key)", 1, SECRET_MONTH),
                  ("KMS customer managed key", 1, KMS_KEY_MONTH), ("CloudWatch dashboard", 1, DASHBOARD_MONTH)]
        if cfg.network is None:  # the stack's own VPC: interface endpoints instead of a NAT gateway
            azs = 1 if cfg.all_gang else AWS_QUEUE_MODE_AZS
            items.append((f"interface VPC endpoints ({AWS_INTERFACE_ENDPOINTS} services × {azs} AZ)",
                          AWS_INTERFACE_ENDPOINTS * azs, ENDPOINT_AZ_HOUR * HOURS_PER_MONTH))
    return [{"item": item, "quantity": qty, "usd_month_each": _money(each), "monthly_usd": _money(qty * each)}
            for item, qty, each in items]


def usage_items(cfg: StackConfig) -> list[dict]:
    """Usage-based items with their unit price (not summed: the bill depends on what is stored and sent)."""
    if cfg.cloud == "aws":
        items = [{"item": "EFS Standard storage (shared file system)", "unit": "GB-month",
                  "usd_each": EFS_STANDARD_GB_MONTH}]
        if cfg.network is None:  # the stack's own VPC has its DNS firewall
            items.append({"item": "DNS Firewall queries (the stack's VPC)", "unit": "million queries",
                          "usd_each": DNS_FIREWALL_MILLION_QUERIES})
        return items
    if cfg.cloud == "tencent":
        return [{"item": f"CFS Standard storage ({TENCENT_CFS_FILE_SYSTEMS} file systems: home, slurm state)",
                 "unit": "GiB-month", "usd_each": CFS_STANDARD_GB_MONTH}]
    # Azure: the Files shares are provisioned (fixed items); the NAT gateway bills what it processes
    return [{"item": "NAT gateway data processed (the controller's calls to Azure Resource Manager)", "unit": "GB",
             "usd_each": NAT_GATEWAY_GB}]


def nodes_month(count: int, on_demand_base: int, spot: bool, od_hour: float, spot_hour: float,
                disk_month: float = 0.0) -> float:
    """A month of `count` nodes: the first `on_demand_base` on demand, the rest on spot when `spot` (else on
    demand too), each with its disk."""
    base = count if not spot else min(count, on_demand_base)
    return (base * od_hour + (count - base) * spot_hour) * HOURS_PER_MONTH + count * disk_month


def partition_cost(part: Partition, disk: dict) -> dict:
    """One partition's prices and its month at idle (the always-on nodes) and at full size (nodes.max)."""
    prices = node_prices(part)
    od, sp = prices["on_demand"]["usd_hour"], prices["spot"]["usd_hour"]

    def month(count: int) -> float:
        return _money(nodes_month(count, part.on_demand_base, part.spot, od, sp, disk["usd_month"]))

    return {"name": part.name, "nodes_max": part.nodes.max, "always_on": part.nodes.min,
            "purchase": "spot" if part.spot else "on-demand", "on_demand_base": part.on_demand_base,
            "prices": prices, "node_disk": disk,
            "idle_usd": month(part.nodes.min), "full_usd": month(part.nodes.max)}


def estimate(cfg: StackConfig) -> dict:
    """The preview's ``cost`` document; see the module docstring for the model."""
    fixed, disk = fixed_items(cfg), node_disk(cfg)
    fixed_total = _money(sum(f["monthly_usd"] for f in fixed))
    parts = [partition_cost(p, disk) for p in cfg.partitions]
    # The totals add the amounts the document shows, so that a reader's sum matches to the cent.
    monthly = {size: _money(fixed_total + sum(p[f"{size}_usd"] for p in parts)) for size in SIZES}
    limit = cfg.budget_monthly
    return {
        "currency": cfg.currency,
        "hours_per_month": HOURS_PER_MONTH,
        "price_date": catalog.PRICE_DATE,
        "price_region": catalog.PRICE_REGION[cfg.cloud],
        "region": cfg.region,
        "fixed": fixed,
        "fixed_monthly_usd": fixed_total,
        "usage": usage_items(cfg),
        "partitions": parts,
        "monthly_usd": monthly,
        "budget": {
            "monthly_usd": limit,
            "within_when_idle": monthly["idle"] <= limit,
            "within_at_full": monthly["full"] <= limit,
            "headroom_at_full_usd": _money(limit - monthly["full"]),
            "used_at_full_pct": round(100.0 * monthly["full"] / limit, 1),
        },
        "excluded": EXCLUDED[cfg.cloud],
    }
