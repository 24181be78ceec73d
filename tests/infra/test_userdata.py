"""User-data: cloud-config that cloud-init accepts, writes node.json exactly, and starts the units in order."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.userdata import AWS_USER_DATA_LIMIT, NODE_JSON_PATH, UNITS, render_user_data

ROOT = Path(__file__).resolve().parents[2]

AWS_NODE = {
    "cloud": "aws", "stack": "prod", "region": "eu-north-1", "mode": "gang", "node_count": 4,
    "bucket": "gpufleet-prod-data-123456789012", "queue_url": "https://sqs.eu-north-1.amazonaws.com/123456789012/gpufleet-prod-jobs",
    "asg_name": "gpufleet-prod-nodes", "log_group": "/gpufleet/prod", "metric_namespace": "gpufleet/prod",
    "instance_types": {"p5.48xlarge": {"gpus": 8, "efa": 32, "nvswitch": True, "infiniband_gbps": 0}},
    "launch_hook": "gpufleet-prod-preflight", "terminate_hook": "gpufleet-prod-checkpoint",
}
AZURE_NODE = {
    "cloud": "azure", "stack": "azure", "region": "westeurope", "mode": "queue", "node_count": 4,
    "bucket": "https://gpufleetazure.blob.core.windows.net/data", "queue_url": "https://gpufleetazure.queue.core.windows.net/jobs",
    "asg_name": "gpufleet-azure-nodes", "log_group": "/gpufleet/azure", "metric_namespace": "gpufleet/azure",
    "instance_types": {"Standard_ND96asr_v4": {"gpus": 8, "efa": 0, "nvswitch": True, "infiniband_gbps": 1600}},
    "launch_hook": None, "terminate_hook": None,
    "azure": {"client_id": "0f0e0d0c-0000-4000-8000-000000000001", "resource_group": "gpufleet-azure",
              "subscription_id": "00000000-0000-4000-8000-000000000000"},
}


def cloud_init_schema(text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    tool = shutil.which("cloud-init")
    if tool is None:
        pytest.fail("cloud-init is not installed; `make tools` installs it from Debian's packages", pytrace=False)
    path = tmp_path / "user-data"
    path.write_text(text)
    return subprocess.run([tool, "schema", "--config-file", str(path)], capture_output=True, text=True, timeout=60)


def node_json(text: str) -> dict:
    files = yaml.safe_load(text)["write_files"]
    entry = next(f for f in files if f["path"] == NODE_JSON_PATH)
    assert entry["owner"] == "root:root" and entry["permissions"] == "0644"
    return json.loads(entry["content"])


@pytest.mark.parametrize("node", [AWS_NODE, AZURE_NODE], ids=["aws", "azure"])
def test_cloud_init_accepts_the_user_data(node, tmp_path):
    text = render_user_data(node)
    assert text.startswith("#cloud-config\n")
    result = cloud_init_schema(text, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Valid cloud-config" in result.stdout


def test_cloud_init_schema_check_can_fail(tmp_path):
    broken = render_user_data(AWS_NODE).replace("path: /etc/gpufleet/node.json", "paht: /etc/gpufleet/node.json")
    assert cloud_init_schema(broken, tmp_path).returncode != 0


@pytest.mark.parametrize("node", [AWS_NODE, AZURE_NODE], ids=["aws", "azure"])
def test_node_json_round_trips(node):
    assert node_json(render_user_data(node)) == node


def test_awkward_values_survive_yaml():
    node = copy.deepcopy(AWS_NODE)
    node["stack"] = 'dev: "quoted" # not a comment\n- not a list'
    assert node_json(render_user_data(node)) == node


def test_hooks_default_to_null():
    node = {k: v for k, v in AWS_NODE.items() if k not in ("launch_hook", "terminate_hook")}
    settings = node_json(render_user_data(node))
    assert settings["launch_hook"] is None and settings["terminate_hook"] is None


def test_units_are_enabled_then_started_preflight_first():
    runcmd = yaml.safe_load(render_user_data(AWS_NODE))["runcmd"]
    assert ["systemctl", "enable", *UNITS] in runcmd
    start = next(cmd for cmd in runcmd if cmd[:2] == ["systemctl", "start"])
    assert start[-2:] == ["gpufleet-preflight.service", "gpufleet-agent.service"]
    assert runcmd.index(["systemctl", "daemon-reload"]) < runcmd.index(start)
    unit_files = {p.name for p in (ROOT / "ami" / "systemd").glob("*.service")}
    assert set(UNITS) <= unit_files


@pytest.mark.parametrize("change, message", [
    ({"cloud": "gcp"}, "node.cloud: 'gcp' is not one of aws, azure, tencent"),
    ({"mode": "batch"}, "node.mode: 'batch' is not one of queue, gang"),
    ({"instance_types": {}}, "node.instance_types"),
    ({"aws_secret_access_key": "x"}, "node.aws_secret_access_key: secrets do not belong in user-data"),
    ({"queue_url": "https://a.queue.core.windows.net/jobs?sv=2023&sig=abc"}, "node.queue_url: a SAS-signed URL"),
])
def test_bad_or_secret_settings_are_refused(change, message):
    with pytest.raises(ValueError) as err:
        render_user_data({**AWS_NODE, **change})
    assert message in str(err.value)


def test_the_key_vault_is_a_name_or_null():
    assert "gfazure-0a1b2c3d" in render_user_data({**AZURE_NODE, "azure": {**AZURE_NODE["azure"],
                                                                           "key_vault": "gfazure-0a1b2c3d"}})
    with pytest.raises(ValueError, match="node.azure.key_vault: expected a Key Vault name or null, got a list"):
        render_user_data({**AZURE_NODE, "azure": {**AZURE_NODE["azure"], "key_vault": ["kv"]}})


def test_missing_settings_are_named():
    node = {k: v for k, v in AWS_NODE.items() if k not in ("bucket", "queue_url")}
    with pytest.raises(ValueError, match="missing bucket, queue_url"):
        render_user_data(node)
    with pytest.raises(ValueError, match="node.azure: missing client_id"):
        render_user_data({**AZURE_NODE, "azure": {"resource_group": "rg", "subscription_id": "s"}})
    tencent = dict(_stack_nodes())["tencent"]
    with pytest.raises(ValueError, match="node.tencent: missing role_name"):
        render_user_data({**tencent, "tencent": {"app_id": "1250000000", "cos_endpoint": "https://cos"}})


def test_aws_user_data_size_limit():
    many = {f"g{i}.48xlarge": {"gpus": 8, "efa": 32, "nvswitch": True, "infiniband_gbps": 0} for i in range(300)}
    with pytest.raises(ValueError, match=f"EC2 accepts at most {AWS_USER_DATA_LIMIT}"):
        render_user_data({**AWS_NODE, "instance_types": many})


def _stack_nodes():
    """node.json of every Pulumi.<stack>.yaml, from the stacks' own node_settings."""
    from infra import config

    for path in sorted(ROOT.glob("Pulumi.*.yaml")):
        stack = path.name.split(".")[1]
        raw, secrets = config.read_stack_file(path)
        cfg = config.parse(raw, stack, secrets)
        if cfg.cloud == "aws":
            from infra.aws.stack import Names, node_settings

            node = node_settings(cfg, Names.of(stack), cfg.multi_node, f"gpufleet-{stack}-data",
                                 f"https://sqs.{cfg.region}.amazonaws.com/123456789012/gpufleet-{stack}-jobs")
        elif cfg.cloud == "tencent":
            from infra.tencent import derive

            node = derive.node_settings(cfg, derive.Names.of(stack), bucket=f"gpufleet-{stack}-data-1250000000",
                                        app_id="1250000000", log_topic="8e1e679e-d520-4efa-8266-0fc8e6986583")
        else:
            from infra.azure.derive import node_settings

            node = node_settings(cfg, container_url="https://acct.blob.core.windows.net/data",
                                 queue_url="https://acct.queue.core.windows.net/jobs", scale_set=f"gpufleet-{stack}",
                                 client_id="0f0e0d0c-0000-4000-8000-000000000001", resource_group=f"gpufleet-{stack}",
                                 subscription_id="00000000-0000-4000-8000-000000000000")
        yield stack, node


def test_every_stack_renders_valid_user_data(tmp_path):
    nodes = dict(_stack_nodes())
    assert {"dev", "prod", "azure", "tencent"} <= set(nodes)
    for stack, node in nodes.items():
        text = render_user_data(node)
        result = cloud_init_schema(text, tmp_path)
        assert result.returncode == 0, f"{stack}: {result.stdout}{result.stderr}"
        assert node_json(text)["stack"] == stack
