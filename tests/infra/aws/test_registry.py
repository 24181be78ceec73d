"""The stack's container registry on Pulumi's mock runtime: the ECR repository, the pull-through cache rules of
`gpufleet:pullThrough`, the private path to them and a node role that may pull from them only."""
from __future__ import annotations

import json

import pytest

from infra import config
from infra.aws import registry
from tests.conftest import ROOT
from tests.infra.aws.harness import ACCOUNT, build_stack, stack_config
from tests.infra.test_config import raw_dev

REPO = "aws:ecr/repository:Repository"
LIFECYCLE = "aws:ecr/lifecyclePolicy:LifecyclePolicy"
RULE = "aws:ecr/pullThroughCacheRule:PullThroughCacheRule"
TEMPLATE = "aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate"


@pytest.fixture(params=["dev", "prod"])
def built(request):
    return request.getfixturevalue(request.param)


def _node_policy(b) -> dict:
    return json.loads(b.one("aws:iam/rolePolicy:RolePolicy", "-node-policy").inputs["policy"])


def test_the_shipped_stacks_cache_public_registries():
    assert [(r.prefix, r.upstream) for r in stack_config("dev").pull_through] == [
        ("ecr-public", "public.ecr.aws"), ("k8s", "registry.k8s.io")]
    prod = stack_config("prod").pull_through
    assert [(r.prefix, r.upstream, r.credential_secret) for r in prod] == [
        ("ecr-public", "public.ecr.aws", None),
        ("docker-hub", "registry-1.docker.io", "ecr-pullthroughcache/docker-hub")]


def test_repository_is_immutable_scanned_and_encrypted_with_the_stack_key(built):
    repo = built.one(REPO)
    stack = built.cfg.stack
    assert repo.inputs["name"] == f"gpufleet-{stack}"
    assert repo.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repo.inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repo.inputs["encryptionConfigurations"] == [{"encryptionType": "KMS", "kmsKey": built.outputs["kmsKey"]}]
    assert repo.inputs["forceDelete"] is False
    assert repo.inputs["tags"] == built.cfg.all_tags
    url = f"{ACCOUNT}.dkr.ecr.{built.cfg.region}.amazonaws.com/gpufleet-{stack}"
    assert built.outputs["registry"] == repo.state["repositoryUrl"] == url
    assert registry.repository_url(ACCOUNT, built.cfg.region, f"gpufleet-{stack}") == url
    assert built.node_json()["registry"] == url


def test_lifecycle_expires_untagged_images_and_keeps_the_newest(built):
    lifecycle = built.one(LIFECYCLE)
    assert lifecycle.inputs["repository"] == built.one(REPO).state["name"]
    first, last = json.loads(lifecycle.inputs["policy"])["rules"]
    assert first["selection"] == {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days",
                                  "countNumber": registry.UNTAGGED_DAYS}
    # a rule on any tag status must come last (highest rulePriority)
    assert (first["rulePriority"], last["rulePriority"]) == (1, 2)
    assert last["selection"] == {"tagStatus": "any", "countType": "imageCountMoreThan",
                                 "countNumber": registry.KEEP_IMAGES}
    assert {first["action"]["type"], last["action"]["type"]} == {"expire"}


def test_a_cache_rule_and_a_creation_template_per_configured_upstream(built):
    # the mock runtime records resources as their registrations finish, so their order is not the program's
    rules = {r.inputs["ecrRepositoryPrefix"]: r.inputs for r in built.of_type(RULE)}
    templates = {t.inputs["prefix"]: t.inputs for t in built.of_type(TEMPLATE)}
    wanted = sorted(r.prefix for r in built.cfg.pull_through)
    assert len(built.of_type(RULE)) == len(built.of_type(TEMPLATE)) == len(wanted)
    assert sorted(rules) == sorted(templates) == wanted
    role = built.one("aws:iam/role:Role", "ecr-templates")
    for want in built.cfg.pull_through:
        rule = rules[want.prefix]
        assert rule["upstreamRegistryUrl"] == want.upstream
        if want.credential_secret:
            # the secret's full ARN, looked up by name (ECR takes only secrets named ecr-pullthroughcache/...)
            assert rule["credentialArn"].startswith(
                f"arn:aws:secretsmanager:{built.cfg.region}:{ACCOUNT}:secret:{want.credential_secret}-")
        else:
            assert "credentialArn" not in rule
        template = templates[want.prefix]
        assert template["appliedFors"] == ["PULL_THROUGH_CACHE"]
        assert template["encryptionConfigurations"] == [{"encryptionType": "KMS", "kmsKey": built.outputs["kmsKey"]}]
        assert template["imageTagMutability"] == "MUTABLE"   # a cache follows its upstream's tags
        assert json.loads(template["lifecyclePolicy"]) == registry.lifecycle_policy()
        assert template["customRoleArn"] == role.state["arn"]
        assert template["resourceTags"] == built.cfg.all_tags and "repositoryPolicy" not in template
    (trust,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"] == {"Service": "ecr.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}
    (inline,) = [p for p in built.of_type("aws:iam/rolePolicy:RolePolicy") if p.inputs["role"] == role.state["name"]]
    create, grant, key = json.loads(inline.inputs["policy"])["Statement"]
    assert create["Action"] == ["ecr:CreateRepository", "ecr:TagResource"]
    assert create["Resource"] == [f"arn:aws:ecr:{built.cfg.region}:{ACCOUNT}:repository/{r.prefix}/*"
                                  for r in built.cfg.pull_through]
    # ECR gets grants on the stack key only for the repositories it creates (an AWS resource), as AWS's guide
    # for service grants has it; describing the key and retiring grants give nothing and stay unconditioned
    assert (grant["Action"], grant["Resource"]) == ("kms:CreateGrant", built.outputs["kmsKey"])
    assert grant["Condition"] == {"Bool": {"kms:GrantIsForAWSResource": "true"}}
    assert (key["Action"], key["Resource"]) == (["kms:DescribeKey", "kms:RetireGrant"], built.outputs["kmsKey"])
    assert "Condition" not in key


def test_nodes_reach_ecr_over_private_endpoints_and_layers_over_the_s3_gateway(built):
    region = built.cfg.region
    endpoints = {r.inputs["serviceName"]: r.inputs for r in built.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")}
    for service in ("ecr.api", "ecr.dkr"):
        ep = endpoints[f"com.amazonaws.{region}.{service}"]
        assert ep["vpcEndpointType"] == "Interface" and ep["privateDnsEnabled"] is True
        assert ep["subnetIds"] == built.outputs["subnetIds"]
    assert endpoints[f"com.amazonaws.{region}.s3"]["vpcEndpointType"] == "Gateway"
    assert registry.layer_bucket_arn(region) == f"arn:aws:s3:::prod-{region}-starport-layer-bucket"
    assert registry.layer_bucket_arn("cn-north-1") == "arn:aws-cn:s3:::prod-cn-north-1-starport-layer-bucket"


def test_node_role_pulls_from_the_stack_repositories_only(built):
    region, stack = built.cfg.region, built.cfg.stack
    statements = {st.get("Sid"): st for st in _node_policy(built)["Statement"]}
    ecr = [st for st in statements.values() if "ecr:" in json.dumps(st["Action"])]
    cached = [f"arn:aws:ecr:{region}:{ACCOUNT}:repository/{r.prefix}/*" for r in built.cfg.pull_through]
    assert statements["RegistryLogin"] == {"Sid": "RegistryLogin", "Effect": "Allow",
                                           "Action": "ecr:GetAuthorizationToken", "Resource": "*"}
    assert statements["PullStackImages"]["Action"] == [
        "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
    assert statements["PullStackImages"]["Resource"] == [built.one(REPO).state["arn"], *cached]
    # the first pull through a rule imports the upstream image into a repository it may create
    assert statements["FillPullThroughCache"]["Action"] == ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]
    assert statements["FillPullThroughCache"]["Resource"] == cached
    assert len(ecr) == 3
    granted = {a for st in ecr for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}
    assert not granted & {"ecr:PutImage", "ecr:InitiateLayerUpload", "ecr:DeleteRepository",
                          "ecr:SetRepositoryPolicy", "ecr:BatchDeleteImage"}
    # encrypted layers: the node role already decrypts with the stack key
    assert statements["UseStackKey"]["Resource"] == built.outputs["kmsKey"]
    assert "kms:Decrypt" in statements["UseStackKey"]["Action"]
    assert f"gpufleet-{stack}" in built.outputs["registry"]


def test_without_pull_through_only_the_stack_repository():
    b = build_stack(stack_config("dev", {"gpufleet:pullThrough": []}))
    assert b.of_type(RULE) == b.of_type(TEMPLATE) == []
    assert not [r for r in b.of_type("aws:iam/role:Role") if "ecr-templates" in r.name]
    statements = {st.get("Sid"): st for st in _node_policy(b)["Statement"]}
    assert statements["PullStackImages"]["Resource"] == [b.one(REPO).state["arn"]]
    assert "FillPullThroughCache" not in statements
    assert b.one(REPO).inputs["imageTagMutability"] == "IMMUTABLE"


def test_an_existing_network_keeps_the_registry_but_adds_no_endpoint():
    b = build_stack(stack_config("dev", {"gpufleet:network": {
        "vpcId": "vpc-0123456789abcdef0", "subnetIds": ["subnet-0aaaaaaaaaaaaaaa1"]}}))
    assert b.of_type("aws:ec2/vpcEndpoint:VpcEndpoint") == []
    assert b.outputs["registry"].endswith("/gpufleet-dev") and len(b.of_type(RULE)) == 2


def test_pure_derivations():
    assert registry.repository_name("gpufleet-Team1") == "gpufleet-team1"
    assert registry.cached_repositories_arn("eu-west-1", ACCOUNT, "ecr-public") == (
        f"arn:aws:ecr:eu-west-1:{ACCOUNT}:repository/ecr-public/*")
    assert registry.repository_url(ACCOUNT, "cn-north-1", "x") == f"{ACCOUNT}.dkr.ecr.cn-north-1.amazonaws.com.cn/x"
    assert [s["Sid"] for s in registry.pull_statements("eu-west-1", ACCOUNT, "gpufleet-dev", [])] == [
        "RegistryLogin", "PullStackImages"]


# --- gpufleet:pullThrough -----------------------------------------------------------------------

HUB = {"prefix": "docker-hub", "upstream": "registry-1.docker.io"}
SECRET_ARN = f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:ecr-pullthroughcache/hub-AbCdEf"


@pytest.mark.parametrize("rules", [
    [{"prefix": "quay", "upstream": "quay.io"}],
    [{**HUB, "credentialSecret": "ecr-pullthroughcache/hub"}],
    [{**HUB, "credentialSecret": SECRET_ARN}],
    [{"prefix": "team/acr", "upstream": "myteamregistry.azurecr.io", "credentialSecret": "ecr-pullthroughcache/acr"}],
    [{"prefix": "ghcr", "upstream": "ghcr.io", "credentialSecret": "ecr-pullthroughcache/ghcr"},
     {"prefix": "ghcr2", "upstream": "ghcr.io", "credentialSecret": "ecr-pullthroughcache/ghcr2"}],
])
def test_valid_pull_through_rules(rules):
    cfg = config.parse(raw_dev(**{"gpufleet:pullThrough": rules}), "dev")
    assert [r.model_dump(by_alias=True, exclude_none=True) for r in cfg.pull_through] == rules


def test_an_arn_given_secret_is_used_without_a_lookup():
    b = build_stack(stack_config("dev", {"gpufleet:pullThrough": [{**HUB, "credentialSecret": SECRET_ARN}]}))
    assert b.one(RULE).inputs["credentialArn"] == SECRET_ARN
    assert not [t for t, _ in b.calls if t.startswith("aws:secretsmanager")]


BAD = [
    ({"prefix": "ngc", "upstream": "nvcr.io", "credentialSecret": "ecr-pullthroughcache/ngc"},
     "gpufleet:pullThrough[0].upstream", "no pull-through cache for NGC"),
    ({"prefix": "hub", "upstream": "docker.io"}, "gpufleet:pullThrough[0].upstream", "registry-1.docker.io"),
    ({"prefix": "x1", "upstream": "registry.example.com"}, "gpufleet:pullThrough[0].upstream", "public.ecr.aws"),
    (HUB, "gpufleet:pullThrough[0].credentialSecret", "needs credentials"),
    ({**HUB, "credentialSecret": "dockerhub"}, "gpufleet:pullThrough[0].credentialSecret", "ecr-pullthroughcache/"),
    ({**HUB, "credentialSecret": "arn:aws:secretsmanager:eu-west-1:123:secret:x"},
     "gpufleet:pullThrough[0].credentialSecret", "ecr-pullthroughcache/"),
    ({"prefix": "k8s", "upstream": "registry.k8s.io", "credentialSecret": "ecr-pullthroughcache/k8s"},
     "gpufleet:pullThrough[0].credentialSecret", "without credentials"),
    ({"prefix": "Public", "upstream": "public.ecr.aws"}, "gpufleet:pullThrough[0].prefix", "lowercase"),
    ({"prefix": "ROOT", "upstream": "public.ecr.aws"}, "gpufleet:pullThrough[0].prefix", "lowercase"),
    ({"prefix": "p", "upstream": "public.ecr.aws"}, "gpufleet:pullThrough[0].prefix", "at least 2"),
    ({"prefix": "p" * 31, "upstream": "public.ecr.aws"}, "gpufleet:pullThrough[0].prefix", "at most 30"),
    ({"upstream": "public.ecr.aws"}, "gpufleet:pullThrough[0].prefix", "required"),
    ({"prefix": "pub", "upstream": "public.ecr.aws", "region": "us-east-1"}, "gpufleet:pullThrough[0].region",
     "unknown key"),
    ("public.ecr.aws", "gpufleet:pullThrough[0]", "an object"),
]


@pytest.mark.parametrize("entry,key,allowed", BAD, ids=[f"{b[1]}:{b[2]}" for b in BAD])
def test_bad_pull_through_rule_is_one_line(entry, key, allowed):
    with pytest.raises(config.ConfigError) as info:
        config.parse(raw_dev(**{"gpufleet:pullThrough": [entry]}), "dev")
    message = str(info.value)
    assert "\n" not in message and message.startswith(key + ":"), message
    assert allowed in message, message


def test_overlapping_prefixes_and_other_shapes_are_refused():
    with pytest.raises(config.ConfigError, match=r"^gpufleet:pullThrough\[1\]\.prefix: 'quay/x' .* apart from 'quay'"):
        config.parse(raw_dev(**{"gpufleet:pullThrough": [{"prefix": "quay", "upstream": "quay.io"},
                                                          {"prefix": "quay/x", "upstream": "quay.io"}]}), "dev")
    with pytest.raises(config.ConfigError, match=r"^gpufleet:pullThrough: .* a list of"):
        config.parse(raw_dev(**{"gpufleet:pullThrough": {"prefix": "quay"}}), "dev")
    raw, secrets = config.read_stack_file(ROOT / "Pulumi.azure.yaml")
    with pytest.raises(config.ConfigError, match=r"^gpufleet:pullThrough: .* aws only"):
        config.parse({**raw, "gpufleet:pullThrough": [{"prefix": "quay", "upstream": "quay.io"}]}, "azure", secrets)
