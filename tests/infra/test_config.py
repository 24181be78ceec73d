"""The typed stack configuration: every stack file validates; every bad input is one precise line."""
from __future__ import annotations

import subprocess
import sys

import pytest

from infra import config
from tests.conftest import ROOT


def raw_dev(**overrides):
    raw, _ = config.read_stack_file(ROOT / "Pulumi.dev.yaml")
    raw = dict(raw)
    for key, value in overrides.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize("stack", ["dev", "prod", "azure", "tencent"])
def test_stack_files_validate(stack):
    raw, secrets = config.read_stack_file(ROOT / f"Pulumi.{stack}.yaml")
    cfg = config.parse(raw, stack, secrets)
    assert cfg.stack == stack
    assert cfg.all_tags["data-classification"] == cfg.data_classification
    assert cfg.nodes.min <= cfg.nodes.desired <= cfg.nodes.max


def test_dev_is_queue_spot_scale_to_zero_and_prod_is_gang_efa():
    dev = config.parse(raw_dev(), "dev")
    assert (dev.mode, dev.spot, dev.nodes.min) == ("queue", True, 0)
    assert len(dev.instance_types) > 1
    raw, _ = config.read_stack_file(ROOT / "Pulumi.prod.yaml")
    prod = config.parse(raw, "prod")
    assert prod.mode == "gang" and prod.primary.efa and prod.nodes.max > 1 and prod.multi_node


def test_config_is_frozen():
    cfg = config.parse(raw_dev(), "dev")
    with pytest.raises(Exception):
        cfg.mode = "gang"


def test_personal_data_defaults_to_eu_regions():
    cfg = config.parse(raw_dev(**{"gpufleet:dataClassification": "personal"}), "dev")
    assert "eu-west-1" in cfg.effective_allowed_regions
    assert "us-east-1" not in cfg.effective_allowed_regions
    assert config.parse(raw_dev(), "dev").effective_allowed_regions == ()


def test_engine_config_round_trip():
    """Values as the Pulumi engine hands them (strings, objects as JSON) parse to the same config."""
    raw = raw_dev()
    assert config.parse(config.to_engine_config(raw), "dev") == config.parse(raw, "dev")


CASES = [
    # (overrides, key in message, fragment of what is allowed)
    ({"gpufleet:instanceTypes": ["x9.huge"]}, "gpufleet:instanceTypes", "allowed for aws"),
    ({"gpufleet:instanceTypes": ["Standard_ND96asr_v4"]}, "gpufleet:instanceTypes", "allowed for aws"),
    ({"gpufleet:instanceTypes": []}, "gpufleet:instanceTypes", "at least 1"),
    ({"gpufleet:nodes": {"min": 3, "desired": 2, "max": 1}}, "gpufleet:nodes", "min <= desired <= max"),
    ({"gpufleet:nodes": {"min": 0, "desired": 0, "max": "four"}}, "gpufleet:nodes.max", "an integer"),
    ({"gpufleet:nodes": {"min": 0, "max": 2, "wanted": 1}}, "gpufleet:nodes.wanted", "unknown key"),
    ({"gpufleet:nodes": {"min": -1, "desired": 0, "max": 2}}, "gpufleet:nodes.min", ">= 0"),
    ({"gpufleet:spot": "sometimes"}, "gpufleet:spot", "true or false"),
    ({"gpufleet:cloud": "gcp"}, "gpufleet:cloud", "aws, azure or tencent"),
    ({"gpufleet:mode": "batch"}, "gpufleet:mode", "queue or gang"),
    ({"gpufleet:dataClassification": "secret"}, "gpufleet:dataClassification", "public"),
    ({"gpufleet:mode": "gang", "gpufleet:nodes": {"min": 2, "desired": 2, "max": 2}},
     "gpufleet:instanceTypes", "EFA"),
    ({"gpufleet:partitions": [{"name": "gpu", "instanceTypes": ["g6.xlarge"], "nodes": {"max": 2}}]},
     "gpufleet:mode", "not both"),
    ({"gpufleet:partitions": [{"name": "GPU", "instanceTypes": ["g6.xlarge"], "nodes": {"max": 2}}],
      "gpufleet:mode": None, "gpufleet:instanceTypes": None, "gpufleet:nodes": None, "gpufleet:spot": None},
     "gpufleet:partitions[0].name", "lowercase"),
    ({"gpufleet:partitions": [{"name": "a", "instanceTypes": ["g6.xlarge"], "nodes": {"max": 2}},
                              {"name": "a", "instanceTypes": ["p5.48xlarge"], "nodes": {"max": 2}, "gang": True}],
      "gpufleet:mode": None, "gpufleet:instanceTypes": None, "gpufleet:nodes": None, "gpufleet:spot": None},
     "gpufleet:partitions[1].name", "once"),
    ({"gpufleet:partitions": [{"name": "big", "instanceTypes": ["g6.xlarge"], "nodes": {"max": 2}, "gang": True}],
      "gpufleet:mode": None, "gpufleet:instanceTypes": None, "gpufleet:nodes": None, "gpufleet:spot": None},
     "gpufleet:partitions[0].instanceTypes", "EFA"),
    ({"gpufleet:partitions": [{"name": "a", "instanceTypes": ["g6.xlarge"], "nodes": {"max": 0}}],
      "gpufleet:mode": None, "gpufleet:instanceTypes": None, "gpufleet:nodes": None, "gpufleet:spot": None},
     "gpufleet:partitions[0].nodes.max", ">= 1"),
    ({"gpufleet:partitions": []}, "gpufleet:partitions", "non-empty"),
    ({"gpufleet:controller": {"instanceType": "p5.48xlarge"}}, "gpufleet:controller.instanceType", "m6i.large"),
    ({"gpufleet:controller": "big"}, "gpufleet:controller", "instanceType"),
    ({"gpufleet:dataClassification": "phi", "aws:region": "us-east-1"}, "aws:region", "must stay in"),
    ({"gpufleet:allowedRegions": ["eu-central-1"], "gpufleet:dataClassification": "personal"},
     "aws:region", "eu-central-1"),
    ({"gpufleet:budgetMonthlyUsd": 0}, "gpufleet:budgetMonthlyUsd", "> 0"),
    ({"gpufleet:budgetMonthlyUsd": "lots"}, "gpufleet:budgetMonthlyUsd", "a number"),
    ({"gpufleet:tags": {"aws:owner": "x"}}, "gpufleet:tags", "tag keys"),
    ({"gpufleet:tags": {"team": "a|b"}}, "gpufleet:tags.team", "tag values"),
    ({"gpufleet:tags": ["team"]}, "gpufleet:tags", "object"),
    ({"gpufleet:tags": {"data-classification": "public"}}, "gpufleet:tags.data-classification", "remove"),
    ({"gpufleet:image": {"id": "ami-XYZ"}}, "gpufleet:image.id", "ami-"),
    ({"gpufleet:image": {"id": "ami-0123456789abcdef0", "name": "x"}}, "gpufleet:image", "exactly one"),
    ({"gpufleet:image": None}, "gpufleet:image", "{id: ami-...}"),
    ({"gpufleet:onDemandBase": 9}, "gpufleet:onDemandBase", "at most nodes.max"),
    ({"gpufleet:alertEmails": ["not-an-address"]}, "gpufleet:alertEmails", "e-mail"),
    ({"gpufleet:alerts": [{"email": "ops@example.com", "https": "https://x.example.com"}]}, "gpufleet:alerts.0",
     "exactly one of email, https or chat"),
    ({"gpufleet:alerts": [{}]}, "gpufleet:alerts.0", "exactly one"),
    ({"gpufleet:alerts": [{"https": "http://pager.example.com/sns"}]}, "gpufleet:alerts.0.https", "https:// URL"),
    ({"gpufleet:alerts": [{"chat": "hooks.slack.com/x"}]}, "gpufleet:alerts.0.chat", "https:// URL"),
    ({"gpufleet:alerts": [{"email": "ops"}]}, "gpufleet:alerts.0.email", "e-mail"),
    ({"gpufleet:alerts": [{"pager": "x"}]}, "gpufleet:alerts.0.pager", "unknown key"),
    ({"gpufleet:alerts": "ops@example.com"}, "gpufleet:alerts", "a list"),
    ({"gpufleet:instanceTpyes": ["g5.xlarge"]}, "gpufleet:instanceTpyes", "known keys"),
    ({"aws:region": None}, "aws:region", "set the provider region"),
]


@pytest.mark.parametrize("overrides,key,allowed", CASES, ids=[c[1] + ":" + c[2] for c in CASES])
def test_bad_input_is_one_line_naming_key_value_and_allowed(overrides, key, allowed):
    with pytest.raises(config.ConfigError) as info:
        config.parse(raw_dev(**overrides), "dev")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(key + ":"), message
    assert allowed in message, message


def test_alert_recipients_merge_emails_and_alerts_once():
    cfg = config.parse(raw_dev(**{"gpufleet:alertEmails": ["ops@example.com"], "gpufleet:alerts": [
        {"email": "ops@example.com"}, {"https": "https://pager.example.com/sns"},
        {"chat": "https://hooks.example.com/services/T0/B0/x"}]}), "dev")
    assert [(a.kind, a.endpoint) for a in cfg.alert_targets] == [
        ("email", "ops@example.com"), ("https", "https://pager.example.com/sns"),
        ("chat", "https://hooks.example.com/services/T0/B0/x")]
    assert cfg.warnings == ()


@pytest.mark.parametrize("stack", ["dev", "prod", "azure"])
def test_a_stack_without_alert_recipients_is_warned(stack):
    raw, secrets = config.read_stack_file(ROOT / f"Pulumi.{stack}.yaml")
    cfg = config.parse(raw, stack, secrets)
    assert cfg.alert_targets == () and cfg.warnings == (config.ALERTS_NOBODY,)
    assert config.ALERTS_NOBODY.startswith("alerts reach nobody: set gpufleet:alertEmails")


def test_tencent_is_not_told_to_set_keys_it_refuses():
    """Tencent refuses alertEmails and alerts (Cloud Monitor notifies the stack's CAM alert group)."""
    raw, secrets = config.read_stack_file(ROOT / "Pulumi.tencent.yaml")
    assert config.parse(raw, "tencent", secrets).warnings == ()


def test_chat_webhooks_are_aws_only():
    raw, _ = config.read_stack_file(ROOT / "Pulumi.azure.yaml")
    with pytest.raises(config.ConfigError, match=r"^gpufleet:alerts.0.chat: .*supported on aws"):
        config.parse({**raw, "gpufleet:alerts": [{"chat": "https://hooks.example.com/x"}]}, "azure")
    cfg = config.parse({**raw, "gpufleet:alerts": [{"https": "https://pager.example.com/azure"}]}, "azure")
    assert [a.kind for a in cfg.alert_targets] == ["https"]


def test_secret_values_are_never_printed():
    raw = raw_dev(**{"gpufleet:budgetMonthlyUsd": "s3cr3t-value"})
    with pytest.raises(config.ConfigError) as info:
        config.parse(raw, "dev", frozenset({"gpufleet:budgetMonthlyUsd"}))
    assert "s3cr3t-value" not in str(info.value) and "[secret]" in str(info.value)
    # A cross-field check names the value too: masked the same way.
    raw, _ = config.read_stack_file(ROOT / "Pulumi.azure.yaml")
    with pytest.raises(config.ConfigError) as info:
        config.parse({**raw, "gpufleet:sshPublicKey": "hunter2-private"}, "azure",
                     frozenset({"gpufleet:sshPublicKey"}))
    assert "hunter2" not in str(info.value) and "[secret]" in str(info.value)


def test_secure_values_in_stack_files_are_recognised(tmp_path):
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text((ROOT / "Pulumi.dev.yaml").read_text()
                    + "  gpufleet:sshPublicKey:\n    secure: AAABAJ0xciphertext\n")
    raw, secrets = config.read_stack_file(path)
    assert "gpufleet:sshPublicKey" in secrets


def test_azure_requires_ssh_key_and_urn_or_gallery_image():
    raw, _ = config.read_stack_file(ROOT / "Pulumi.azure.yaml")
    with pytest.raises(config.ConfigError, match=r"^gpufleet:sshPublicKey: .*SSH keys only"):
        config.parse({**raw, "gpufleet:sshPublicKey": "hunter2"}, "azure")
    with pytest.raises(config.ConfigError, match=r"^gpufleet:image: .*marketplace URN"):
        config.parse({**raw, "gpufleet:image": "ubuntu"}, "azure")
    gallery = ("/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/gpu"
               "/versions/1.0.0")
    assert config.parse({**raw, "gpufleet:image": gallery}, "azure").image == gallery


@pytest.mark.parametrize("content,fragment", [
    (None, "readable Pulumi stack file"),
    ("config: [unclosed", "valid YAML"),
    ("config: 3\n", "a map"),
])
def test_bad_files(tmp_path, content, fragment):
    path = tmp_path / "Pulumi.x.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(config.ConfigError, match=fragment):
        config.read_stack_file(path)


def test_program_entry_reports_config_errors_in_one_line(tmp_path):
    """Under the Pulumi host the program reads config from PULUMI_CONFIG; a bad value is one line, exit 2."""
    script = (
        "import runpy, sys\n"
        "from pulumi.runtime import mocks\n"
        "class M(mocks.Mocks):\n"
        "    def new_resource(self, a): return [a.name + '_id', a.inputs]\n"
        "    def call(self, a): return {}\n"
        "mocks.set_mocks(M(), 'gpufleet', 'dev', True)\n"
        f"runpy.run_path({str(ROOT / 'infra' / '__main__.py')!r}, run_name='__main__')\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PULUMI_CONFIG": '{"gpufleet:cloud": "aws", "gpufleet:mode": "nope",'
           ' "aws:region": "eu-west-1"}'}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: gpufleet:mode: 'nope'")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("override,fragment", [
    ({"gpufleet:mode": "gang", "gpufleet:nodes": {"min": 0, "max": 201}, "gpufleet:spot": False},
     r"^gpufleet:nodes: .*at most 200 on azure for a gang partition"),
    ({"gpufleet:mode": "gang", "gpufleet:nodes": {"min": 0, "max": 2}},
     r"^gpufleet:spot: true is not allowed; false for a gang partition on azure"),
    ({"gpufleet:instanceTypes": ["Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4"]},
     r"^gpufleet:instanceTypes: .*one size on azure"),
])
def test_azure_partition_limits_are_config_errors(override, fragment):
    raw, _ = config.read_stack_file(ROOT / "Pulumi.azure.yaml")
    with pytest.raises(config.ConfigError, match=fragment):
        config.parse({**raw, **override}, "azure")
    # a queue partition holds up to 1000 nodes (a Flexible scale set's)
    assert config.parse({**raw, "gpufleet:nodes": {"min": 0, "max": 500}}, "azure").partitions[0].nodes.max == 500


def raw_tencent(**overrides):
    raw, _ = config.read_stack_file(ROOT / "Pulumi.tencent.yaml")
    return {**raw, **overrides}


def test_tencent_prices_and_budget_are_in_cny_and_personal_data_stays_in_mainland_china():
    cfg = config.parse(raw_tencent(), "tencent")
    assert (cfg.cloud, cfg.region, cfg.currency, cfg.budget_monthly) == ("tencent", "ap-shanghai", "CNY", 300000)
    assert cfg.effective_allowed_regions == config.MAINLAND_CHINA_REGIONS
    assert "ap-hongkong" not in cfg.effective_allowed_regions
    assert config.parse(raw_tencent(**{"gpufleet:dataClassification": "internal"}), "tencent").effective_allowed_regions == ()
    assert cfg.image.name == "^gpufleet-gpu-" and cfg.image.id is None
    dev = config.parse(raw_dev(), "dev")
    assert (dev.currency, dev.budget_monthly) == ("USD", dev.budget_monthly_usd)


TENCENT_CASES = [
    ({"tencentcloud:region": "ap-singapore"}, "tencentcloud:region", "personal data must stay in: ap-beijing"),
    ({"tencentcloud:region": "mars-1", "gpufleet:dataClassification": "internal"}, "tencentcloud:region",
     "one of ap-guangzhou"),
    ({"tencentcloud:region": None}, "tencentcloud:region", "e.g. ap-shanghai"),
    ({"gpufleet:dataClassification": "phi"}, "gpufleet:dataClassification", "does not offer"),
    ({"gpufleet:budgetMonthlyUsd": 1000}, "gpufleet:budgetMonthlyUsd", "set gpufleet:budgetMonthlyCny instead"),
    ({"gpufleet:budgetMonthlyCny": None}, "gpufleet:budgetMonthlyCny", "in CNY"),
    ({"gpufleet:instanceTypes": ["p5.48xlarge"]}, "gpufleet:instanceTypes", "allowed for tencent: GN10Xp.2XLARGE40"),
    ({"gpufleet:image": {"id": "ami-0123456789abcdef0"}}, "gpufleet:image.id", "img-"),
    ({"gpufleet:image": "img-0a1b2c3d"}, "gpufleet:image", "{id: img-...}"),
    ({"gpufleet:alertEmails": ["ops@example.com"]}, "gpufleet:alertEmails", "CAM users and groups"),
    ({"gpufleet:tags": {"qcloud:owner": "x"}}, "gpufleet:tags", "not starting with qcloud"),
    ({"gpufleet:network": {"vpcId": "vpc-0123456789abcdef0", "subnetIds": ["subnet-1"]}}, "gpufleet:network",
     "aws only"),
]


@pytest.mark.parametrize("overrides,key,allowed", TENCENT_CASES, ids=[c[1] + ":" + c[2] for c in TENCENT_CASES])
def test_bad_tencent_input_is_one_line(overrides, key, allowed):
    raw = {k: v for k, v in raw_tencent(**overrides).items() if v is not None}
    with pytest.raises(config.ConfigError) as info:
        config.parse(raw, "tencent")
    message = str(info.value)
    assert "\n" not in message and message.startswith(key + ":") and allowed in message, message


def test_budget_in_the_wrong_currency_is_refused_on_aws_too():
    with pytest.raises(config.ConfigError, match=r"^gpufleet:budgetMonthlyCny: .*aws prices are in USD"):
        config.parse(raw_dev(**{"gpufleet:budgetMonthlyCny": 20000}), "dev")


def test_a_tencent_gang_runs_nccl_over_tcp_on_one_type():
    cfg = config.parse(raw_tencent(**{"gpufleet:mode": "gang", "gpufleet:instanceTypes": ["GT4.41XLARGE948"],
                                      "gpufleet:nodes": {"min": 2, "desired": 2, "max": 2}}), "tencent")
    assert cfg.multi_node and not cfg.primary.rdma


def test_teams_default_to_one_and_dev_names_two_with_shares_and_a_gpu_limit():
    assert config.parse(raw_dev(**{"gpufleet:teams": None}), "dev").teams == (config.Team(name="default"),)
    dev = config.parse(raw_dev(), "dev")
    assert [t.as_json() for t in dev.teams] == [{"name": "vision", "fair_share": 2, "gpu_limit": None},
                                                {"name": "nlp", "fair_share": 1, "gpu_limit": 1}]


@pytest.mark.parametrize("teams, message", [
    ([], "gpufleet:teams: [] is not allowed; at least one team {name, fairShare, gpuLimit} (or leave the key out: "
         "one team, default)"),
    ([{"name": "ml\n"}], "gpufleet:teams.0.name: 'ml\\n' is not allowed; 1-15 lowercase letters and digits, "
                         "starting with a letter (a team is a Slurm account of that name)"),
    ([{"name": "ml"}, {"name": "ml"}], "gpufleet:teams: [\"ml\"] is not allowed; each team name once"),
    ([{"name": "ml", "fairShare": 0}], "gpufleet:teams.0.fairShare: 0 is not allowed; a number >= 1"),
    ([{"name": "ml", "gpuLimit": -1}], "gpufleet:teams.0.gpuLimit: -1 is not allowed; a number >= 0"),
    ([{"name": "ml", "gpus": 4}], "gpufleet:teams.0.gpus: 4 is not allowed; unknown key"),
    ([{"name": "t70"}, {"name": "t255"}], 'gpufleet:teams: ["t70", "t255"] is not allowed; teams t70 and t255 would '
                                          'have one Unix uid (52875); rename one'),  # trainer.slurm.users' hash
])
def test_a_bad_team_is_one_line(teams, message):
    with pytest.raises(config.ConfigError) as exc:
        config.parse(raw_dev(**{"gpufleet:teams": teams}), "dev")
    assert str(exc.value) == message
