"""Cost arithmetic against hand-worked examples (730 h/month, catalog list prices)."""
from __future__ import annotations

import pytest

from infra import catalog
from infra.config import parse
from infra.preview import cost


def _cfg(**over):
    raw = {"aws:region": "eu-west-1", "gpufleet:cloud": "aws", "gpufleet:mode": "queue",
           "gpufleet:instanceTypes": ["g6.xlarge"], "gpufleet:nodes": {"min": 0, "desired": 0, "max": 4},
           "gpufleet:spot": True, "gpufleet:dataClassification": "internal", "gpufleet:budgetMonthlyUsd": 3000,
           "gpufleet:image": {"name": "gpufleet-gpu-*"}}
    raw.update({f"gpufleet:{k}": v for k, v in over.items()})
    return parse(raw, "t")


def test_the_prices_the_examples_rely_on():
    # The hand-worked figures below use these prices; if one changes, rework the examples.
    assert catalog.CATALOG["g6.xlarge"].price_hour == 0.8048
    assert catalog.CATALOG["g6.xlarge"].spot_price_hour == 0.3219      # 0.8048 x 0.40, 4 decimals
    assert catalog.CATALOG["g5.xlarge"].price_hour == 1.006
    assert catalog.CATALOG["g5.xlarge"].spot_price_hour == 0.4024      # 1.006 x 0.40
    assert catalog.CATALOG["p5.48xlarge"].price_hour == 55.04
    assert catalog.CATALOG["p5.48xlarge"].spot_price_hour == 33.024    # 55.04 x 0.60
    assert catalog.CATALOG["Standard_ND96asr_v4"].price_hour == 27.197
    assert catalog.CATALOG["Standard_ND96asr_v4"].spot_price_hour == 12.2386  # 27.197 x 0.45
    # AWS root volume 200 GiB gp3 x $0.08 = $16.00 per node; 10 interface endpoints at $0.01/h per AZ = $7.30 each
    # (test_review_end_to_end checks these counts against what the stacks create)
    assert (cost.AWS_ROOT_VOLUME_GIB, cost.AWS_INTERFACE_ENDPOINTS, cost.AWS_QUEUE_MODE_AZS) == (200, 10, 3)


def test_spot_queue_stack_scaling_from_zero():
    est = cost.estimate(_cfg())
    # fixed: KMS key 1.00 + dashboard 3.00 + 10 endpoints x 3 AZ x 0.01 x 730 = 219.00 -> 223.00
    assert est["fixed_monthly_usd"] == 223.00
    assert [f["monthly_usd"] for f in est["fixed"]] == [1.00, 3.00, 219.00]
    # min = desired = 0 nodes: only the fixed items
    assert est["rows"]["min"] == {"nodes": 0, "on_demand_usd": 0.0, "spot_usd": 0.0}
    assert est["monthly_usd"]["min"] == est["monthly_usd"]["desired"] == 223.00
    # max = 4 nodes, each with a $16.00 root volume:
    # on-demand 4 x 0.8048 x 730 + 64 = 2414.016; spot 4 x 0.3219 x 730 + 64 = 1003.948
    assert est["rows"]["max"] == {"nodes": 4, "on_demand_usd": 2414.02, "spot_usd": 1003.95}
    assert est["monthly_usd"]["max"] == 1226.95            # spot stack: 1003.948 + 223.00
    assert est["purchase"] == "spot"
    assert (est["price_date"], est["price_region"], est["region"]) == (catalog.PRICE_DATE, "us-east-1", "eu-west-1")
    # budget 3000: 1226.95 / 3000 = 40.90 %, headroom 1773.05
    assert est["budget"] == {"monthly_usd": 3000.0, "within_at_desired": True, "within_at_max": True,
                             "headroom_at_max_usd": 1773.05, "used_at_max_pct": 40.9}


def test_on_demand_gang_stack_over_budget():
    cfg = _cfg(mode="gang", instanceTypes=["p5.48xlarge"], nodes={"min": 4, "desired": 4, "max": 4}, spot=False,
               budgetMonthlyUsd=150000)
    est = cost.estimate(cfg)
    # on-demand 4 x 55.04 x 730 + 4 x 16 = 160780.80; spot 4 x 33.024 x 730 + 64 = 96494.08
    for level in ("min", "desired", "max"):
        assert est["rows"][level] == {"nodes": 4, "on_demand_usd": 160780.80, "spot_usd": 96494.08}
    # gang mode uses one subnet: 10 endpoints x 1 AZ x 7.30 = 73.00; + 1.00 + 3.00 = 77.00
    assert est["fixed_monthly_usd"] == 77.00
    assert est["monthly_usd"] == {"min": 160857.80, "desired": 160857.80, "max": 160857.80}
    assert est["prices"]["spot"]["basis"] == "primary type"
    # 160857.80 > 150000: over budget already at the desired size, by 10857.80
    assert (est["budget"]["within_at_desired"], est["budget"]["within_at_max"]) == (False, False)
    assert est["budget"]["headroom_at_max_usd"] == -10857.80


def test_existing_network_has_no_endpoint_charge():
    est = cost.estimate(_cfg(network={"vpcId": "vpc-0123456789abcdef0", "subnetIds": ["subnet-0123456789abcdef0"]}))
    assert [f["item"] for f in est["fixed"]] == ["KMS customer managed key", "CloudWatch dashboard"]
    assert est["monthly_usd"]["min"] == 4.00


def test_on_demand_base_is_honoured_in_the_spot_column():
    est = cost.estimate(_cfg(instanceTypes=["g5.xlarge"], nodes={"min": 0, "desired": 2, "max": 4}, onDemandBase=1))
    # desired 2: 1 on-demand + 1 spot = (1.006 + 0.4024) x 730 + 2 x 16 = 1060.132
    assert est["rows"]["desired"] == {"nodes": 2, "on_demand_usd": 1500.76, "spot_usd": 1060.13}
    # max 4: 1 on-demand + 3 spot = (1.006 + 3 x 0.4024) x 730 + 4 x 16 = 1679.636
    assert est["rows"]["max"]["spot_usd"] == 1679.64
    # min 0: the base cannot exceed the node count
    assert est["rows"]["min"]["spot_usd"] == 0.0
    assert est["monthly_usd"]["desired"] == 1283.13           # 1060.132 + 223.00


def test_mixed_types_price_on_demand_by_primary_and_spot_by_cheapest():
    est = cost.estimate(_cfg(instanceTypes=["g5.xlarge", "g6.xlarge"]))
    assert est["prices"]["on_demand"] == {"instance_type": "g5.xlarge", "usd_hour": 1.006, "basis": "primary type"}
    assert est["prices"]["spot"] == {"instance_type": "g6.xlarge", "usd_hour": 0.3219,
                                     "basis": "cheapest of the listed types"}
    # on-demand 4 x 1.006 x 730 + 64 = 3001.52; spot 4 x 0.3219 x 730 + 64 = 1003.948
    assert est["rows"]["max"] == {"nodes": 4, "on_demand_usd": 3001.52, "spot_usd": 1003.95}


def test_azure_stack_prices_the_os_disk_tier():
    assert cost.AZURE_OS_DISK_GB == 256                        # 256 GiB bills as a P15 disk, $38.02
    raw = {"azure-native:location": "westeurope", "gpufleet:cloud": "azure", "gpufleet:mode": "queue",
           "gpufleet:instanceTypes": ["Standard_ND96asr_v4"], "gpufleet:nodes": {"min": 0, "desired": 1, "max": 4},
           "gpufleet:spot": True, "gpufleet:dataClassification": "internal", "gpufleet:budgetMonthlyUsd": 30000,
           "gpufleet:image": "microsoft-dsvm:ubuntu-hpc:2204:latest",
           "gpufleet:sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample test@example"}
    est = cost.estimate(parse(raw, "az"))
    assert est["price_region"] == "eastus"
    # the registry nodes pull from: Premium (private endpoints need it) 1.667/day x 730/24 = 50.70,
    # its private endpoint 0.01 x 730 = 7.30, the privatelink.azurecr.io zone 0.50; the Key Vault's endpoint 7.30
    # and privatelink.vaultcore.azure.net zone 0.50 (a standard vault bills per operation): 66.30
    assert [(f["item"], f["monthly_usd"]) for f in est["fixed"]] == [
        ("Container Registry, Premium tier", 50.70), ("private endpoint (registry)", 7.30),
        ("private DNS zone (privatelink.azurecr.io)", 0.50), ("private endpoint (Key Vault)", 7.30),
        ("private DNS zone (privatelink.vaultcore.azure.net)", 0.50)]
    assert est["fixed_monthly_usd"] == 66.30
    assert est["node_disk"] == {"item": "OS disk 256 GiB Premium SSD (P15)", "usd_month": 38.02}
    # desired 1: 12.2386 x 730 + 38.02 = 8972.198; max 4: 35736.712 + 152.08 = 35888.792 (spot)
    # and 4 x 27.197 x 730 + 152.08 = 79567.32 (on-demand); each plus the 66.30 fixed
    assert est["monthly_usd"] == {"min": 66.30, "desired": 9038.50, "max": 35955.09}
    assert est["rows"]["max"]["on_demand_usd"] == 79567.32
    # 35947.29 > 30000 at max, 9030.70 within at desired
    assert (est["budget"]["within_at_desired"], est["budget"]["within_at_max"]) == (True, False)


@pytest.mark.parametrize("count,base,expected", [(0, 2, 0.0), (1, 2, 2.0 * 730 + 5),
                                                 (3, 2, (2 * 2.0 + 1.0) * 730 + 15)])
def test_node_month_splits_at_the_base(count, base, expected):
    month = cost.node_month(count, base, od_hour=2.0, spot_hour=1.0, disk_month=5.0)
    assert month["spot_usd"] == pytest.approx(expected)


def test_tencent_stack_is_priced_in_cny_against_a_cny_budget():
    raw = {"tencentcloud:region": "ap-shanghai", "gpufleet:cloud": "tencent", "gpufleet:mode": "queue",
           "gpufleet:instanceTypes": ["GN10Xp.20XLARGE320"], "gpufleet:nodes": {"min": 0, "desired": 1, "max": 2},
           "gpufleet:spot": True, "gpufleet:dataClassification": "internal", "gpufleet:budgetMonthlyCny": 100000,
           "gpufleet:image": {"id": "img-0a1b2c3d"}}
    est = cost.estimate(parse(raw, "tc"))
    assert (est["currency"], est["price_region"]) == ("CNY", "ap-guangzhou")
    assert catalog.CATALOG["GN10Xp.20XLARGE320"].price_hour == 162.80     # CNY/h
    assert catalog.CATALOG["GN10Xp.20XLARGE320"].spot_price_hour == 56.98  # 162.80 x 0.35
    assert est["node_disk"] == {"item": "system disk 200 GB Premium Cloud Disk", "usd_month": 70.0}  # 200 x 0.35
    assert est["fixed"] == [{"item": "KMS customer master key", "quantity": 1, "usd_month_each": 3.0,
                             "monthly_usd": 3.0}]
    # desired 1 on spot: 56.98 x 730 + 70 + 3 = 41668.40; max 2: 83190.80 + 140 + 3 = 83333.80 (on-demand 237828.0)
    assert est["monthly_usd"] == {"min": 3.0, "desired": 41668.40, "max": 83333.80}
    assert est["rows"]["max"]["on_demand_usd"] == 237828.0
    assert est["budget"] == {"monthly_usd": 100000.0, "within_at_desired": True, "within_at_max": True,
                             "headroom_at_max_usd": 16666.20, "used_at_max_pct": 83.3}
