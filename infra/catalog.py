"""GPU instance catalog: hardware facts and reference prices for every type a stack may use.

Hardware facts for AWS rows match EC2 DescribeInstanceTypes (``python -m infra.catalog refresh``
re-reads them from any EC2 endpoint, moto server included, and reports differences). Prices are
on-demand hourly list prices in one reference region per cloud, in that cloud's currency
(``CURRENCY``: Tencent Cloud lists CNY), with the date they were read; ``SPOT_FACTOR`` is the
planning ratio of spot to on-demand used by the cost estimate.

Tencent rows: GN10Xp (V100 SXM2 32 GB, NVLink without NVSwitch), GN7 (T4, inference class) and GT4
(A100 SXM4 40 GB; the 8-GPU size has NVSwitch), private network bandwidth from the CVM instance-type
tables. Their pay-as-you-go prices (ap-guangzhou, CNY) were entered by hand and could not be checked
against the price list where this catalog was last edited: compare them with Tencent's CVM pricing page
before relying on them, as for every price here. None of these families has an RDMA fabric (the HCC
RDMA types need an HPC cluster, which Auto Scaling cannot place nodes in).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from infra import cli

PRICE_DATE = "2025-07-01"
PRICE_REGION = {"aws": "us-east-1", "azure": "eastus", "tencent": "ap-guangzhou"}
CURRENCY = {"aws": "USD", "azure": "USD", "tencent": "CNY"}
# Planning ratio spot/on-demand per GPU family: a long-run average, not a quote. Tencent bills spot
# instances at 3-20 % of pay-as-you-go for CPU and memory only; GPU capacity is scarcer, hence higher.
SPOT_FACTOR = {"g5": 0.40, "g6": 0.40, "g6e": 0.45, "p4d": 0.55, "p4de": 0.55, "p5": 0.60,
               "p5e": 0.60, "p5en": 0.60, "ndv4": 0.45, "ndv5": 0.55,
               "gn10xp": 0.35, "gn7": 0.30, "gt4": 0.45}


@dataclass(frozen=True)
class InstanceType:
    name: str
    cloud: str                 # "aws" | "azure" | "tencent"
    family: str                # key into SPOT_FACTOR
    gpus: int
    gpu_model: str
    gpu_memory_gib: int        # per GPU
    vcpus: int
    memory_gib: int
    network_cards: int         # AWS network cards (1 elsewhere)
    max_efa: int               # AWS EFA interfaces (0: no EFA)
    infiniband_gbps: int       # Azure InfiniBand bandwidth per node (0: none)
    nvswitch: bool             # NVSwitch: needs nvidia-fabricmanager
    local_nvme_gb: int
    price_hour: float          # on-demand, in CURRENCY[cloud], PRICE_REGION[cloud], PRICE_DATE
    network_gbps: float = 0.0  # private network bandwidth per node (Tencent rows; 0: not recorded)

    @property
    def efa(self) -> bool:
        return self.max_efa > 0

    @property
    def rdma(self) -> bool:
        """Has a multi-node RDMA fabric (EFA on AWS, InfiniBand on Azure)."""
        return self.max_efa > 0 or self.infiniband_gbps > 0

    @property
    def currency(self) -> str:
        return CURRENCY[self.cloud]

    @property
    def spot_price_hour(self) -> float:
        return round(self.price_hour * SPOT_FACTOR[self.family], 4)


def _aws(name, family, gpus, model, gmem, vcpus, mem, cards, efa, nvswitch, nvme, price):
    return InstanceType(name, "aws", family, gpus, model, gmem, vcpus, mem, cards, efa, 0,
                        nvswitch, nvme, price)


def _azure(name, family, gpus, model, gmem, vcpus, mem, ib, nvswitch, nvme, price):
    return InstanceType(name, "azure", family, gpus, model, gmem, vcpus, mem, 1, 0, ib,
                        nvswitch, nvme, price)


def _tencent(name, family, gpus, model, gmem, vcpus, mem, gbps, nvswitch, price):
    return InstanceType(name, "tencent", family, gpus, model, gmem, vcpus, mem, 1, 0, 0, nvswitch, 0, price, gbps)


_ROWS = [
    #    name              family gpus model  GiB vcpu  mem  cards efa nvsw  nvme GB  $/h
    _aws("g5.xlarge",      "g5",  1, "A10G",  24,   4,   16,  1,  0, False,   250,  1.006),
    _aws("g5.2xlarge",     "g5",  1, "A10G",  24,   8,   32,  1,  0, False,   450,  1.212),
    _aws("g5.4xlarge",     "g5",  1, "A10G",  24,  16,   64,  1,  0, False,   600,  1.624),
    _aws("g5.8xlarge",     "g5",  1, "A10G",  24,  32,  128,  1,  1, False,   900,  2.448),
    _aws("g5.12xlarge",    "g5",  4, "A10G",  24,  48,  192,  1,  1, False,  3800,  5.672),
    _aws("g5.24xlarge",    "g5",  4, "A10G",  24,  96,  384,  1,  1, False,  3800,  8.144),
    _aws("g5.48xlarge",    "g5",  8, "A10G",  24, 192,  768,  1,  1, False,  7600, 16.288),
    _aws("g6.xlarge",      "g6",  1, "L4",    24,   4,   16,  1,  0, False,   250,  0.8048),
    _aws("g6.2xlarge",     "g6",  1, "L4",    24,   8,   32,  1,  0, False,   450,  0.9776),
    _aws("g6.4xlarge",     "g6",  1, "L4",    24,  16,   64,  1,  0, False,   600,  1.3232),
    _aws("g6.8xlarge",     "g6",  1, "L4",    24,  32,  128,  1,  1, False,   900,  2.0144),
    _aws("g6.12xlarge",    "g6",  4, "L4",    24,  48,  192,  1,  1, False,  3760,  4.6016),
    _aws("g6.24xlarge",    "g6",  4, "L4",    24,  96,  384,  1,  1, False,  3760,  6.6752),
    _aws("g6.48xlarge",    "g6",  8, "L4",    24, 192,  768,  1,  1, False,  7520, 13.3504),
    _aws("g6e.xlarge",     "g6e", 1, "L40S",  48,   4,   32,  1,  0, False,   250,  1.861),
    _aws("g6e.2xlarge",    "g6e", 1, "L40S",  48,   8,   64,  1,  0, False,   450,  2.24208),
    _aws("g6e.12xlarge",   "g6e", 4, "L40S",  48,  48,  384,  1,  1, False,  3800, 10.49264),
    _aws("g6e.24xlarge",   "g6e", 4, "L40S",  48,  96,  768,  2,  2, False,  3800, 15.06559),
    _aws("g6e.48xlarge",   "g6e", 8, "L40S",  48, 192, 1536,  4,  4, False,  7600, 30.13118),
    _aws("p4d.24xlarge",   "p4d", 8, "A100",  40,  96, 1152,  4,  4, True,   8000, 21.9576),
    _aws("p4de.24xlarge",  "p4de", 8, "A100", 80,  96, 1152,  4,  4, True,   8000, 27.447),
    _aws("p5.48xlarge",    "p5",  8, "H100",  80, 192, 2048, 32, 32, True,  30400, 55.04),
    _aws("p5e.48xlarge",   "p5e", 8, "H200", 141, 192, 2048, 32, 32, True,  30400, 61.54),
    _aws("p5en.48xlarge",  "p5en", 8, "H200", 141, 192, 2048, 16, 16, True, 30400, 63.296),
    #      name                           family gpus model GiB vcpu mem   IB Gb/s nvsw nvme GB  $/h
    _azure("Standard_ND96asr_v4",         "ndv4", 8, "A100", 40, 96,  900, 1600, True,  6000, 27.197),
    _azure("Standard_ND96amsr_A100_v4",   "ndv4", 8, "A100", 80, 96, 1900, 1600, True,  6400, 32.770),
    _azure("Standard_ND96isr_H100_v5",    "ndv5", 8, "H100", 80, 96, 1900, 3200, True, 28000, 98.32),
    #        name                   family   gpus model GiB vcpu mem  Gb/s nvsw   CNY/h
    _tencent("GN10Xp.2XLARGE40",    "gn10xp", 1, "V100", 32, 10,  40,  3, False,  20.35),
    _tencent("GN10Xp.5XLARGE80",    "gn10xp", 2, "V100", 32, 20,  80,  6, False,  40.70),
    _tencent("GN10Xp.10XLARGE160",  "gn10xp", 4, "V100", 32, 40, 160, 12, False,  81.40),
    _tencent("GN10Xp.20XLARGE320",  "gn10xp", 8, "V100", 32, 80, 320, 25, False, 162.80),
    _tencent("GN7.2XLARGE32",       "gn7",    1, "T4",   16,  8,  32,  3, False,   6.85),
    _tencent("GN7.10XLARGE160",     "gn7",    2, "T4",   16, 40, 160, 13, False,  19.60),
    _tencent("GN7.20XLARGE320",     "gn7",    4, "T4",   16, 80, 320, 25, False,  39.20),
    _tencent("GT4.4XLARGE96",       "gt4",    1, "A100", 40, 16,  96,  5, False,  27.80),
    _tencent("GT4.20XLARGE474",     "gt4",    4, "A100", 40, 82, 474, 25, False, 111.20),
    _tencent("GT4.41XLARGE948",     "gt4",    8, "A100", 40, 164, 948, 50, True, 222.40),
]

CATALOG: dict[str, InstanceType] = {row.name: row for row in _ROWS}


@dataclass(frozen=True)
class ControllerType:
    """A size for the stack's Slurm controller (slurmctld, the bridge, power saving): always on, on demand."""
    name: str
    cloud: str
    vcpus: int
    memory_gib: int
    price_hour: float          # on-demand, in CURRENCY[cloud], PRICE_REGION[cloud], PRICE_DATE


# slurmctld for a few hundred nodes, the bridge and the power-saving programs fit in 2 vCPUs and 8 GiB (the first
# size of each cloud is its default); larger sizes for large queues. Tencent's prices were entered by hand, as its
# GPU rows were: check them against the CVM price list before relying on them.
CONTROLLER_TYPES: dict[str, ControllerType] = {c.name: c for c in (
    ControllerType("m6i.large", "aws", 2, 8, 0.096),
    ControllerType("m6i.xlarge", "aws", 4, 16, 0.192),
    ControllerType("m6i.2xlarge", "aws", 8, 32, 0.384),
    ControllerType("Standard_D2s_v5", "azure", 2, 8, 0.096),
    ControllerType("Standard_D4s_v5", "azure", 4, 16, 0.192),
    ControllerType("Standard_D8s_v5", "azure", 8, 32, 0.384),
    ControllerType("S5.LARGE8", "tencent", 4, 8, 0.85),
    ControllerType("S5.2XLARGE16", "tencent", 8, 16, 1.70),
)}


def controller_types(cloud: str) -> list[str]:
    """The controller sizes of ``cloud``, its default first."""
    return [n for n, c in CONTROLLER_TYPES.items() if c.cloud == cloud]


def names(cloud: str | None = None) -> list[str]:
    return [n for n, t in CATALOG.items() if cloud is None or t.cloud == cloud]


def lookup(name: str) -> InstanceType:
    """The catalog row for `name`; KeyError when the type is not in the catalog."""
    return CATALOG[name]


# --- refresh: compare the hardware facts with EC2 DescribeInstanceTypes --------------------------

def facts_from_describe(item: dict) -> dict:
    """The catalog's hardware fields from one DescribeInstanceTypes item."""
    net = item.get("NetworkInfo", {})
    gpus = item.get("GpuInfo", {}).get("Gpus", [{}])[0]
    return {
        "gpus": gpus.get("Count", 0),
        "gpu_model": gpus.get("Name", ""),
        "vcpus": item["VCpuInfo"]["DefaultVCpus"],
        "memory_gib": item["MemoryInfo"]["SizeInMiB"] // 1024,
        "network_cards": net.get("MaximumNetworkCards", 1),
        "max_efa": net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0) if net.get("EfaSupported") else 0,
        "local_nvme_gb": item.get("InstanceStorageInfo", {}).get("TotalSizeInGB", 0),
    }


def refresh(ec2_client) -> dict[str, dict[str, tuple]]:
    """Read every AWS catalog type from EC2 and return {type: {field: (catalog, ec2)}} for differences.

    GPU memory is left out: EC2 reports usable MiB (A10G 22888), the catalog marketed GiB.
    """
    wanted = names("aws")
    found: dict[str, dict] = {}
    for page in ec2_client.get_paginator("describe_instance_types").paginate(InstanceTypes=wanted):
        for item in page["InstanceTypes"]:
            found[item["InstanceType"]] = facts_from_describe(item)
    diffs: dict[str, dict[str, tuple]] = {}
    for name in wanted:
        if name not in found:
            diffs[name] = {"missing": (True, False)}
            continue
        row = dataclasses.asdict(CATALOG[name])
        delta = {k: (row[k], v) for k, v in found[name].items() if row[k] != v}
        if delta:
            diffs[name] = delta
    return diffs


def configure(parser) -> None:
    """The catalog's commands (on ``python -m infra.catalog`` and on ``gpufleet catalog``)."""
    commands = cli.add_commands(parser, "catalog_command")
    commands.add_parser("list", help="print the catalog", description="print the catalog")
    ref = commands.add_parser("refresh", help="compare hardware facts with EC2 DescribeInstanceTypes",
                              description="compare hardware facts with EC2 DescribeInstanceTypes "
                              "(boto3's credentials and AWS_ENDPOINT_URL apply); exit 1 when they differ")
    ref.add_argument("--region", default=PRICE_REGION["aws"], help="EC2 region to ask")


def run(args) -> int:
    if args.catalog_command == "list":
        for t in CATALOG.values():
            print(f"{t.name:28} {t.cloud:7} {t.gpus}x {t.gpu_model:5} {t.gpu_memory_gib:>3} GiB  "
                  f"efa={t.max_efa:<2} ib={t.infiniband_gbps:<4} {t.price_hour} {t.currency}/h")
        return 0
    import boto3  # lazy: boto3 (~0.2 s) only for `catalog refresh`, off gpufleet's start-up

    try:
        diffs = refresh(boto3.client("ec2", region_name=args.region))
    except Exception as exc:  # network or credentials: one line, not a traceback
        print(f"catalog refresh: {exc}", file=sys.stderr)
        return 2
    for name, delta in diffs.items():
        for field, (ours, theirs) in delta.items():
            print(f"{name} {field}: catalog {ours!r}, EC2 {theirs!r}")
    print(f"{len(names('aws'))} types checked, {len(diffs)} differ")
    return 1 if diffs else 0


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m infra.catalog", description="The GPU instance catalog.")
    configure(parser)
    return cli.guarded(lambda: run(parser.parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    raise SystemExit(main())
