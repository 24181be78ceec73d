"""Container registry guardrails: ECR repositories (and the templates of the repositories a pull-through
cache creates) encrypted with KMS, scanned on push, with immutable tags, shared with no one through a
`*` principal; Azure registries without an admin user and closed to the public network.
"""
from __future__ import annotations

from policies.common import UNKNOWN, as_list, flag, get, items, json_doc, resource_policy

ECR_REPOSITORY = "aws:ecr/repository:Repository"
ECR_TEMPLATE = "aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate"
ECR_REPOSITORY_POLICY = "aws:ecr/repositoryPolicy:RepositoryPolicy"
ECR_REGISTRY_POLICY = "aws:ecr/registryPolicy:RegistryPolicy"
AZ_REGISTRY = "azure-native:containerregistry:Registry"

KMS_TYPES = ("KMS", "KMS_DSSE")
POLICY_DOCS = {ECR_REPOSITORY_POLICY: "policy", ECR_REGISTRY_POLICY: "policy", ECR_TEMPLATE: "repositoryPolicy"}
# Conditions that hold a `*` principal to one's own organization or account.
SCOPING_KEYS = ("aws:principalorgid", "aws:principalaccount", "aws:principalorgpaths")


def check_kms(props: dict, ctx):
    configs = props.get("encryptionConfigurations")
    if configs is UNKNOWN:
        return
    kinds = [get(c, "encryptionType") for c in items(configs)]
    if UNKNOWN in kinds:
        return
    if not kinds or kinds[0] in (None, "AES256"):
        yield "images are encrypted with AES256 (ECR's default), not a KMS key"
    elif kinds[0] not in KMS_TYPES:
        yield f"encryptionType is {kinds[0]}, not KMS"


def check_scan_on_push(props: dict, ctx):
    value = get(props, "imageScanningConfiguration", "scanOnPush")
    if value is not UNKNOWN and flag(value) is not True:
        yield "imageScanningConfiguration.scanOnPush is not true: pushed images are not scanned"


def check_immutable_tags(props: dict, ctx):
    mutability = props.get("imageTagMutability")
    if mutability is not UNKNOWN and mutability != "IMMUTABLE":
        yield f"imageTagMutability is {mutability or 'MUTABLE (unset)'}: a tag can be pushed again over another image"


def _star(principal) -> bool:
    if principal == "*":
        return True
    return isinstance(principal, dict) and "*" in as_list(principal.get("AWS"))


def _scoped(condition) -> bool:
    if not isinstance(condition, dict):
        return False
    return any(str(key).lower() in SCOPING_KEYS for test in condition.values() if isinstance(test, dict)
               for key in test)


def check_no_public_policy(props: dict, ctx):
    doc = json_doc(props.get(POLICY_DOCS[ctx.resource_type]))
    if not isinstance(doc, dict):
        return
    for s in as_list(doc.get("Statement")):
        if isinstance(s, dict) and s.get("Effect") == "Allow" and _star(s.get("Principal")) \
                and not _scoped(s.get("Condition")):
            sid = f" '{s['Sid']}'" if s.get("Sid") else ""
            yield f"statement{sid} allows {', '.join(map(str, as_list(s.get('Action'))))} to any principal ('*')"


def check_admin_disabled(props: dict, ctx):
    if flag(props.get("adminUserEnabled")) is True:
        yield "adminUserEnabled is true: the admin user's shared password reaches every repository"


def check_no_public_access(props: dict, ctx):
    access = props.get("publicNetworkAccess")
    if access is not UNKNOWN and access != "Disabled":
        yield f"publicNetworkAccess is {access or 'Enabled (unset)'}"
    if flag(props.get("anonymousPullEnabled")) is True:
        yield "anonymousPullEnabled is true: anyone may pull without signing in"


POLICIES = [
    resource_policy(
        "aws-ecr-repository-kms-encrypted",
        "ECR repositories and the templates of pull-through cache repositories encrypt images with a KMS key.",
        types=[ECR_REPOSITORY, ECR_TEMPLATE], severity="high", frameworks=["CIS", "HIPAA", "GDPR"], check=check_kms,
        remediation="Set encryptionConfigurations [{encryptionType: 'KMS', kmsKey: <the stack's key ARN>}] "
                    "(a repository's encryption is fixed at creation: this replaces it)."),
    resource_policy(
        "aws-ecr-repository-scan-on-push",
        "ECR repositories scan every pushed image for known vulnerabilities.",
        types=[ECR_REPOSITORY], severity="medium", frameworks=["CIS"], check=check_scan_on_push,
        remediation="Set imageScanningConfiguration {scanOnPush: true}."),
    resource_policy(
        "aws-ecr-repository-immutable-tags",
        "ECR repositories keep tags immutable so a tag always names the image that was reviewed.",
        types=[ECR_REPOSITORY], severity="medium", frameworks=["CIS"], check=check_immutable_tags,
        remediation="Set imageTagMutability 'IMMUTABLE' and push a new tag for every build."),
    resource_policy(
        "aws-ecr-repository-no-public-policy",
        "ECR repository, registry and template policies grant nothing to a '*' principal.",
        types=list(POLICY_DOCS), severity="critical", frameworks=["CIS", "GDPR"], check=check_no_public_policy,
        remediation="Name the accounts or roles that may pull in Principal, or hold '*' to your organization "
                    "with a Condition on aws:PrincipalOrgID."),
    resource_policy(
        "azure-containerregistry-registry-admin-disabled",
        "Container registries have no admin user (pulls use Entra ID identities).",
        types=[AZ_REGISTRY], severity="high", frameworks=["CIS"], check=check_admin_disabled,
        remediation="Set adminUserEnabled false and grant the nodes' identity AcrPull on the registry."),
    resource_policy(
        "azure-containerregistry-registry-no-public-access",
        "Container registries are closed to the public network and to anonymous pulls.",
        types=[AZ_REGISTRY], severity="high", frameworks=["CIS", "GDPR"], check=check_no_public_access,
        remediation="Use the Premium tier, set publicNetworkAccess 'Disabled' and anonymousPullEnabled false, and "
                    "reach the registry through a private endpoint with the privatelink.azurecr.io zone."),
]
