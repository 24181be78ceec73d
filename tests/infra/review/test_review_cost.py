"""Cost arithmetic of Slurm stacks against hand-worked examples (730 h/month, catalog list prices).

The model: fixed items (the controller on demand with its boot disk, the shared file system where it is
provisioned, the per-cloud items) are billed whatever the node count; each partition adds its always-on nodes
(nodes.min) when idle and all its nodes (nodes.max) at full size, the first onDemandBase nodes on demand and the
rest as its spot setting says, each node with its boot disk.
"""
from __future__ import annotations

import pytest

from infra import catalog
from infra.config import parse
from infra.preview import cost

AWS_BASE = {"aws:region": "eu-west-1", "gpufleet:cloud": "aws", "gpufleet:dataClassification": "internal",
            "gpufleet:budgetMonthlyUsd": 3000, "gpufleet:image": {"name": "gpufleet-gpu-*"}}


def _cfg(**over):
    raw = {**AWS_BASE, "gpufleet:mode": "queue", "gpufleet:instanceTypes": ["g6.xlarge"],
           "gpufleet:nodes": {"min": 0, "max": 4}, "gpufleet:spot": True}
    raw.update({f"gpufleet:{k}": v for k, v in over.items()})
    return parse(raw, "t")


def _partitions(*parts, **over):
    raw = {**AWS_BASE, "gpufleet:partitions": list(parts)}
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
    assert catalog.CATALOG["GN10Xp.20XLARGE320"].price_hour == 162.80     # CNY/h
    assert catalog.CATALOG["GN10Xp.20XLARGE320"].spot_price_hour == 56.98  # 162.80 x 0.35
    # the controllers: each cloud's default size, on demand
    assert [catalog.CONTROLLER_TYPES[n].price_hour for n in ("m6i.large", "Standard_D2s_v5", "S5.LARGE8")] == \
        [0.096, 0.096, 0.85]
    # AWS: node root volume 200 GiB gp3 x $0.08 = $16.00; the controller's 50 GiB = $4.00; 11 interface endpoints
    # at $0.01/h per AZ = $7.30 each (test_review_end_to_end checks these counts against what the stacks create)
    assert (cost.AWS_ROOT_VOLUME_GIB, cost.AWS_CONTROLLER_ROOT_GIB, cost.GP3_GB_MONTH) == (200, 50, 0.08)
    assert (cost.AWS_INTERFACE_ENDPOINTS, cost.AWS_QUEUE_MODE_AZS, cost.SECRET_MONTH) == (11, 3, 0.40)
    # Azure: node OS disk 256 GiB bills as P15 $38.02, the controller's 64 GiB as P6 $10.21; two premium NFS shares
    # of 100 GiB (the premium minimum) x $0.16; a private endpoint $0.01/h, a private DNS zone $0.50/month; the NAT
    # gateway $0.045/h (and $0.045 per GB processed: usage), its Standard static public IP $0.005/h
    assert (cost.AZURE_OS_DISK_GB, cost.AZURE_CONTROLLER_OS_DISK_GB) == (256, 64)
    assert (cost.AZURE_FILES_SHARES, cost.AZURE_FILES_SHARE_GIB, cost.AZURE_FILES_PREMIUM_GIB_MONTH) == (2, 100, 0.16)
    assert (cost.PRIVATE_ENDPOINT_HOUR, cost.PRIVATE_DNS_ZONE_MONTH) == (0.01, 0.50)
    assert (cost.NAT_GATEWAY_HOUR, cost.NAT_GATEWAY_GB, cost.PUBLIC_IP_STANDARD_HOUR) == (0.045, 0.045, 0.005)
    # Tencent (CNY): Premium Cloud Disk 0.35/GB-month, node 200 GB = 70.00, controller 50 GB = 17.50
    assert (cost.TENCENT_SYSTEM_DISK_GB, cost.TENCENT_CONTROLLER_SYSTEM_DISK_GB) == (200, 50)
    assert (cost.CLOUD_PREMIUM_GB_MONTH, cost.TENCENT_KMS_KEY_MONTH) == (0.35, 3.00)
    # two CFS Standard file systems (home, slurm state), 0.35/GiB-month stored: usage, not summed
    assert (cost.TENCENT_CFS_FILE_SYSTEMS, cost.CFS_STANDARD_GB_MONTH) == (2, 0.35)


def test_the_disk_sizes_and_endpoint_counts_are_the_aws_stacks_own():
    from infra.aws import controller, network, partition

    assert cost.AWS_ROOT_VOLUME_GIB == partition.ROOT_VOLUME_GIB
    assert cost.AWS_CONTROLLER_ROOT_GIB == controller.ROOT_VOLUME_GIB
    assert cost.AWS_INTERFACE_ENDPOINTS == len(network.INTERFACE_ENDPOINTS)
    assert cost.AWS_QUEUE_MODE_AZS == network.QUEUE_MODE_SUBNETS


def test_the_share_sizes_and_counts_are_the_azure_stacks_own():
    from infra.azure import controller, shared_fs

    assert cost.AZURE_CONTROLLER_OS_DISK_GB == controller.OS_DISK_GB
    assert (cost.AZURE_FILES_SHARES, cost.AZURE_FILES_SHARE_GIB) == (len(shared_fs.SHARES), shared_fs.SHARE_GIB)


def test_aws_spot_stack_idle_at_zero_nodes():
    est = cost.estimate(_cfg())
    # fixed: controller m6i.large 0.096 x 730 = 70.08, its root volume 50 x 0.08 = 4.00, the munge key's secret
    # 0.40, KMS key 1.00, dashboard 3.00, 11 endpoints x 3 AZ x 0.01 x 730 = 240.90 -> 319.38
    assert [(f["item"], f["quantity"], f["monthly_usd"]) for f in est["fixed"]] == [
        ("controller m6i.large (on-demand)", 1, 70.08), ("controller root volume 50 GiB gp3", 1, 4.00),
        ("Secrets Manager secret (munge key)", 1, 0.40), ("KMS customer managed key", 1, 1.00),
        ("CloudWatch dashboard", 1, 3.00), ("interface VPC endpoints (11 services × 3 AZ)", 33, 240.90)]
    assert est["fixed_monthly_usd"] == 319.38
    (gpu,) = est["partitions"]
    assert (gpu["name"], gpu["always_on"], gpu["nodes_max"], gpu["purchase"], gpu["on_demand_base"]) == \
        ("gpu", 0, 4, "spot", 0)
    assert gpu["node_disk"] == {"item": "root volume 200 GiB gp3", "usd_month": 16.00}
    # idle: no always-on node; full: 4 spot nodes 4 x 0.3219 x 730 + 4 x 16 = 1003.948
    assert (gpu["idle_usd"], gpu["full_usd"]) == (0.0, 1003.95)
    # idle is the controller and the fixed items only; full 319.38 + 1003.95
    assert est["monthly_usd"] == {"idle": 319.38, "full": 1323.33}
    # the stack's own VPC has its DNS firewall: $0.60 per million queries, usage (its 3 domain names: $0.0015)
    assert est["usage"] == [{"item": "EFS Standard storage (shared file system)", "unit": "GB-month",
                             "usd_each": 0.30},
                            {"item": "DNS Firewall queries (the stack's VPC)", "unit": "million queries",
                             "usd_each": 0.60}]
    assert (est["currency"], est["hours_per_month"]) == ("USD", 730)
    assert (est["price_date"], est["price_region"], est["region"]) == (catalog.PRICE_DATE, "us-east-1", "eu-west-1")
    # budget 3000: 1323.33 / 3000 = 44.11 %, headroom 1676.67
    assert est["budget"] == {"monthly_usd": 3000.0, "within_when_idle": True, "within_at_full": True,
                             "headroom_at_full_usd": 1676.67, "used_at_full_pct": 44.1}
    assert "EFS" in est["excluded"] and "data transfer" in est["excluded"]


def test_aws_on_demand_gang_partition_always_on_over_budget_when_idle():
    cfg = _cfg(mode="gang", instanceTypes=["p5.48xlarge"], nodes={"min": 4, "max": 4}, spot=False,
               budgetMonthlyUsd=150000)
    est = cost.estimate(cfg)
    (gpu,) = est["partitions"]
    # 4 on-demand nodes always on: 4 x 55.04 x 730 + 4 x 16 = 160780.80, idle and full alike
    assert (gpu["purchase"], gpu["idle_usd"], gpu["full_usd"]) == ("on-demand", 160780.80, 160780.80)
    assert gpu["prices"]["spot"]["basis"] == "primary type"
    # every partition is a gang: one subnet, 11 endpoints x 1 AZ x 7.30 = 80.30; + 70.08 + 4.00 + 0.40 + 1.00 + 3.00
    assert est["fixed_monthly_usd"] == 158.78
    assert est["monthly_usd"] == {"idle": 160939.58, "full": 160939.58}
    # 160939.58 > 150000: over budget already when idle, by 10939.58; 107.29 % used
    assert est["budget"] == {"monthly_usd": 150000.0, "within_when_idle": False, "within_at_full": False,
                             "headroom_at_full_usd": -10939.58, "used_at_full_pct": 107.3}


def test_aws_partitions_each_priced_by_their_own_types_base_and_purchase():
    est = cost.estimate(_partitions(
        {"name": "train", "instanceTypes": ["p5.48xlarge"], "nodes": {"min": 0, "max": 2}, "gang": True},
        {"name": "dev", "instanceTypes": ["g5.xlarge", "g6.xlarge"], "nodes": {"min": 1, "max": 3}, "spot": True,
         "onDemandBase": 1}))
    train, dev = est["partitions"]
    # train: on demand, no node always on; full 2 x 55.04 x 730 + 2 x 16 = 80390.40
    assert (train["purchase"], train["idle_usd"], train["full_usd"]) == ("on-demand", 0.0, 80390.40)
    # dev: on-demand at its primary g5.xlarge, spot at its cheapest listed type g6.xlarge
    assert dev["prices"] == {
        "on_demand": {"instance_type": "g5.xlarge", "usd_hour": 1.006, "basis": "primary type"},
        "spot": {"instance_type": "g6.xlarge", "usd_hour": 0.3219, "basis": "cheapest of the listed types"}}
    # idle: dev-1 is always on and on demand (the base): 1.006 x 730 + 16 = 750.38
    # full: dev-1 on demand, dev-2 and dev-3 spot: (1.006 + 2 x 0.3219) x 730 + 3 x 16 = 1252.354
    assert (dev["always_on"], dev["on_demand_base"], dev["idle_usd"], dev["full_usd"]) == (1, 1, 750.38, 1252.35)
    # not every partition is a gang: 3 AZs, fixed 319.38 as in the single-partition example
    assert est["fixed_monthly_usd"] == 319.38
    # idle 319.38 + 0 + 750.38; full 319.38 + 80390.40 + 1252.35
    assert est["monthly_usd"] == {"idle": 1069.76, "full": 81962.13}
    assert (est["budget"]["within_when_idle"], est["budget"]["within_at_full"]) == (True, False)


def test_aws_all_gang_partitions_use_one_az_of_endpoints():
    est = cost.estimate(_partitions(
        {"name": "a", "instanceTypes": ["p5.48xlarge"], "nodes": {"max": 2}, "gang": True},
        {"name": "b", "instanceTypes": ["g5.xlarge"], "nodes": {"max": 1}, "gang": True}))
    endpoints = est["fixed"][-1]
    assert (endpoints["item"], endpoints["quantity"], endpoints["monthly_usd"]) == \
        ("interface VPC endpoints (11 services × 1 AZ)", 11, 80.30)


def test_existing_network_has_no_endpoint_charge():
    est = cost.estimate(_cfg(network={"vpcId": "vpc-0123456789abcdef0", "subnetIds": ["subnet-0123456789abcdef0"]}))
    assert [f["item"] for f in est["fixed"]] == [
        "controller m6i.large (on-demand)", "controller root volume 50 GiB gp3", "Secrets Manager secret (munge key)",
        "KMS customer managed key", "CloudWatch dashboard"]
    assert est["monthly_usd"]["idle"] == 78.48                 # 70.08 + 4.00 + 0.40 + 1.00 + 3.00


def test_a_larger_controller_costs_its_own_rate():
    est = cost.estimate(_cfg(controller={"instanceType": "m6i.xlarge"}))
    assert est["fixed"][0] == {"item": "controller m6i.xlarge (on-demand)", "quantity": 1,
                               "usd_month_each": 140.16, "monthly_usd": 140.16}   # 0.192 x 730
    assert est["monthly_usd"]["idle"] == 389.46                # 319.38 - 70.08 + 140.16


def test_azure_stack_prices_the_controller_the_files_shares_the_nat_gateway_and_the_node_disk_tier():
    raw = {"azure-native:location": "westeurope", "gpufleet:cloud": "azure", "gpufleet:mode": "queue",
           "gpufleet:instanceTypes": ["Standard_ND96asr_v4"], "gpufleet:nodes": {"min": 1, "max": 4},
           "gpufleet:spot": True, "gpufleet:dataClassification": "internal", "gpufleet:budgetMonthlyUsd": 30000,
           "gpufleet:image": "microsoft-dsvm:ubuntu-hpc:2204:latest",
           "gpufleet:sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample test@example"}
    est = cost.estimate(parse(raw, "az"))
    assert est["price_region"] == "eastus"
    # controller Standard_D2s_v5 0.096 x 730 = 70.08, its 64 GiB OS disk as P6 10.21; two premium NFS shares (home,
    # slurm-state) of 100 GiB x 0.16 = 16.00 each, 32.00, their account's private endpoint 0.01 x 730 = 7.30 and the
    # privatelink.file.core.windows.net zone 0.50; the controller subnet's NAT gateway 0.045 x 730 = 32.85 and its
    # Standard static public IP 0.005 x 730 = 3.65; the registry nodes pull from: Premium (private endpoints need
    # it) 1.667/day x 730/24 = 50.70, its private endpoint 7.30, the privatelink.azurecr.io zone 0.50; the Key
    # Vault's endpoint 7.30 and privatelink.vaultcore.azure.net zone 0.50 (a standard vault bills per operation):
    # 222.89
    assert [(f["item"], f["quantity"], f["monthly_usd"]) for f in est["fixed"]] == [
        ("controller Standard_D2s_v5 (on-demand)", 1, 70.08), ("controller OS disk 64 GiB Premium SSD (P6)", 1, 10.21),
        ("Azure Files premium NFS share (100 GiB provisioned)", 2, 32.00),
        ("private endpoint (Azure Files)", 1, 7.30), ("private DNS zone (privatelink.file.core.windows.net)", 1, 0.50),
        ("NAT gateway (the controller subnet's outbound path)", 1, 32.85),
        ("public IP address, Standard static (the NAT gateway's)", 1, 3.65),
        ("Container Registry, Premium tier", 1, 50.70), ("private endpoint (registry)", 1, 7.30),
        ("private DNS zone (privatelink.azurecr.io)", 1, 0.50), ("private endpoint (Key Vault)", 1, 7.30),
        ("private DNS zone (privatelink.vaultcore.azure.net)", 1, 0.50)]
    assert est["fixed"][2]["usd_month_each"] == 16.00
    assert est["fixed_monthly_usd"] == 222.89
    # the shares are provisioned (fixed items); what the NAT gateway processes is usage, listed and not summed
    assert est["usage"] == [{"item": "NAT gateway data processed (the controller's calls to Azure Resource Manager)",
                             "unit": "GB", "usd_each": 0.045}]
    (gpu,) = est["partitions"]
    assert gpu["node_disk"] == {"item": "OS disk 256 GiB Premium SSD (P15)", "usd_month": 38.02}
    # idle: gpu-1 always on, spot: 12.2386 x 730 + 38.02 = 8972.198
    # full: 4 spot nodes 4 x 12.2386 x 730 + 4 x 38.02 = 35736.712 + 152.08 = 35888.792
    assert (gpu["idle_usd"], gpu["full_usd"]) == (8972.20, 35888.79)
    # each plus the 222.89 fixed
    assert est["monthly_usd"] == {"idle": 9195.09, "full": 36111.68}
    # within 30000 when idle, over at full by 6111.68 (120.37 % used)
    assert est["budget"] == {"monthly_usd": 30000.0, "within_when_idle": True, "within_at_full": False,
                             "headroom_at_full_usd": -6111.68, "used_at_full_pct": 120.4}
    # the controller-down metric alert is left out like the AWS stack's CloudWatch alarms, and said so
    assert "metric alert" in est["excluded"] and "NAT gateway data processed" in est["excluded"]


@pytest.mark.parametrize("count,base,spot,expected", [
    (0, 2, True, 0.0), (1, 2, True, 2.0 * 730 + 5), (3, 2, True, (2 * 2.0 + 1.0) * 730 + 15),
    (3, 2, False, 3 * 2.0 * 730 + 15), (3, 0, True, 3 * 1.0 * 730 + 15)])
def test_nodes_month_splits_at_the_base(count, base, spot, expected):
    month = cost.nodes_month(count, base, spot, od_hour=2.0, spot_hour=1.0, disk_month=5.0)
    assert month == pytest.approx(expected)


def test_tencent_stack_is_priced_in_cny_against_a_cny_budget():
    raw = {"tencentcloud:region": "ap-shanghai", "gpufleet:cloud": "tencent", "gpufleet:mode": "queue",
           "gpufleet:instanceTypes": ["GN10Xp.20XLARGE320"], "gpufleet:nodes": {"min": 0, "max": 2},
           "gpufleet:spot": True, "gpufleet:dataClassification": "internal", "gpufleet:budgetMonthlyCny": 100000,
           "gpufleet:image": {"id": "img-0a1b2c3d"}}
    est = cost.estimate(parse(raw, "tc"))
    assert (est["currency"], est["price_region"]) == ("CNY", "ap-guangzhou")
    # controller S5.LARGE8 0.85 x 730 = 620.50, its 50 GB system disk 50 x 0.35 = 17.50, the KMS key 3.00: 641.00
    assert est["fixed"] == [
        {"item": "controller S5.LARGE8 (on-demand)", "quantity": 1, "usd_month_each": 620.50, "monthly_usd": 620.50},
        {"item": "controller system disk 50 GB Premium Cloud Disk", "quantity": 1, "usd_month_each": 17.50,
         "monthly_usd": 17.50},
        {"item": "KMS customer master key", "quantity": 1, "usd_month_each": 3.0, "monthly_usd": 3.0}]
    assert est["fixed_monthly_usd"] == 641.00
    # two CFS Standard file systems, billed on what they store: usage, not summed
    assert est["usage"] == [{"item": "CFS Standard storage (2 file systems: home, slurm state)",
                             "unit": "GiB-month", "usd_each": 0.35}]
    (gpu,) = est["partitions"]
    assert gpu["node_disk"] == {"item": "system disk 200 GB Premium Cloud Disk", "usd_month": 70.0}  # 200 x 0.35
    # full: 2 spot nodes 2 x 56.98 x 730 + 2 x 70 = 83190.80 + 140 = 83330.80; idle: none
    assert (gpu["idle_usd"], gpu["full_usd"]) == (0.0, 83330.80)
    assert est["monthly_usd"] == {"idle": 641.00, "full": 83971.80}
    # 83971.80 / 100000 = 83.97 %, headroom 16028.20
    assert est["budget"] == {"monthly_usd": 100000.0, "within_when_idle": True, "within_at_full": True,
                             "headroom_at_full_usd": 16028.20, "used_at_full_pct": 84.0}
    # Tencent's SSM bills per secret, at a CNY price not known here: said, not summed; the alarm policies too
    assert "SSM secret" in est["excluded"] and "Cloud Monitor alarm policies" in est["excluded"]


def test_document_shape():
    est = cost.estimate(_cfg())
    assert sorted(est) == ["budget", "currency", "excluded", "fixed", "fixed_monthly_usd", "hours_per_month",
                           "monthly_usd", "partitions", "price_date", "price_region", "region", "usage"]
    assert sorted(est["partitions"][0]) == ["always_on", "full_usd", "idle_usd", "name", "node_disk", "nodes_max",
                                            "on_demand_base", "prices", "purchase"]
    # the totals are the sums of what the document shows
    for size in cost.SIZES:
        assert est["monthly_usd"][size] == round(
            est["fixed_monthly_usd"] + sum(p[f"{size}_usd"] for p in est["partitions"]), 2)
