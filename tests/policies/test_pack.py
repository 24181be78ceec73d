"""The pack as the Pulumi CLI sees it: metadata over GetAnalyzerInfo, config reconciliation, unknown values."""
from __future__ import annotations

import re

import pytest

from infra.config import ConfigError
from infra.preview import analyzer
from infra.preview.analyzer import PackError, PolicyPack
from tests.policies import fixtures as f
from tests.policies.conftest import names

NAME = re.compile(r"^(aws|azure|tencent)-[a-z0-9]+-[a-z0-9]+-[a-z0-9-]+$")


def test_analyzer_info_describes_every_policy(packs):
    pack = packs.get("prod")
    assert pack.info.name == "gpufleet-guardrails" and pack.info.supportsConfig
    policies = pack.policies()
    assert len(policies) == len({p["name"] for p in policies}) >= 45
    for p in policies:
        assert NAME.match(p["name"]), p["name"]
        assert p["description"].endswith(".") and p["description"].count(". ") == 0, p["name"]
        assert p["severity"] in ("low", "medium", "high", "critical")
        assert p["frameworks"] and set(p["frameworks"]) <= {"CIS", "HIPAA", "GDPR", "PIPL", "gpufleet-gpu",
                                                            "gpufleet-cost"}
        assert len(p["remediation"]) > 20
    by_name = {p["name"]: p for p in policies}
    # Security is mandatory by default, hygiene and cost advisory.
    assert by_name["aws-s3-bucket-sse-kms"]["level"] == "mandatory"
    assert by_name["aws-any-resource-cost-tags"]["level"] == "advisory"
    assert by_name["aws-slurm-partition-monthly-ceiling"]["level"] == "advisory"
    assert by_name["aws-slurm-partition-gpu-quota"]["config_schema"]["maxGpus"]["default"] == 64
    for name in ("aws-slurm-controller-hardened", "aws-secretsmanager-secret-cmk", "aws-iam-policy-bounded-launch",
                 "aws-iam-job-role-stays-in-vpc",
                 "aws-efs-filesystem-cmk-tls-only", "aws-slurm-partition-efa-cluster",
                 "azure-slurm-partition-placement", "azure-slurm-controller-hardened", "azure-network-publicip-nat-only",
                 "azure-slurm-partition-gpu-quota", "tencent-cam-policy-bounded-launch",
                 "tencent-cfs-filesystem-private-access", "tencent-ssm-secret-kms-no-value",
                 "tencent-cvm-node-no-password-login", "tencent-slurm-partition-gpu-quota"):
        assert by_name[name]["level"] == "mandatory", name
    for cloud in ("aws", "azure", "tencent"):
        assert by_name[f"{cloud}-slurm-partition-queue-scale-to-zero"]["level"] == "advisory"
        assert by_name[f"{cloud}-slurm-partition-monthly-ceiling"]["level"] == "advisory"
    assert by_name["tencent-slurm-partition-monthly-ceiling"]["config_schema"]["monthlyCeilingCny"]
    # nothing of the auto scaling groups and autoscaled scale sets the stacks no longer have
    assert not [n for n in by_name if n.startswith(("aws-autoscaling-", "azure-compute-vmss-", "tencent-as-"))]
    assert by_name["aws-s3-bucket-tls-only"]["type"] == "stack"
    assert by_name["aws-ec2-launchtemplate-imdsv2"]["type"] == "resource"


def test_all_sets_every_level_and_a_policy_overrides_it(packs):
    s = f.aws_gang()
    s.get("data-versioning")["inputs"]["versioningConfiguration"]["status"] = "Suspended"
    s.get("node")["inputs"]["metadataOptions"]["httpTokens"] = "optional"
    verdicts = packs.run("prod", s.resources, {"all": "disabled", "aws-s3-bucketversioning-enabled": "mandatory"})
    assert [(v["policy"], v["level"]) for v in verdicts["violations"]] == [
        ("aws-s3-bucketversioning-enabled", "mandatory")]
    levels = {p["name"]: p["level"] for p in verdicts["policies"]}
    assert levels["aws-ec2-launchtemplate-imdsv2"] == "disabled"
    # Configure replaces the previous config: the next run is back to the defaults.
    again = packs.run("prod", s.resources)
    assert {(v["policy"], v["level"]) for v in again["violations"]} == {
        ("aws-s3-bucketversioning-enabled", "advisory"), ("aws-ec2-launchtemplate-imdsv2", "mandatory")}


@pytest.mark.parametrize("config, key, fragment", [
    ({"aws-s3-bucket-versioning": "strict"}, "--policy-config aws-s3-bucket-versioning.enforcementLevel",
     "advisory, mandatory"),
    ({"no-such-policy": "mandatory"}, "--policy-config no-such-policy", "policy names of the pack"),
    ({"aws-slurm-partition-gpu-quota": {"maxGpus": "many"}}, "--policy-config aws-slurm-partition-gpu-quota.maxGpus",
     "is not of type 'integer'"),
    ({"aws-slurm-partition-gpu-quota": {"maxGPUs": 8}}, "--policy-config aws-slurm-partition-gpu-quota",
     "settings: maxGpus"),
    ({"aws-autoscaling-group-gpu-quota": {"maxGpus": 8}}, "--policy-config aws-autoscaling-group-gpu-quota",
     "policy names of the pack"),
    ({"all": {"enforcementLevel": "loud"}}, "--policy-config all.enforcementLevel", "one of"),
])
def test_bad_policy_config_is_one_clear_error(packs, config, key, fragment):
    with pytest.raises(ConfigError) as err:
        packs.run("prod", f.aws_gang().resources, config)
    assert err.value.key == key and fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_values_do_not_crash_or_report(packs):
    s = f.aws_gang()
    lt = s.get("node")["inputs"]
    lt["networkInterfaces"] = f.UNKNOWN
    lt["metadataOptions"] = {"httpTokens": f.UNKNOWN}
    lt["blockDeviceMappings"] = [{"deviceName": "/dev/sda1", "ebs": {"encrypted": f.UNKNOWN, "kmsKeyId": f.UNKNOWN}}]
    s.get("data-policy")["inputs"]["policy"] = f.UNKNOWN
    s.get("data-sse")["inputs"]["rules"] = f.UNKNOWN
    s.get("node-policy")["inputs"]["policy"] = f.UNKNOWN
    s.get("controller-policy")["inputs"]["policy"] = f.UNKNOWN
    part = s.get("gpu")["inputs"]
    part["maxNodes"] = part["gang"] = part["subnetIds"] = f.UNKNOWN
    s.get("cluster")["inputs"]["strategy"] = f.UNKNOWN
    controller = s.get("controller-instance")["inputs"]
    controller["metadataOptions"] = {"httpTokens": f.UNKNOWN, "httpPutResponseHopLimit": f.UNKNOWN}
    controller["rootBlockDevice"] = {"encrypted": f.UNKNOWN, "kmsKeyId": f.UNKNOWN}
    s.get("munge")["inputs"]["kmsKeyId"] = f.UNKNOWN
    s.get("shared")["inputs"].update(encrypted=f.UNKNOWN, kmsKeyId=f.UNKNOWN)
    s.get("shared-policy")["inputs"]["policy"] = f.UNKNOWN
    s.get("jobs")["inputs"]["region"] = f.UNKNOWN
    verdicts = packs.run("prod", s.resources)
    assert verdicts["violations"] == [] and verdicts["skipped"] == []


def test_unknown_values_do_not_crash_or_report_on_azure(packs):
    s = f.azure_queue(gang_nodes=2)
    for name in ("gpu", "big"):
        part = s.get(name)["inputs"]
        part["maxNodes"] = part["gang"] = part["spot"] = part["infiniband"] = f.UNKNOWN
    s.get("gpu-vmss")["inputs"].update(orchestrationMode=f.UNKNOWN, platformFaultDomainCount=f.UNKNOWN)
    s.get("big-avset")["inputs"].update(sku=f.UNKNOWN, platformFaultDomainCount=f.UNKNOWN)
    s.get("controller-vm")["inputs"].update(securityProfile=f.UNKNOWN, osProfile=f.UNKNOWN,
                                            networkProfile=f.UNKNOWN, hardwareProfile=f.UNKNOWN)
    s.get("controller-nic")["inputs"]["ipConfigurations"] = f.UNKNOWN
    s.get("shared-fs-account")["inputs"]["encryption"] = f.UNKNOWN
    verdicts = packs.run("azure", s.resources)
    assert verdicts["violations"] == [] and verdicts["skipped"] == []


def test_unknown_values_do_not_crash_or_report_on_tencent(packs):
    s = f.tencent_queue()
    part = s.get("gpu")["inputs"]
    part["maxNodes"] = part["gang"] = part["alwaysOn"] = part["onDemandBase"] = f.UNKNOWN
    s.get("node")["inputs"].update(internetAccessible=f.UNKNOWN, loginSettings=f.UNKNOWN, dataDisks=f.UNKNOWN)
    s.get("controller-instance")["inputs"].update(allocatePublicIp=f.UNKNOWN, internetMaxBandwidthOut=f.UNKNOWN)
    s.get("controller-policy")["inputs"]["document"] = f.UNKNOWN
    s.get("home")["inputs"]["accessGroupId"] = f.UNKNOWN
    s.get("home-rule-1")["inputs"].update(authClientIp=f.UNKNOWN, userPermission=f.UNKNOWN)
    s.get("munge")["inputs"]["kmsKeyId"] = f.UNKNOWN
    s.get("munge-init")["inputs"]["secretString"] = f.UNKNOWN
    verdicts = packs.run("tencent", s.resources)
    assert verdicts["violations"] == [] and verdicts["skipped"] == []


def test_unknown_does_not_hide_a_known_violation(packs):
    s = f.aws_gang()
    s.get("node")["inputs"]["metadataOptions"] = {"httpTokens": "optional", "httpPutResponseHopLimit": f.UNKNOWN}
    assert names(packs.run("prod", s.resources)) == {"aws-ec2-launchtemplate-imdsv2"}


def test_default_provider_carries_the_stack_region(packs):
    """Without an explicit provider the engine sends the default one, built from the aws:* config."""
    s = f.aws_gang()
    pack = packs.get("prod")
    provider = pack._provider(s.get("jobs"), {r["urn"]: r for r in s.resources})
    assert provider.type == "pulumi:providers:aws" and provider.name == "default"
    assert dict(provider.properties) == {"region": "eu-north-1"}


def test_gdpr_reads_the_region_from_stack_config():
    """A personal stack whose config region is outside the EU (allowed by its own allowedRegions)."""
    config = {**f.STACKS["prod"], "aws:region": "us-east-1", "gpufleet:allowedRegions": '["us-east-1"]'}
    s = f.aws_gang()
    with PolicyPack("prod", f.PROJECT, config) as pack:
        verdicts = pack.analyze(s.resources)
    regional = {v["urn"].rsplit("::", 1)[1] for v in verdicts["violations"]
                if v["policy"] == "aws-any-resource-gdpr-region"}
    assert names(verdicts) == {"aws-any-resource-gdpr-region"}
    assert {"data", "jobs", "node", "cluster", "controller-instance", "munge", "shared", "vpc"} <= regional
    assert pack.process is None  # closed by the context manager


def test_analyze_entry_point_runs_and_stops_the_pack():
    result = analyzer.analyze(f.aws_queue().resources, "dev", f.PROJECT, f.STACKS["dev"], None)
    assert result["pack"] == "gpufleet-guardrails" and result["violations"] == []
    assert result["version"] == "0.1.0" and result["policy_sdk"].startswith("1.")
    assert result["resources_analyzed"] >= 20
    assert {p["name"] for p in result["policies"]} >= {"aws-s3-bucket-sse-kms", "azure-compute-vm-ssh-keys-only"}


def test_a_pack_that_cannot_start_is_one_line(tmp_path):
    (tmp_path / "PulumiPolicy.yaml").write_text("name: broken\nruntime: python\n")
    (tmp_path / "__main__.py").write_text("raise RuntimeError('no policies here')\n")
    with pytest.raises(PackError) as err:
        PolicyPack("dev", f.PROJECT, {}, pack_dir=tmp_path).start()
    assert "did not start" in str(err.value) and "\n" not in str(err.value)


def test_pack_command_is_the_cli_shim_invocation():
    command = analyzer.pack_command()
    assert command[0].endswith(".venv/bin/python")
    assert command[1:] == ["-u", "-m", "pulumi.policy", analyzer.ENGINE_ADDRESS, "."]
    env = analyzer.pack_env("dev", "gpufleet", {"aws:region": "eu-west-1"})
    assert env["PULUMI_CONFIG"] == '{"aws:region": "eu-west-1"}'
    assert (env["PULUMI_STACK"], env["PULUMI_PROJECT"], env["PULUMI_DRY_RUN"]) == ("dev", "gpufleet", "true")
