"""The regions each cloud has: one pure check per cloud, read from local data (no network).

AWS: botocore's partition data (its bundled endpoints.json: aws, aws-cn, aws-us-gov, ...), the list the
SDK itself resolves endpoints from. Azure: the physical locations the project keeps below
(`az account list-locations --query "[?metadata.regionType=='Physical'].name"`), updated by hand when
Azure opens one. A cloud joins with its own entry in CHECKS.
"""
from __future__ import annotations

from functools import lru_cache

AZURE_LOCATIONS = frozenset({
    "australiacentral", "australiacentral2", "australiaeast", "australiasoutheast", "austriaeast",
    "belgiumcentral", "brazilsouth", "brazilsoutheast", "canadacentral", "canadaeast", "centralindia",
    "centralus", "chilecentral", "eastasia", "eastus", "eastus2", "francecentral", "francesouth",
    "germanynorth", "germanywestcentral", "indonesiacentral", "israelcentral", "italynorth", "japaneast",
    "japanwest", "jioindiacentral", "jioindiawest", "koreacentral", "koreasouth", "malaysiawest",
    "mexicocentral", "newzealandnorth", "northcentralus", "northeurope", "norwayeast", "norwaywest",
    "polandcentral", "qatarcentral", "southafricanorth", "southafricawest", "southcentralus", "southeastasia",
    "southindia", "spaincentral", "swedencentral", "swedensouth", "switzerlandnorth", "switzerlandwest",
    "uaecentral", "uaenorth", "uksouth", "ukwest", "westcentralus", "westeurope", "westindia", "westus",
    "westus2", "westus3",
})


@lru_cache(maxsize=1)
def aws_regions() -> frozenset[str]:
    """Every region of every AWS partition in botocore's bundled endpoint data."""
    import botocore.session  # lazy: AWS SDK (~0.2 s) only for an AWS region, off gpufleet's start-up

    data = botocore.session.get_session().get_data("endpoints")
    return frozenset(region for partition in data["partitions"] for region in partition["regions"])


def check_aws(region: str) -> str | None:
    """None when ``region`` is an AWS region, else what is allowed (one line)."""
    if region in aws_regions():
        return None
    import botocore  # lazy: AWS SDK only for an AWS region, off gpufleet's start-up

    near = sorted(r for r in aws_regions() if r.split("-")[0] == str(region).split("-")[0])
    return (f"not a region in botocore {botocore.__version__}'s partition data; e.g. "
            f"{', '.join(near[:6] or sorted(aws_regions())[:6])} (a region newer than botocore: upgrade it)")


def check_azure(location: str) -> str | None:
    """None when ``location`` is an Azure location name, else what is allowed (one line)."""
    if location in AZURE_LOCATIONS:
        return None
    lowered = str(location).lower().replace(" ", "")
    if lowered in AZURE_LOCATIONS:
        return f"write the location name {lowered!r} (lower case, no spaces)"
    return f"not an Azure location; known: {', '.join(sorted(AZURE_LOCATIONS))}"


# Tencent Cloud regions the stack deploys to, with the short code TDMQ CMQ's private endpoint
# (http://<code>.mqadapter.cmq.tencentyun.com) uses for each.
TENCENT_REGIONS = {
    "ap-guangzhou": "gz", "ap-shanghai": "sh", "ap-beijing": "bj", "ap-chengdu": "cd", "ap-chongqing": "cq",
    "ap-nanjing": "nj", "ap-shenzhen-fsi": "szjr", "ap-shanghai-fsi": "shjr", "ap-beijing-fsi": "bjjr",
    "ap-hongkong": "hk", "ap-singapore": "sg", "ap-tokyo": "jp", "ap-seoul": "kr", "ap-bangkok": "th",
    "ap-jakarta": "jkt", "na-siliconvalley": "usw", "na-ashburn": "use", "eu-frankfurt": "de",
    "sa-saopaulo": "sao",
}


def check_tencent(region: str) -> str | None:
    """None when the stack deploys to ``region`` on Tencent Cloud, else what is allowed (one line)."""
    return None if region in TENCENT_REGIONS else f"one of {', '.join(TENCENT_REGIONS)}"


CHECKS = {"aws": check_aws, "azure": check_azure, "tencent": check_tencent}


def check(cloud: str, region: str) -> str | None:
    """None when ``region`` exists in ``cloud``, else what is allowed."""
    return CHECKS[cloud](region)
