"""User-data: cloud-config that cloud-init accepts, writes node.json (and on the controller its settings and Slurm's
files) exactly, mounts the stack's file systems, and starts the units in order; nothing secret gets in."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.userdata import (AWS_USER_DATA_LIMIT, CONTROLLER_JSON_PATH, CONTROLLER_UNIT, GRES_CONF_PATH, NODE_JSON_PATH,
                            NODE_UNIT, NODES_JSON_PATH, SLURM_CONF_PATH, TENCENT_USER_DATA_LIMIT,
                            render_controller_user_data, render_node_user_data)
from trainer.slurm.conf import IMAGE_PROGRAMS, Cluster, LocalNode, Partition, render_gres_conf, render_slurm_conf
from trainer.slurm.nodes import CONFIG as NODES_CONFIG_PATH

ROOT = Path(__file__).resolve().parents[2]

AWS_NODE = {
    "cloud": "aws", "stack": "prod", "region": "eu-north-1",
    "asg_name": "gpufleet-prod-nodes", "log_group": "/gpufleet/prod", "metric_namespace": "gpufleet/prod",
    "instance_types": {"p5.48xlarge": {"gpus": 8, "efa": 32, "nvswitch": True, "infiniband_gbps": 0}},
    "aws": {"job_role_arn": "arn:aws:iam::123456789012:role/gpufleet-prod-job-1a2b3c4",
            "bucket": "gpufleet-prod-data-1a2b3c4"},
}
AZURE_NODE = {
    "cloud": "azure", "stack": "azure", "region": "westeurope",
    "asg_name": "gpufleet-azure-nodes", "log_group": "/gpufleet/azure", "metric_namespace": "gpufleet/azure",
    "instance_types": {"Standard_ND96asr_v4": {"gpus": 8, "efa": 0, "nvswitch": True, "infiniband_gbps": 1600}},
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


def _stack_nodes():
    """node.json of every Pulumi.<stack>.yaml, from the stacks' own node_settings."""
    from infra import config

    for path in sorted(ROOT.glob("Pulumi.*.yaml")):
        stack = path.name.split(".")[1]
        raw, secrets = config.read_stack_file(path)
        cfg = config.parse(raw, stack, secrets)
        if cfg.cloud == "aws":
            from infra.aws.shared_fs import HOME, mount
            from infra.aws.stack import Names, node_settings, slurm_settings

            slurm = slurm_settings("10.0.0.10", f"arn:aws:secretsmanager:{cfg.region}:123456789012:secret:"
                                                f"gpufleet-{stack}-munge-AbCdEf")
            node = node_settings(cfg, cfg.partitions[0], Names.of(stack), f"gpufleet-{stack}-data", None,
                                 slurm, [mount("fs-0123456789abcdef0", "fsap-0123456789abcdef0", HOME)],
                                 f"arn:aws:iam::123456789012:role/gpufleet-{stack}-job-1a2b3c4")
        elif cfg.cloud == "tencent":
            from infra.tencent import derive

            node = derive.node_settings(cfg, cfg.partitions[0], derive.Names.of(stack),
                                        bucket=f"gpufleet-{stack}-data-1250000000", app_id="1250000000",
                                        uin="100000000001", log_topic="8e1e679e-d520-4efa-8266-0fc8e6986583",
                                        munge_secret=f"gpufleet-{stack}-munge", home_ip=derive.HOME_FS_IP)
        else:
            from infra.azure.derive import node_settings

            node = node_settings(cfg, cfg.partitions[0], container_url="https://acct.blob.core.windows.net/data",
                                 client_id="0f0e0d0c-0000-4000-8000-000000000001", resource_group=f"gpufleet-{stack}",
                                 subscription_id="00000000-0000-4000-8000-000000000000")
        yield stack, node


# --- Slurm nodes and the controller -----------------------------------------------------------------------------

SLURM = {"controller_addr": "10.0.0.10", "controller_port": 6817,
         "munge": "arn:aws:secretsmanager:eu-north-1:123456789012:secret:gpufleet-prod-munge-AbCdEf"}
EFS = {"source": "fs-0123456789abcdef0:/", "target": "/shared", "type": "efs", "options": "iam"}
SLURM_NODE = {**AWS_NODE, "slurm": SLURM, "mounts": [EFS]}
AZURE_SLURM = {"controller_addr": "10.1.0.4", "controller_port": 6817,
               "munge": "https://gfazure-0a1b2c3d.vault.azure.net/secrets/munge"}
AZURE_SHARE = {"source": "gfazure.file.core.windows.net:/gfazure/shared", "target": "/shared", "type": "nfs4",
               "options": "vers=4,minorversion=1,sec=sys,nconnect=4"}
AZURE_SLURM_NODE = {**AZURE_NODE, "slurm": AZURE_SLURM, "mounts": [AZURE_SHARE]}
CONTROLLER = {"cloud": "aws", "stack": "prod", "region": "eu-north-1", "bucket": "gpufleet-prod-data-123456789012",
              "queue_url": "https://sqs.eu-north-1.amazonaws.com/123456789012/gpufleet-prod-jobs", "slurm": SLURM, "partition": "gpu", "gpus": 8,
              "instance_type": "p5.48xlarge", "state_dir": "/shared/slurm/state",
              "shared": {"home": "/shared/home", "fs": "fs-0123456789abcdef0"}, "mounts": [EFS]}
NODES_CONFIG = {"provider": "aws", "cloud": "aws", "stack": "prod", "region": "eu-north-1",
                "slurm_conf": "/etc/slurm/slurm.conf",
                "tags": {"gpufleet-stack": "prod", "data-classification": "internal"},
                "partitions": {"gpu": {"instance_types": ["p5.48xlarge"], "spot": False, "on_demand_base": 0,
                                       "gang": True, "launch_template_id": "lt-0123456789abcdef0",
                                       "subnet_ids": ["subnet-0123456789abcdef0"], "placement_group": "gpufleet-prod"}}}


def cloud_cluster(cloud: str = "aws", count: int = 16) -> Cluster:
    return Cluster(name="prod", controller="controller", controller_addr="10.0.0.10",
                   partitions=(Partition("gpu", count, 192, 1992294, gpus=8, features=("p5.48xlarge", "efa", "gang"),
                                         default=True),),
                   state_dir="/shared/slurm/state", spool_dir="/var/spool/slurmd", log_dir="/var/log/slurm",
                   run_dir="/run/slurm", programs=dict(IMAGE_PROGRAMS), cloud=cloud)


def controller_user_data(controller=CONTROLLER, nodes_config=NODES_CONFIG, cluster: Cluster | None = None) -> str:
    cluster = cluster or cloud_cluster(controller["cloud"])
    return render_controller_user_data(controller, render_slurm_conf(cluster), render_gres_conf(cluster), nodes_config)


def written(text: str) -> dict[str, dict]:
    return {f["path"]: f for f in yaml.safe_load(text)["write_files"]}


@pytest.mark.parametrize("node", [SLURM_NODE, AZURE_SLURM_NODE], ids=["aws", "azure"])
def test_cloud_init_accepts_a_slurm_nodes_user_data(node, tmp_path):
    text = render_node_user_data(node)
    assert text.startswith("#cloud-config\n")
    result = cloud_init_schema(text, tmp_path)
    assert result.returncode == 0 and "Valid cloud-config" in result.stdout, result.stdout + result.stderr


def test_a_slurm_node_writes_node_json_mounts_its_file_system_then_starts_its_setup():
    doc = yaml.safe_load(render_node_user_data(SLURM_NODE))
    assert list(doc) == ["write_files", "mounts", "runcmd"]
    assert [f["path"] for f in doc["write_files"]] == [NODE_JSON_PATH]
    assert node_json(render_node_user_data(SLURM_NODE)) == SLURM_NODE
    assert doc["mounts"] == [["fs-0123456789abcdef0:/", "/shared", "efs", "_netdev,tls,iam", "0", "0"]]
    assert doc["runcmd"] == [["systemctl", "daemon-reload"], ["systemctl", "enable", "gpufleet-node.service"],
                             ["systemctl", "start", "--no-block", "gpufleet-node.service"]]
    assert NODE_UNIT in {p.name for p in (ROOT / "ami" / "systemd").glob("*.service")}


def test_cloud_init_schema_check_can_fail(tmp_path):
    text = render_node_user_data(SLURM_NODE)
    broken = text.replace("path: /etc/gpufleet/node.json", "paht: /etc/gpufleet/node.json")
    assert broken != text and cloud_init_schema(broken, tmp_path).returncode != 0


@pytest.mark.parametrize("node", [SLURM_NODE, AZURE_SLURM_NODE], ids=["aws", "azure"])
def test_node_json_round_trips(node):
    assert node_json(render_node_user_data(node)) == node


def test_awkward_values_survive_yaml():
    node = copy.deepcopy(SLURM_NODE)
    node["stack"] = 'dev: "quoted" # not a comment\n- not a list'
    assert node_json(render_node_user_data(node)) == node


@pytest.mark.parametrize("change, message", [
    ({"cloud": "gcp"}, "node.cloud: 'gcp' is not one of aws, azure, tencent"),
    ({"instance_types": {}}, "node.instance_types"),
    ({"asg_name": ""}, "node.asg_name: expected a non-empty string"),
    ({"aws_secret_access_key": "x"}, "node.aws_secret_access_key: secrets do not belong in user-data"),
    ({"log_group": "https://a.blob.core.windows.net/logs?sv=2023&sig=abc"}, "node.log_group: a SAS-signed URL"),
])
def test_bad_or_secret_settings_are_refused(change, message):
    with pytest.raises(ValueError) as err:
        render_node_user_data({**SLURM_NODE, **change})
    assert message in str(err.value)


def test_the_key_vault_is_a_name_or_null():
    vault = {**AZURE_SLURM_NODE, "azure": {**AZURE_NODE["azure"], "key_vault": "gfazure-0a1b2c3d"}}
    assert node_json(render_node_user_data(vault))["azure"]["key_vault"] == "gfazure-0a1b2c3d"
    with pytest.raises(ValueError, match="node.azure.key_vault: expected a Key Vault name or null, got a list"):
        render_node_user_data({**AZURE_SLURM_NODE, "azure": {**AZURE_NODE["azure"], "key_vault": ["kv"]}})


def test_missing_settings_are_named():
    node = {k: v for k, v in SLURM_NODE.items() if k not in ("asg_name", "metric_namespace")}
    with pytest.raises(ValueError, match="missing asg_name, metric_namespace"):
        render_node_user_data(node)
    with pytest.raises(ValueError, match="node.azure: missing client_id"):
        render_node_user_data({**AZURE_SLURM_NODE, "azure": {"resource_group": "rg", "subscription_id": "s"}})
    tencent = {**dict(_stack_nodes())["tencent"], "slurm": {**SLURM, "munge": "gpufleet-tencent-munge"}}
    with pytest.raises(ValueError, match="node.tencent: missing role_name"):
        render_node_user_data({**tencent, "tencent": {"app_id": "1250000000", "cos_endpoint": "https://cos"}})


def test_nfs_mounts_keep_their_options_and_wait_for_the_network():
    doc = yaml.safe_load(render_node_user_data(AZURE_SLURM_NODE))
    assert doc["mounts"] == [["gfazure.file.core.windows.net:/gfazure/shared", "/shared", "nfs4",
                              "_netdev,vers=4,minorversion=1,sec=sys,nconnect=4", "0", "0"]]
    plain = {**AZURE_SLURM_NODE, "mounts": [{**AZURE_SHARE, "type": "nfs", "options": ""},
                                            {**EFS, "target": "/data", "options": "tls,_netdev"}]}
    assert yaml.safe_load(render_node_user_data(plain))["mounts"] == [
        ["gfazure.file.core.windows.net:/gfazure/shared", "/shared", "nfs", "_netdev", "0", "0"],
        ["fs-0123456789abcdef0:/", "/data", "efs", "_netdev,tls", "0", "0"]]


def test_a_slurm_node_without_mounts_has_no_mounts_section():
    doc = yaml.safe_load(render_node_user_data({**SLURM_NODE, "mounts": []}))
    assert "mounts" not in doc
    assert "mounts" not in yaml.safe_load(render_node_user_data({k: v for k, v in SLURM_NODE.items()
                                                                 if k != "mounts"}))


@pytest.mark.parametrize("change, message", [
    ({"slurm": None}, "node.slurm: expected an object with controller_addr, controller_port, munge, got null"),
    ({"slurm": {**SLURM, "controller_port": 0}},
     "node.slurm.controller_port: 0 is not allowed; expected an integer 1-65535"),
    ({"slurm": {**SLURM, "controller_port": True}},
     "node.slurm.controller_port: True is not allowed; expected an integer 1-65535"),
    ({"slurm": {**SLURM, "controller_addr": ""}},
     "node.slurm.controller_addr: '' is not allowed; expected the controller's host name or IP address"),
    ({"slurm": {**SLURM, "munge": None}},
     "node.slurm.munge: expected a non-empty string (the secret that holds the munge key), got null"),
    ({"slurm": {**SLURM, "munge": "a2V5 a2V5"}}, "node.slurm.munge: expected the reference of the secret"),
    ({"slurm": {**SLURM, "munge_secret": "arn:x"}}, "node.slurm.munge_secret: secrets do not belong in user-data"),
    ({"slurm": {**SLURM, "munge_key": "abc"}}, "node.slurm.munge_key: unknown key; expected controller_addr, "
                                               "controller_port, munge"),
    ({"mounts": {"source": "x"}}, "node.mounts: expected a list of {source, target, type, options}, got an object"),
    ({"mounts": ["fs-1:/"]}, "node.mounts[0]: expected an object with source, target, type, options, got a string"),
    ({"mounts": [{**EFS, "target": "shared"}]},
     "node.mounts[0].target: 'shared' is not allowed; expected an absolute, normalised path other than /"),
    ({"mounts": [{**EFS, "target": "/shared/../etc"}]},
     "node.mounts[0].target: '/shared/../etc' is not allowed"),
    ({"mounts": [{**EFS, "target": "/"}]}, "node.mounts[0].target: '/' is not allowed"),
    ({"mounts": [EFS, {**AZURE_SHARE, "target": "/shared"}]}, "node.mounts[1].target: /shared is mounted twice"),
    ({"mounts": [{**EFS, "type": "cifs"}]}, "node.mounts[0].type: 'cifs' is not one of efs, aznfs, nfs4, nfs"),
    ({"mounts": [{**EFS, "source": "fs-0123456789abcdef0"}]},
     "node.mounts[0].source: 'fs-0123456789abcdef0' is not allowed; expected host:/path or fs-id:/path"),
    ({"mounts": [{**EFS, "options": "tls, iam"}]},
     "node.mounts[0].options: expected comma-separated mount options without spaces, got 'tls, iam'"),
    ({"mounts": [{**EFS, "options": "notls"}]},
     "node.mounts[0].options: notls is not allowed; EFS (amazon-efs-utils) is mounted over TLS"),
    ({"mounts": [{k: v for k, v in EFS.items() if k != "options"}]}, "node.mounts[0]: missing options"),
    ({"mounts": [{**EFS, "password": "x"}]}, "node.mounts[0].password: secrets do not belong in user-data"),
])
def test_bad_slurm_or_mount_settings_are_refused(change, message):
    with pytest.raises(ValueError) as err:
        render_node_user_data({**SLURM_NODE, **change})
    assert message in str(err.value) and "\n" not in str(err.value)


JOB_ROLE = AWS_NODE["aws"]["job_role_arn"]


@pytest.mark.parametrize("aws, message", [
    (None, "node.aws: expected an object with job_role_arn, bucket, got null"),
    ({"bucket": "b"}, "node.aws: missing job_role_arn"),
    ({"job_role_arn": JOB_ROLE}, "node.aws: missing bucket"),
    ({"job_role_arn": JOB_ROLE, "bucket": ""}, "node.aws.bucket: expected a non-empty string without spaces, got "
                                               "an empty string"),
    ({"job_role_arn": JOB_ROLE, "bucket": ["b"]}, "node.aws.bucket: expected a non-empty string without spaces, got "
                                                  "a list"),
    ({"job_role_arn": "gpufleet-prod-job", "bucket": "b"},
     "node.aws.job_role_arn: 'gpufleet-prod-job' is not allowed; expected an IAM role's ARN"),
    ({"job_role_arn": "arn:aws:iam::123456789012:user/alice", "bucket": "b"},
     "node.aws.job_role_arn: 'arn:aws:iam::123456789012:user/alice' is not allowed"),
    ({"job_role_arn": "arn:aws:iam::1234:role/job", "bucket": "b"},
     "node.aws.job_role_arn: 'arn:aws:iam::1234:role/job' is not allowed"),
    ({"job_role_arn": JOB_ROLE, "bucket": "b", "session_token": "x"},
     "node.aws.session_token: secrets do not belong in user-data"),
    ({"job_role_arn": JOB_ROLE, "bucket": "b", "queue_url": "x"},
     "node.aws.queue_url: unknown key; expected job_role_arn, bucket"),
])
def test_bad_aws_settings_are_refused(aws, message):
    with pytest.raises(ValueError) as err:
        render_node_user_data({**SLURM_NODE, "aws": aws})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("arn", [JOB_ROLE, "arn:aws-cn:iam::123456789012:role/gpufleet/cn-job",
                                 "arn:aws-us-gov:iam::123456789012:role/gpufleet-gov-job"])
def test_the_job_role_is_a_role_arn_of_any_partition_and_the_aws_object_is_optional(arn):
    node = {**SLURM_NODE, "aws": {"job_role_arn": arn, "bucket": "gpufleet-prod-data-1a2b3c4"}}
    assert node_json(render_node_user_data(node))["aws"] == node["aws"]
    without = {k: v for k, v in SLURM_NODE.items() if k != "aws"}   # optional, even for the writer
    assert node_json(render_node_user_data(without)) == without


@pytest.mark.parametrize("role, allowed", [
    ("qcs::cam::uin/100000000001:roleName/gpufleet-dev-jobs", True),
    ("qcs::cam::uin/100000000001:uin/100000000002", False),     # a user, not a role
    ("arn:aws:iam::123456789012:role/job", False),
    ("qcs::cam::uin/100000000001:roleName/jobs\n", False),     # a name pattern matches the whole value
])
def test_a_tencent_nodes_job_role_is_a_cam_role(role, allowed):
    tencent = {"app_id": "1250000000", "role_name": "gpufleet-dev-nodes", "cos_endpoint": "https://cos.x",
               "job_role_arn": role, "bucket": "gpufleet-dev-data-1250000000"}
    node = {**{k: v for k, v in SLURM_NODE.items() if k != "aws"}, "cloud": "tencent", "tencent": tencent}
    if allowed:
        assert node_json(render_node_user_data(node))["tencent"] == tencent
    else:
        with pytest.raises(ValueError, match="^node.tencent.job_role_arn: .* is not allowed; expected a CAM role"):
            render_node_user_data(node)


def test_a_slurm_node_needs_its_slurm_object():
    with pytest.raises(ValueError, match="^node.slurm: missing; a Slurm node needs controller_addr, controller_port "
                                         "and munge"):
        render_node_user_data(AWS_NODE)


def test_slurm_node_user_data_size_limits():
    many = {f"g{i}.48xlarge": {"gpus": 8, "efa": 32, "nvswitch": True, "infiniband_gbps": 0} for i in range(300)}
    with pytest.raises(ValueError, match=f"EC2 accepts at most {AWS_USER_DATA_LIMIT}"):
        render_node_user_data({**SLURM_NODE, "instance_types": many})
    tencent = {**dict(_stack_nodes())["tencent"], "slurm": {**SLURM, "munge": "gpufleet-tencent-munge"}}
    render_node_user_data(tencent)
    with pytest.raises(ValueError, match=f"a launch configuration accepts at most {TENCENT_USER_DATA_LIMIT}"):
        render_node_user_data({**tencent, "instance_types": {f"GT{i}.20XLARGE320": {"gpus": 8} for i in range(200)}})


def test_a_stacks_nodes_are_told_its_teams_whose_users_they_make():
    nodes = dict(_stack_nodes())
    assert nodes["dev"]["teams"] == ["vision", "nlp"] and nodes["prod"]["teams"] == ["default"]
    with pytest.raises(ValueError, match="^node.teams: a team is named twice$"):
        render_node_user_data({**nodes["dev"], "teams": ["nlp", "nlp"]})
    with pytest.raises(ValueError, match="^node.teams: expected a non-empty list of team names"):
        render_node_user_data({**nodes["dev"], "teams": ["../etc"]})


@pytest.mark.parametrize("stack", ["dev", "prod", "azure", "tencent"])
def test_every_stacks_node_settings_render_slurm_user_data(stack, tmp_path):
    node = {**dict(_stack_nodes())[stack], "slurm": {**SLURM, "munge": f"gpufleet-{stack}-munge"}}
    text = render_node_user_data(node)
    result = cloud_init_schema(text, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the controller -----------------------------------------------------------------------------------------------

def test_cloud_init_accepts_the_controllers_user_data(tmp_path):
    result = cloud_init_schema(controller_user_data(), tmp_path)
    assert result.returncode == 0 and "Valid cloud-config" in result.stdout, result.stdout + result.stderr


def test_the_controller_writes_its_settings_and_slurms_files_then_starts_its_setup():
    cluster = cloud_cluster()
    text = controller_user_data(cluster=cluster)
    doc = yaml.safe_load(text)
    files = written(text)
    assert list(files) == [CONTROLLER_JSON_PATH, NODES_JSON_PATH, SLURM_CONF_PATH, GRES_CONF_PATH]
    assert all(f["owner"] == "root:root" and f["permissions"] == "0644" for f in files.values())
    assert json.loads(files[CONTROLLER_JSON_PATH]["content"]) == CONTROLLER
    assert json.loads(files[NODES_JSON_PATH]["content"]) == NODES_CONFIG
    assert files[SLURM_CONF_PATH]["content"] == render_slurm_conf(cluster)
    assert files[GRES_CONF_PATH]["content"] == render_gres_conf(cluster)
    assert doc["mounts"] == [["fs-0123456789abcdef0:/", "/shared", "efs", "_netdev,tls,iam", "0", "0"]]
    assert doc["runcmd"] == [["systemctl", "daemon-reload"], ["systemctl", "enable", "gpufleet-controller.service"],
                             ["systemctl", "start", "--no-block", "gpufleet-controller.service"]]
    assert CONTROLLER_UNIT in {p.name for p in (ROOT / "ami" / "systemd").glob("*.service")}
    assert NODES_JSON_PATH == NODES_CONFIG_PATH  # where power saving reads its settings
    # slurmctld starts only on the host SlurmctldHost names
    assert (doc["hostname"], doc["preserve_hostname"]) == (cluster.controller, False)


def test_the_controller_must_have_one_host_name_it_can_take():
    conf = render_slurm_conf(cloud_cluster())
    with pytest.raises(ValueError, match="SlurmctldHost"):
        render_controller_user_data(CONTROLLER, conf.replace("SlurmctldHost=", "SlurmctldHost=Bad_Host "),
                                    render_gres_conf(cloud_cluster()), NODES_CONFIG)


@pytest.mark.parametrize("change, message", [
    ({"api_token": "x"}, "controller.api_token: secrets do not belong in user-data"),
    ({"slurm": {**SLURM, "munge_password": "x"}},
     "controller.slurm.munge_password: secrets do not belong in user-data"),
    ({"queue_url": "https://a.queue.core.windows.net/jobs?sv=2023&sig=abc"},
     "controller.queue_url: a SAS-signed URL is a secret; give the plain URL"),
    ({"mounts": [{**EFS, "options": "notls"}]}, "controller.mounts[0].options: notls is not allowed"),
    ({"cloud": "azure"}, "controller.azure: missing client_id, resource_group, subscription_id"),
    ({"state_dir": None}, "controller.state_dir: None is not allowed"),
])
def test_bad_or_secret_controller_settings_are_refused(change, message):
    with pytest.raises(ValueError) as err:
        controller_user_data(controller={**CONTROLLER, **change},
                             nodes_config={**NODES_CONFIG, "cloud": change.get("cloud", "aws")})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("change, message", [
    ({"partitions": {"gpu": {**NODES_CONFIG["partitions"]["gpu"], "admin_password": "x"}}},
     "nodes_config.partitions.gpu.admin_password: secrets do not belong in user-data"),
    ({"slurm_conf": "/opt/slurm/etc/slurm.conf"},
     "nodes_config.slurm_conf: '/opt/slurm/etc/slurm.conf'; the controller's user-data writes slurm.conf to "
     "/etc/slurm/slurm.conf"),
    ({"partitions": {}}, "nodes_config.partitions: expected a non-empty map"),
    ({"cloud": "azure"}, "nodes_config.cloud: 'azure'; the controller is on aws"),
])
def test_bad_or_secret_power_saving_settings_are_refused(change, message):
    with pytest.raises(ValueError) as err:
        controller_user_data(nodes_config={**NODES_CONFIG, **change})
    assert message in str(err.value)
    with pytest.raises(ValueError, match="^nodes_config: missing provider$"):
        controller_user_data(nodes_config={k: v for k, v in NODES_CONFIG.items() if k != "provider"})


def test_the_controller_serves_a_configless_cluster_only():
    box = Cluster(name="box", controller="localhost", controller_addr="127.0.0.1",
                  partitions=(Partition("gpu", 1, 1, 2048, default=True),), state_dir="/s", spool_dir="/p",
                  log_dir="/l", run_dir="/r", programs=dict(IMAGE_PROGRAMS), local_nodes={"gpu-1": LocalNode(port=1)})
    with pytest.raises(ValueError, match="^slurm_conf: SlurmctldParameters has no enable_configless"):
        controller_user_data(cluster=box)


def test_controller_user_data_size_limits():
    many = {f"p{i}": {**NODES_CONFIG["partitions"]["gpu"]} for i in range(100)}
    with pytest.raises(ValueError, match=f"EC2 accepts at most {AWS_USER_DATA_LIMIT}"):
        controller_user_data(nodes_config={**NODES_CONFIG, "partitions": many})
    tencent = {**CONTROLLER, "cloud": "tencent", "tencent": {"app_id": "1250000000", "role_name": "gpufleet-node",
                                                            "cos_endpoint": "https://cos.ap-shanghai.myqcloud.com"}}
    nodes = {**NODES_CONFIG, "cloud": "tencent", "provider": "tencent"}
    controller_user_data(controller=tencent, nodes_config=nodes)
    with pytest.raises(ValueError, match=f"a launch configuration accepts at most {TENCENT_USER_DATA_LIMIT}"):
        controller_user_data(controller=tencent, nodes_config={**nodes, "partitions": many})
