"""The Tencent stack on Pulumi's mock runtime: the Slurm controller and its fixed address, the partitions' launch
templates, CFS, the munge key's secret, the CAM roles, the network, the bucket, the queue, the alarms, tags."""
from __future__ import annotations

import base64
import importlib
import inspect
import ipaddress
import json
import re

import pytest

from infra import catalog, slurm
from infra.preview import cost
from infra.preview.mocks import TENCENT_APP_ID, TENCENT_UIN
from infra.tencent import derive
from infra.userdata import TENCENT_USER_DATA_LIMIT, render_node_user_data
from tests.infra.tencent.conftest import (controller_file, controller_user_data, node_json, node_user_data, run_stack,
                                          tencent_config)

T = "tencentcloud:"
VPC, SUBNET = T + "Vpc/instance:Instance", T + "Subnet/instance:Instance"
SG, RULES = T + "Security/group:Group", T + "Security/groupRuleSet:GroupRuleSet"
BUCKET, BUCKET_POLICY, KEY = T + "Cos/bucket:Bucket", T + "Cos/bucketPolicy:BucketPolicy", T + "Kms/key:Key"
ROLE, POLICY, ATTACH = T + "Cam/role:Role", T + "Cam/policy:Policy", T + "Cam/rolePolicyAttachment:RolePolicyAttachment"
QUEUE, LOGSET, TOPIC = T + "Tcmq/queue:Queue", T + "Cls/logset:Logset", T + "Cls/topic:Topic"
NOTICE, ALARM, BINDING = (T + "Monitor/alarmNotice:AlarmNotice", T + "Monitor/alarmPolicy:AlarmPolicy",
                          T + "Monitor/policyBindingObject:PolicyBindingObject")
BUDGET, CAM_GROUP = T + "Billing/budget:Budget", T + "Cam/group:Group"
GROUP_ATTACH = T + "Cam/groupPolicyAttachment:GroupPolicyAttachment"
INSTANCE, TEMPLATE = T + "Instance/instance:Instance", T + "Cvm/launchTemplate:LaunchTemplate"
FS, FS_GROUP = T + "Cfs/fileSystem:FileSystem", T + "Cfs/accessGroup:AccessGroup"
FS_RULE = T + "Cfs/accessRule:AccessRule"
SECRET, SECRET_VERSION = T + "Ssm/secret:Secret", T + "Ssm/secretVersion:SecretVersion"
PARTITION = "gpufleet:tencent:Partition"
REGION = "ap-shanghai"
CONCERNS = ("Network", "Storage", "JobQueue", "Monitoring", "Identity", "SharedFs", "Partition", "Controller")


def _taggable(typ: str) -> bool:
    """Whether the SDK's class of a token (tencentcloud:Cfs/fileSystem:FileSystem) takes tags."""
    module, kind = typ.split(":")[1].split("/")
    package = "as_" if module == "As" else module.lower()
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in kind).lstrip("_")
    cls = getattr(importlib.import_module(f"tencentcloud_iac_pulumi.{package}.{snake}"), typ.rsplit(":", 1)[1])
    return "tags" in inspect.signature(cls._internal_init).parameters


def doc(resource) -> dict:
    return json.loads(resource.inputs["document"] if "document" in resource.inputs else resource.inputs["policy"])


def by_resource(statements: list[dict]) -> dict:
    return {r: s["action"] for s in statements for r in s["resource"]}


def node_subnets(run):
    """The node subnets in their order (registration order varies on the mock runtime)."""
    return sorted((s for s in run.of_type(SUBNET) if "-nodes-" in s.name), key=lambda s: int(s.name.rsplit("-", 1)[1]))


def _qcs(service: str, path: str) -> str:
    return f"qcs::{service}:{REGION}:uin/{TENCENT_UIN}:{path}"


# --- what the stack is made of ------------------------------------------------------------------------------

def test_every_resource_sits_in_a_component_and_every_taggable_one_carries_the_tags(tencent_run):
    cfg = tencent_config()
    components = {r.type for r in tencent_run.resources if r.type.startswith("gpufleet:tencent:")}
    assert components == {f"gpufleet:tencent:{c}" for c in CONCERNS}
    provider = [r for r in tencent_run.resources if r.type.startswith(T)]
    assert {r.type for r in provider} >= {VPC, SUBNET, SG, RULES, BUCKET, BUCKET_POLICY, KEY, ROLE, POLICY, ATTACH,
                                          QUEUE, LOGSET, TOPIC, NOTICE, ALARM, BINDING, BUDGET, INSTANCE, TEMPLATE, FS,
                                          FS_GROUP, FS_RULE, SECRET, SECRET_VERSION}
    taggable = [r for r in provider if _taggable(r.type)]
    assert {INSTANCE, TEMPLATE, FS, SECRET} <= {r.type for r in taggable}
    for r in provider:
        assert r.parent_type in components, r.urn
        if _taggable(r.type):
            assert r.inputs.get("tags") == cfg.all_tags, r.urn
    # every node carries them too (the template's; the node provider adds its node name and the stack tag)
    (spec,) = tencent_run.one(TEMPLATE).inputs["tagSpecifications"]
    assert spec["resourceType"] == "instance"
    assert {t["key"]: t["value"] for t in spec["tags"]} == cfg.all_tags


def test_what_the_scaling_group_did_is_gone(tencent_run):
    """Backlog scaling, lifecycle hooks and scale-in protection are Slurm's power saving and drain now."""
    types = {r.type for r in tencent_run.resources}
    assert not [t for t in types if t.startswith((T + "As/", T + "Scf/"))]
    assert not {"scalingGroup", "scalingGroupName", "launchConfiguration", "scaler"} & set(tencent_run.outputs)
    node = node_json(tencent_run)
    assert not {"launch_hook", "terminate_hook", "queue_url", "node_count"} & set(node)  # no hook, no queue to poll


# --- network ------------------------------------------------------------------------------------------------

def test_network_is_private_with_node_subnets_per_zone_and_a_controller_subnet(tencent_run):
    vpc = tencent_run.one(VPC)
    space = ipaddress.ip_network(vpc.inputs["cidrBlock"])
    nodes = node_subnets(tencent_run)
    assert len(nodes) == derive.QUEUE_ZONES
    assert len({s.inputs["availabilityZone"] for s in nodes}) == 3
    assert all(s.inputs["availabilityZone"].startswith("ap-shanghai-") for s in nodes)
    ctl = tencent_run.one(SUBNET, "gpufleet-tencent-controller")
    assert ctl.inputs["cidrBlock"] == derive.CONTROLLER_SUBNET_CIDR
    assert ctl.inputs["availabilityZone"] == nodes[0].inputs["availabilityZone"]
    cidrs = [ipaddress.ip_network(s.inputs["cidrBlock"]) for s in [*nodes, ctl]]
    for s, cidr in zip([*nodes, ctl], cidrs):
        assert cidr.subnet_of(space) and s.inputs["vpcId"] == vpc.id
    assert not any(a.overlaps(b) for i, a in enumerate(cidrs) for b in cidrs[i + 1:])
    assert ipaddress.ip_address(derive.CONTROLLER_IP) in cidrs[-1]
    assert tencent_run.outputs["subnetIds"] == [s.id for s in nodes]
    assert not [r for r in tencent_run.resources if "nat" in r.type.lower() or "eip" in r.type.lower()]


def test_no_machine_gets_a_public_address(tencent_run):
    ctl = tencent_run.one(INSTANCE).inputs
    assert ctl["allocatePublicIp"] is False and ctl["internetMaxBandwidthOut"] == 0
    template = tencent_run.one(TEMPLATE).inputs
    assert template["internetAccessible"] == {"publicIpAssigned": False, "internetMaxBandwidthOut": 0}
    for inputs in (ctl, template):
        assert "password" not in inputs and "keyIds" not in inputs and "keyName" not in inputs
    assert ctl["keepImageLogin"] is True and template["loginSettings"] == {"keepImageLogin": "TRUE"}


def test_slurm_traffic_is_held_to_its_ports(tencent_run):
    nodes_sg = tencent_run.one(SG, "gpufleet-tencent-nodes").id
    ctl_sg = tencent_run.one(SG, "gpufleet-tencent-controller").id
    rules = {r.inputs["securityGroupId"]: r.inputs for r in tencent_run.of_type(RULES)}
    node_in = [(r["action"], r["protocol"], r["port"], r.get("sourceSecurityId") or r.get("cidrBlock"))
               for r in rules[nodes_sg]["ingresses"]]
    assert node_in == [("ACCEPT", "ALL", "ALL", nodes_sg), ("ACCEPT", "TCP", "6818", ctl_sg),
                       ("DROP", "ALL", "ALL", "0.0.0.0/0")]
    ctl_in = [(r["action"], r["protocol"], r["port"], r.get("sourceSecurityId") or r.get("cidrBlock"))
              for r in rules[ctl_sg]["ingresses"]]
    low, high = slurm.SRUN_PORTS
    assert ctl_in == [("ACCEPT", "TCP", "6817", nodes_sg), ("ACCEPT", "TCP", f"{low}-{high}", nodes_sg),
                      ("DROP", "ALL", "ALL", "0.0.0.0/0")]
    for group in (nodes_sg, ctl_sg):
        egress = rules[group]["egresses"]
        assert (egress[0]["action"], egress[0]["cidrBlock"]) == ("ACCEPT", derive.VPC_CIDR)
        assert [(r["protocol"], r["port"]) for r in egress[1:3]] == [("TCP", "80,443"), ("UDP", "53,123")]
        assert (egress[-1]["action"], egress[-1]["cidrBlock"], egress[-1]["protocol"]) == ("DROP", "0.0.0.0/0", "ALL")
    assert tencent_run.one(TEMPLATE).inputs["securityGroupIds"] == [nodes_sg]
    assert tencent_run.one(INSTANCE).inputs["orderlySecurityGroups"] == [ctl_sg]


# --- storage and queue --------------------------------------------------------------------------------------

def test_bucket_is_private_kms_encrypted_versioned_logged_and_tls_only(tencent_run):
    key = tencent_run.one(KEY)
    assert key.inputs["keyRotationEnabled"] is True and key.inputs["isEnabled"] is True
    data = tencent_run.one(BUCKET, "gpufleet-tencent-data")
    logs = tencent_run.one(BUCKET, "gpufleet-tencent-access-logs")
    d = data.inputs
    assert d["bucket"] == f"gpufleet-tencent-data-{TENCENT_APP_ID}"
    assert d["acl"] == "private" and d["encryptionAlgorithm"] == "KMS" and d["kmsId"] == key.id
    assert d["versioningEnable"] is True
    (rule,) = d["lifecycleRules"]
    assert rule["nonCurrentExpiration"]["nonCurrentDays"] == 30
    assert rule["abortIncompleteMultipartUpload"]["daysAfterInitiation"] == 7
    assert (d["logEnable"], d["logTargetBucket"], d["logPrefix"]) == (True, logs.inputs["bucket"], "data-bucket/")
    assert logs.inputs["acl"] == "private" and logs.inputs["encryptionAlgorithm"] == "AES256"
    policies = {p.inputs["bucket"]: json.loads(p.inputs["policy"]) for p in tencent_run.of_type(BUCKET_POLICY)}
    assert set(policies) == {d["bucket"], logs.inputs["bucket"]}
    for name, policy in policies.items():
        assert policy["version"] == "2.0"
        resources = [f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{name}/",
                     f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{name}/*"]
        conditions = []
        for s in policy["statement"]:
            assert s["effect"] == "deny" and s["principal"] == {"qcs": ["qcs::cam::anyone:anyone"]}
            assert s["action"] == ["name/cos:*"] and s["resource"] == resources
            conditions.append(s["condition"])
        assert conditions == [{"bool_equal": {"cos:secure-transport": "false"}},
                              {"numeric_less_than": {"cos:tls-version": 1.2}}]


def test_internal_data_has_no_access_log_bucket():
    run = run_stack(tencent_config(dataClassification="internal"))
    (bucket,) = run.of_type(BUCKET)
    assert "logEnable" not in bucket.inputs and run.outputs["accessLogBucket"] is None
    assert run.one(TOPIC).inputs["period"] == derive.LOG_RETENTION_DAYS["internal"]


def test_job_queue_hides_a_job_for_its_window_and_dead_letters_after_three_receives(tencent_run):
    queues = {q.inputs["queueName"]: q.inputs for q in tencent_run.of_type(QUEUE)}
    jobs, dead = queues["gpufleet-tencent-jobs"], queues["gpufleet-tencent-jobs-dead"]
    assert (jobs["visibilityTimeout"], jobs["msgRetentionSeconds"], jobs["pollingWaitSeconds"]) == (10800, 43200, 20)
    assert (jobs["deadLetterQueueName"], jobs["policy"], jobs["maxReceiveCount"]) == (
        "gpufleet-tencent-jobs-dead", 0, 3)
    assert dead["msgRetentionSeconds"] == 43200 and "deadLetterQueueName" not in dead
    assert tencent_run.outputs["dlqUrl"] == "http://sh.mqadapter.cmq.tencentyun.com/gpufleet-tencent-jobs-dead"


def test_each_team_has_its_queue_and_a_submit_group_that_reaches_only_its_own():
    """Issue 23 on Tencent: the queue a message came through is the team that sent it; a team's group sends to its
    queue only, takes its dead letters back, and keeps records and bundles under its own prefix."""
    run = run_stack(tencent_config(teams=[{"name": "vision"}, {"name": "nlp"}]))
    o = run.outputs
    queues = {q.inputs["queueName"]: q.inputs for q in run.of_type(QUEUE)}
    assert set(queues) == {"gpufleet-tencent-jobs", "gpufleet-tencent-jobs-dead", "gpufleet-tencent-jobs-nlp",
                           "gpufleet-tencent-jobs-nlp-dead"}
    assert queues["gpufleet-tencent-jobs-nlp"]["deadLetterQueueName"] == "gpufleet-tencent-jobs-nlp-dead"
    url = "http://sh.mqadapter.cmq.tencentyun.com/"
    assert o["teamQueues"] == {"vision": url + "gpufleet-tencent-jobs", "nlp": url + "gpufleet-tencent-jobs-nlp"}
    assert o["teamDeadLetterQueues"] == {"vision": url + "gpufleet-tencent-jobs-dead",
                                         "nlp": url + "gpufleet-tencent-jobs-nlp-dead"}
    assert o["teamSubmitGroups"] == {"vision": "gpufleet-tencent-submit-vision", "nlp": "gpufleet-tencent-submit-nlp"}
    assert o["queueUrl"] == o["teamQueues"]["vision"]  # the first team's keeps the stack's names
    groups = {g.inputs["name"]: g for g in run.of_type(CAM_GROUP)}
    attached = {a.inputs["groupId"]: a.inputs["policyId"] for a in run.of_type(GROUP_ATTACH)}
    bucket = f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{o['bucket']}"
    key = _qcs("kms", f"key/creatorUin/{TENCENT_UIN}/{run.one(KEY).id}")
    for team, queue in (("vision", "gpufleet-tencent-jobs"), ("nlp", "gpufleet-tencent-jobs-nlp")):
        policy = run.one(POLICY, ("queue" if team == "vision" else f"queue-{team}") + "-submit-policy")
        assert attached[groups[f"gpufleet-tencent-submit-{team}"].id] == policy.id
        statements = doc(policy)["statement"]
        own = f"{bucket}/teams/{team}/"
        assert by_resource(statements) == {
            _qcs("tdmq", f"queue/{queue}"): ["name/tdmq:SendMessage"],
            _qcs("tdmq", f"queue/{queue}-dead"): list(derive.QUEUE_ACTIONS),
            f"{bucket}/": ["name/cos:GetBucket"],
            f"{own}jobs/*": list(derive.SUBMIT_UPLOADS),  # and read, in the statement before
            f"{own}jobs-index/*": ["name/cos:GetObject", "name/cos:HeadObject"],
            f"{own}code/*": list(derive.SUBMIT_UPLOADS),
            key: ["name/kms:Encrypt", "name/kms:Decrypt", "name/kms:GenerateDataKey"],
        }
        reads = [s for s in statements if s["action"] == ["name/cos:GetObject", "name/cos:HeadObject"]]
        assert reads[0]["resource"] == [f"{own}jobs/*", f"{own}jobs-index/*", f"{own}code/*"]
        (listing,) = [s for s in statements if s["action"] == ["name/cos:GetBucket"]]
        assert listing["condition"] == {"string_like": {"cos:prefix": [f"teams/{team}/*"]}}
        other = "nlp" if team == "vision" else "vision"
        assert f"teams/{other}/" not in json.dumps(statements) and f"submit-{other}" not in json.dumps(statements)
        _least_privilege(statements)
    ctl = controller_file(run, "/etc/gpufleet/controller.json")
    assert {t["name"]: t["queue_url"] for t in ctl["teams"]} == o["teamQueues"]
    controller = doc(run.one(POLICY, "gpufleet-tencent-controller-policy"))["statement"]
    assert by_resource([s for s in controller if s["action"][0].startswith("name/tdmq:")]) == {
        _qcs("tdmq", "queue/gpufleet-tencent-jobs"): list(derive.QUEUE_ACTIONS),
        _qcs("tdmq", "queue/gpufleet-tencent-jobs-nlp"): list(derive.QUEUE_ACTIONS),
        _qcs("tdmq", "queue/gpufleet-tencent-jobs-dead"): ["name/tdmq:SendMessage"],
        _qcs("tdmq", "queue/gpufleet-tencent-jobs-nlp-dead"): ["name/tdmq:SendMessage"]}
    (binding,) = [b for b in run.of_type(BINDING) if "queueName" in b.inputs["dimensions"][0]["dimensionsJson"]]
    assert [json.loads(d["dimensionsJson"])["queueName"] for d in binding.inputs["dimensions"]] == [
        "gpufleet-tencent-jobs-dead", "gpufleet-tencent-jobs-nlp-dead"]


# --- identities and their policies ---------------------------------------------------------------------------

def _least_privilege(statements: list[dict]) -> None:
    for s in statements:
        assert s["effect"] == "allow" and "*" not in s["resource"]
        assert all(not a.endswith(":*") and a != "*" for a in s["action"])


def test_the_machines_roles_are_for_cvm_only_and_the_jobs_role_for_the_nodes_through_their_policy(tencent_run):
    trust = {"version": "2.0", "statement": [
        {"action": ["name/sts:AssumeRole"], "effect": "allow", "principal": {"service": ["cvm.qcloud.com"]}}]}
    nodes, ctl = tencent_run.one(ROLE, "identity-nodes"), tencent_run.one(ROLE, "identity-controller")
    assert doc(nodes) == doc(ctl) == trust
    jobs = tencent_run.one(ROLE, "identity-jobs")
    assert jobs.inputs["name"] == "gpufleet-tencent-jobs" and jobs.inputs["consoleLogin"] is False
    assert doc(jobs) == {"version": "2.0", "statement": [{"action": ["name/sts:AssumeRole"], "effect": "allow",
                                                          "principal": {"qcs": [f"qcs::cam::uin/{TENCENT_UIN}:root"]}}]}
    assumers = [p.inputs["name"] for p in tencent_run.of_type(POLICY)
                if "name/sts:AssumeRole" in json.dumps(doc(p)["statement"])]
    assert assumers == ["gpufleet-tencent-nodes"]  # only the nodes' policy may assume it (not the controller's)
    assert (nodes.inputs["name"], ctl.inputs["name"]) == ("gpufleet-tencent-nodes", "gpufleet-tencent-controller")
    assert nodes.inputs["consoleLogin"] is False and ctl.inputs["consoleLogin"] is False
    assert tencent_run.one(TEMPLATE).inputs["camRoleName"] == "gpufleet-tencent-nodes"
    assert tencent_run.one(INSTANCE).inputs["camRoleName"] == "gpufleet-tencent-controller"
    attachments = {a.inputs["roleId"]: a.inputs["policyId"] for a in tencent_run.of_type(ATTACH)}
    assert attachments == {nodes.id: tencent_run.one(POLICY, "identity-nodes-policy").id,
                           ctl.id: tencent_run.one(POLICY, "gpufleet-tencent-controller-policy").id,
                           jobs.id: tencent_run.one(POLICY, "identity-jobs-policy").id}


def test_the_job_role_reaches_only_the_teams_prefixes_and_the_stack_key(tencent_run):
    """The ceiling of a job's key: each job's policy (trainer.clouds.tencent_credentials) narrows it to one job."""
    policy = tencent_run.one(POLICY, "identity-jobs-policy")
    bucket = f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{tencent_run.outputs['bucket']}"
    statements = doc(policy)["statement"]
    assert by_resource(statements) == {
        f"{bucket}/teams/*/jobs/*": list(derive.COS_OBJECT_ACTIONS),
        f"{bucket}/teams/*/code/*": ["name/cos:GetObject", "name/cos:HeadObject"],
        f"{bucket}/teams/*/data/*": ["name/cos:GetObject", "name/cos:HeadObject"],
        f"{bucket}/": ["name/cos:HeadBucket"],  # and GetBucket, under the condition below
        _qcs("kms", f"key/creatorUin/{TENCENT_UIN}/{tencent_run.one(KEY).id}"):
            ["name/kms:Encrypt", "name/kms:Decrypt", "name/kms:GenerateDataKey"],
    }
    (listing,) = [s for s in statements if s["action"] == ["name/cos:GetBucket"]]
    assert listing["resource"] == [f"{bucket}/"]
    assert listing["condition"] == {"string_like": {"cos:prefix": ["teams/*/jobs/*", "teams/*/code/*",
                                                                   "teams/*/data/*"]},
                                    "string_equal": {"vpc:requester_vpc": [tencent_run.outputs["vpcId"]]}}
    assert "jobs-index" not in json.dumps(statements)
    _least_privilege(statements)


def test_the_machines_and_the_jobs_keys_work_on_cos_only_from_the_stacks_vpc(tencent_run):
    """Issue 23 (stolen credentials work from anywhere): every COS statement of the node, controller and job roles
    holds its requests to the stack's VPC (vpc:requester_vpc), so a key copied off a node is refused by COS from
    anywhere else; the teams' submit groups, used from people's machines, are not held there."""
    vpc = tencent_run.outputs["vpcId"]
    for name in ("identity-nodes-policy", "gpufleet-tencent-controller-policy", "identity-jobs-policy"):
        cos = [st for st in doc(tencent_run.one(POLICY, name))["statement"]
               if any(a.startswith("name/cos:") for a in st["action"])]
        assert cos and all(a.startswith("name/cos:") for st in cos for a in st["action"]), name
        assert all(st["condition"]["string_equal"] == {"vpc:requester_vpc": [vpc]} for st in cos), name
    submit = [st for g in tencent_run.of_type(POLICY) if "-submit-" in g.inputs["name"]
              for st in doc(g)["statement"]]
    assert submit and "vpc:requester_vpc" not in json.dumps(submit)


def test_node_role_reads_the_munge_key_and_its_own_name_and_no_queue(tencent_run):
    policy = tencent_run.one(POLICY, "identity-nodes-policy")
    assert policy.inputs["name"] == "gpufleet-tencent-nodes"
    statements = doc(policy)["statement"]
    bucket = tencent_run.outputs["bucket"]
    key, topic = tencent_run.one(KEY).id, tencent_run.one(TOPIC).id
    cos = list(derive.COS_BUCKET_ACTIONS + derive.COS_OBJECT_ACTIONS)
    assert by_resource(statements) == {
        f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{bucket}/": cos,
        f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{bucket}/*": cos,
        _qcs("kms", f"key/creatorUin/{TENCENT_UIN}/{key}"):
            ["name/kms:Encrypt", "name/kms:Decrypt", "name/kms:GenerateDataKey"],
        _qcs("cls", f"topic/{topic}"): ["name/cls:pushLog"],
        _qcs("ssm", f"secret/creatorUin/{TENCENT_UIN}/gpufleet-tencent-munge"): ["name/ssm:GetSecretValue"],
        _qcs("cvm", "instance/*"): ["name/cvm:DescribeInstances"],
        f"qcs::cam::uin/{TENCENT_UIN}:roleName/gpufleet-tencent-jobs": ["name/sts:AssumeRole"],
    }
    assert not [a for s in statements for a in s["action"] if a.startswith(("name/tdmq:", "name/as:"))]
    _least_privilege(statements)


def test_controller_launches_and_ends_only_this_stacks_nodes(tencent_run):
    statements = doc(tencent_run.one(POLICY, "gpufleet-tencent-controller-policy"))["statement"]
    o = tencent_run.outputs

    def one(action: str) -> dict:
        (found,) = [s for s in statements if action in s["action"]]
        return found

    this_stack = ["gpufleet-stack&tencent"]
    run = one("name/cvm:RunInstances")
    assert run["action"] == ["name/cvm:RunInstances"]
    assert run["resource"] == [_qcs("cvm", "instance/*"), _qcs("vpc", f"vpc/{o['vpcId']}"),
                               *(_qcs("vpc", f"subnet/{s}") for s in o["subnetIds"]),
                               _qcs("cvm", f"sg/{o['nodeSecurityGroup']}"), _qcs("cvm", f"image/{o['image']}")]
    assert run["condition"] == {"for_any_value:string_equal": {"qcs:request_tag": this_stack}}
    assert _qcs("vpc", f"subnet/{o['controllerSubnet']}") not in run["resource"]
    assert one("name/cam:PassRole")["resource"] == [f"qcs::cam::uin/{TENCENT_UIN}:roleName/gpufleet-tencent-nodes"]
    end = one("name/cvm:TerminateInstances")
    assert end["resource"] == [_qcs("cvm", "instance/*")]
    assert end["condition"] == {"for_any_value:string_equal": {"qcs:resource_tag": this_stack}}
    assert one("name/cvm:DescribeInstances")["resource"] == [_qcs("cvm", "instance/*")]
    munge = one("name/ssm:PutSecretValue")
    assert munge["action"] == ["name/ssm:GetSecretValue", "name/ssm:PutSecretValue"]
    assert munge["resource"] == [_qcs("ssm", f"secret/creatorUin/{TENCENT_UIN}/{o['mungeKeySecret']}")]
    assert one("name/kms:Decrypt")["resource"] == [_qcs("kms", f"key/creatorUin/{TENCENT_UIN}/{o['kmsKey']}")]
    queues = by_resource([s for s in statements if s["action"][0].startswith("name/tdmq:")])
    assert queues == {_qcs("tdmq", "queue/gpufleet-tencent-jobs"): list(derive.QUEUE_ACTIONS),
                      _qcs("tdmq", "queue/gpufleet-tencent-jobs-dead"): ["name/tdmq:SendMessage"]}
    records = one("name/cos:PutObject")["resource"]
    assert records == [f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{o['bucket']}/",
                       f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{o['bucket']}/*"]
    assert len(statements) == 9
    _least_privilege(statements)


# --- the munge key ---------------------------------------------------------------------------------------------

def test_the_munge_secret_is_made_empty_under_the_stack_key_and_only_named(tencent_run):
    secret = tencent_run.one(SECRET).inputs
    assert secret["secretName"] == tencent_run.outputs["mungeKeySecret"] == "gpufleet-tencent-munge"
    assert secret["kmsKeyId"] == tencent_run.one(KEY).id and secret["isEnabled"] is True
    assert secret["recoveryWindowInDays"] > 0
    (version,) = tencent_run.of_type(SECRET_VERSION)
    assert version.inputs == {"secretName": "gpufleet-tencent-munge", "versionId": "init", "secretString": "unset"}
    for r in tencent_run.resources:  # no secret value anywhere: that placeholder is the only one
        assert "secretBinary" not in r.inputs and ("secretString" not in r.inputs or r.inputs == version.inputs)
    for text in (controller_user_data(tencent_run), node_user_data(tencent_run)):
        assert "gpufleet-tencent-munge" in text and "munge.key" not in text and "SecretBinary" not in text
    assert node_json(tencent_run)["slurm"]["munge"] == controller_file(
        tencent_run, "/etc/gpufleet/controller.json")["slurm"]["munge"] == "gpufleet-tencent-munge"


# --- the controller -----------------------------------------------------------------------------------------

def test_the_controller_is_one_small_on_demand_cvm_at_a_fixed_private_address(tencent_run):
    cfg = tencent_config()
    ctl = tencent_run.one(INSTANCE)
    i = ctl.inputs
    assert cfg.controller.instance_type == i["instanceType"] == "S5.LARGE8" == catalog.controller_types("tencent")[0]
    assert i["instanceChargeType"] == "POSTPAID_BY_HOUR" and "spotInstanceType" not in i
    assert i["subnetId"] == tencent_run.outputs["controllerSubnet"]
    assert i["privateIp"] == derive.CONTROLLER_IP == tencent_run.outputs["controllerAddress"] == "10.72.240.10"
    assert i["availabilityZone"] == tencent_run.one(SUBNET, "gpufleet-tencent-controller").inputs["availabilityZone"]
    assert i["hostname"] == "controller" and i["imageId"] == tencent_run.outputs["image"]
    assert (i["systemDiskType"], i["systemDiskSize"]) == ("CLOUD_PREMIUM", derive.CONTROLLER_SYSTEM_DISK_GB)
    assert "dataDisks" not in i
    assert i["userDataReplaceOnChange"] is True
    assert tencent_run.outputs["controller"] == ctl.id and ctl.id.startswith("ins-")
    assert len(base64.b64decode(i["userData"])) and len(i["userData"]) <= TENCENT_USER_DATA_LIMIT


def test_controller_user_data_holds_the_cluster_and_no_secret(tencent_run):
    o = tencent_run.outputs
    conf = controller_file(tencent_run, "/etc/slurm/slurm.conf")
    assert f"SlurmctldHost=controller({derive.CONTROLLER_IP})" in conf.splitlines()
    assert "enable_configless" in conf and f"StateSaveLocation={slurm.STATE_DIR}" in conf
    assert "PartitionName=gpu Nodes=gpu-[1-4] Default=YES" in conf
    assert "ResumeProgram=/usr/local/sbin/gpufleet-resume" in conf
    assert "NodeName=gpu-[1-4]" in controller_file(tencent_run, "/etc/slurm/gres.conf")
    ctl = controller_file(tencent_run, "/etc/gpufleet/controller.json")
    assert (ctl["cloud"], ctl["region"], ctl["bucket"], ctl["queue_url"]) == (
        "tencent", REGION, f"cos://{o['bucket']}", o["queueUrl"])
    assert (ctl["partition"], ctl["gpus"], ctl["instance_type"]) == ("gpu", 8, "GN10Xp.20XLARGE320")
    assert ctl["slurm"] == {"controller_addr": derive.CONTROLLER_IP, "controller_port": 6817,
                            "munge": "gpufleet-tencent-munge"}
    assert ctl["tencent"] == {"app_id": TENCENT_APP_ID, "role_name": "gpufleet-tencent-controller",
                              "cos_endpoint": "https://cos.ap-shanghai.myqcloud.com"}
    assert ctl["state_dir"] == slurm.STATE_DIR
    nodes = controller_file(tencent_run, "/etc/gpufleet/nodes.json")
    assert (nodes["provider"], nodes["cloud"], nodes["stack"], nodes["region"]) == ("tencent", "tencent", "tencent",
                                                                                    REGION)
    assert nodes["tags"] == tencent_config().all_tags
    assert nodes["tencent"] == {"role_name": "gpufleet-tencent-controller"}
    zones = [s.inputs["availabilityZone"] for s in node_subnets(tencent_run)]
    assert nodes["partitions"] == {"gpu": {
        "instance_types": ["GN10Xp.20XLARGE320"], "spot": True, "on_demand_base": 0, "gang": False,
        "launch_template_id": o["launchTemplates"]["gpu"], "vpc_id": o["vpcId"], "subnet_ids": o["subnetIds"],
        "zones": zones, "placement_set_id": None,
        "spot_max_price": f"{catalog.CATALOG['GN10Xp.20XLARGE320'].price_hour:.2f}"}}
    assert o["launchTemplates"]["gpu"] == tencent_run.one(TEMPLATE).id


# --- the partitions ------------------------------------------------------------------------------------------

def test_a_partitions_launch_template_boots_a_slurm_node(tencent_run):
    o = tencent_run.outputs
    t = tencent_run.one(TEMPLATE).inputs
    assert t["launchTemplateName"] == "gpufleet-tencent-gpu-node"
    (lookup,) = [a for token, a in tencent_run.calls if token == "tencentcloud:Images/getInstance:getInstance"]
    assert lookup == {"imageNameRegex": "^gpufleet-gpu-", "imageTypes": ["PRIVATE_IMAGE"]}
    assert t["imageId"] == o["image"] and t["imageId"].startswith("img-")
    assert t["instanceType"] == "GN10Xp.20XLARGE320"
    assert t["instanceChargeType"] == "POSTPAID_BY_HOUR" and "instanceMarketOptions" not in t
    assert t["systemDisk"] == {"diskType": "CLOUD_PREMIUM", "diskSize": derive.NODE_SYSTEM_DISK_GB}
    assert "dataDisks" not in t and "disasterRecoverGroupIds" not in t
    assert t["virtualPrivateCloud"] == {"vpcId": o["vpcId"], "subnetId": o["subnetIds"][0]}
    assert t["placement"] == {"zone": node_subnets(tencent_run)[0].inputs["availabilityZone"], "projectId": 0}
    assert t["enhancedService"] == {"monitorService": {"enabled": True}, "securityService": {"enabled": True},
                                    "automationService": {"enabled": True}}
    text = node_user_data(tencent_run)
    node = node_json(tencent_run)
    assert text == render_node_user_data(node) and "gpufleet-node.service" in text and "gpufleet-agent" not in text
    assert len(t["userData"]) <= TENCENT_USER_DATA_LIMIT
    assert (node["cloud"], node["bucket"]) == ("tencent", f"cos://{o['bucket']}")
    assert node["tencent"]["role_name"] == "gpufleet-tencent-nodes" and node["log_group"] == o["logTopic"]
    # what its credentials daemon narrows each job's key to (trainer.node.jobcreds)
    assert node["tencent"]["job_role_arn"] == f"qcs::cam::uin/{TENCENT_UIN}:roleName/gpufleet-tencent-jobs"
    assert node["tencent"]["bucket"] == o["bucket"] and o["jobRole"] == "gpufleet-tencent-jobs"
    assert set(node["instance_types"]) == {"GN10Xp.20XLARGE320"}
    assert node["slurm"] == {"controller_addr": derive.CONTROLLER_IP, "controller_port": 6817,
                             "munge": "gpufleet-tencent-munge"}
    assert node["mounts"] == [{"source": f"{derive.HOME_FS_IP}:/", "target": "/home", "type": "nfs4",
                               "options": derive.NFS_OPTIONS}]


def test_partition_component_carries_what_the_policies_judge(tencent_run):
    (part,) = tencent_run.of_type(PARTITION)
    cfg = tencent_config()
    assert part.inputs == {"partition": "gpu", "instanceTypes": list(cfg.instance_types), "maxNodes": cfg.nodes.max,
                           "alwaysOn": cfg.nodes.min, "spot": cfg.spot, "onDemandBase": cfg.on_demand_base,
                           "gang": False, "gpusPerNode": cfg.primary.gpus,
                           "subnetIds": tencent_run.outputs["subnetIds"]}
    (template,) = tencent_run.of_type(TEMPLATE)
    assert template.parent_type == PARTITION


def test_partitions_key_gives_a_template_per_partition(two_partitions):
    run, o = two_partitions, two_partitions.outputs
    templates = {t.inputs["launchTemplateName"]: t for t in run.of_type(TEMPLATE)}
    assert sorted(templates) == ["gpufleet-tencent-big-node", "gpufleet-tencent-small-node"]
    assert o["partitions"] == ["small", "big"]
    assert o["launchTemplates"] == {"small": templates["gpufleet-tencent-small-node"].id,
                                    "big": templates["gpufleet-tencent-big-node"].id}
    parts = {p.inputs["partition"]: p.inputs for p in run.of_type(PARTITION)}
    assert parts["small"] == {"partition": "small", "instanceTypes": ["GN7.2XLARGE32", "GN7.10XLARGE160"],
                              "maxNodes": 8, "alwaysOn": 0, "spot": True, "onDemandBase": 1, "gang": False,
                              "gpusPerNode": 1, "subnetIds": o["subnetIds"]}
    assert parts["big"] == {"partition": "big", "instanceTypes": ["GT4.41XLARGE948"], "maxNodes": 2, "alwaysOn": 0,
                            "spot": False, "onDemandBase": 0, "gang": True, "gpusPerNode": 8,
                            "subnetIds": o["subnetIds"][:1]}
    nodes = controller_file(run, "/etc/gpufleet/nodes.json")["partitions"]
    assert len(nodes["small"]["subnet_ids"]) == 3 and nodes["big"]["subnet_ids"] == o["subnetIds"][:1]
    assert len(nodes["big"]["zones"]) == 1 and nodes["big"]["gang"] is True
    assert nodes["small"]["spot_max_price"] == f"{catalog.CATALOG['GN7.10XLARGE160'].price_hour:.2f}"
    assert "spot_max_price" not in nodes["big"] and nodes["big"]["spot"] is False
    assert (nodes["small"]["on_demand_base"], nodes["small"]["instance_types"]) == (
        1, ["GN7.2XLARGE32", "GN7.10XLARGE160"])
    assert {p["placement_set_id"] for p in nodes.values()} == {None}
    big = node_json(run, "big")
    assert set(big["instance_types"]) == {"GT4.41XLARGE948"}
    assert set(node_json(run, "small")["instance_types"]) == {"GN7.2XLARGE32", "GN7.10XLARGE160"}
    assert templates["gpufleet-tencent-big-node"].inputs["virtualPrivateCloud"]["subnetId"] == o["subnetIds"][0]
    conf = controller_file(run, "/etc/slurm/slurm.conf")
    assert "PartitionName=small Nodes=small-[1-8] Default=YES" in conf
    assert "PartitionName=big Nodes=big-[1-2] Default=NO" in conf
    ctl = controller_file(run, "/etc/gpufleet/controller.json")
    assert (ctl["partition"], ctl["gpus"], ctl["instance_type"]) == ("small", 1, "GN7.2XLARGE32")
    # zones: those selling both partitions' primary types, one lookup per family
    families = sorted(a["filters"][0]["values"][0] for t, a in run.calls
                      if t == "tencentcloud:Instance/getTypes:getTypes")
    assert families == ["GN7", "GT4"]


def test_a_stack_of_gang_partitions_only_has_one_node_subnet():
    run = run_stack(tencent_config(mode="gang", instanceTypes=["GT4.41XLARGE948"], spot=False,
                                   nodes={"min": 0, "desired": 0, "max": 2}))
    (subnet,) = node_subnets(run)
    assert run.outputs["subnetIds"] == [subnet.id]
    nodes = controller_file(run, "/etc/gpufleet/nodes.json")["partitions"]["gpu"]
    assert nodes["gang"] is True and nodes["subnet_ids"] == [subnet.id] and "spot_max_price" not in nodes
    (zones,) = [a for t, a in run.calls if t == "tencentcloud:Instance/getTypes:getTypes"]
    assert zones["filters"] == [{"name": "instance-family", "values": ["GT4"]}] and zones["excludeSoldOut"] is True


def test_an_image_id_is_used_as_given():
    run = run_stack(tencent_config(image={"id": "img-0a1b2c3d"}))
    assert run.one(TEMPLATE).inputs["imageId"] == run.one(INSTANCE).inputs["imageId"] == "img-0a1b2c3d"
    assert not [t for t, _ in run.calls if t == "tencentcloud:Images/getInstance:getInstance"]


def test_zones_are_those_selling_every_partitions_type():
    assert derive.zone_at(["ap-shanghai-5", "ap-shanghai-2"], 0) == "ap-shanghai-2"
    assert derive.zone_at(["ap-shanghai-5", "ap-shanghai-2"], 2) == "ap-shanghai-2"  # round robin over two
    assert derive.common_zones([["ap-shanghai-2", "ap-shanghai-4"], ["ap-shanghai-4", "ap-shanghai-5"]]) == [
        "ap-shanghai-4"]
    with pytest.raises(ValueError, match="no zone"):
        derive.zone_at(derive.common_zones([["ap-shanghai-2"], ["ap-shanghai-3"]]), 0)


# --- the shared file systems ---------------------------------------------------------------------------------

def test_home_and_the_slurm_state_are_cfs_reachable_only_from_the_cluster(tencent_run):
    o = tencent_run.outputs
    systems = {f.name: f for f in tencent_run.of_type(FS)}
    home, state = systems["gpufleet-tencent-home"], systems["gpufleet-tencent-slurm-state"]
    assert (o["sharedFileSystem"], o["slurmStateFileSystem"]) == (home.id, state.id)
    ctl_subnet = tencent_run.one(SUBNET, "gpufleet-tencent-controller")
    for fs, ip in ((home, derive.HOME_FS_IP), (state, derive.STATE_FS_IP)):
        i = fs.inputs
        assert (i["protocol"], i["storageType"], i["netInterface"]) == ("NFS", "SD", "VPC")
        assert (i["vpcId"], i["subnetId"], i["mountIp"]) == (o["vpcId"], ctl_subnet.id, ip)
        assert i["availabilityZone"] == ctl_subnet.inputs["availabilityZone"]
    groups = {g.name: g.id for g in tencent_run.of_type(FS_GROUP)}
    assert home.inputs["accessGroupId"] == groups["gpufleet-tencent-home"]
    assert state.inputs["accessGroupId"] == groups["gpufleet-tencent-slurm-state"]
    rules = {}
    for r in tencent_run.of_type(FS_RULE):
        rules.setdefault(r.inputs["accessGroupId"], []).append(
            (r.inputs["authClientIp"], r.inputs["rwPermission"], r.inputs["userPermission"]))
    node_cidrs = [s.inputs["cidrBlock"] for s in node_subnets(tencent_run)]
    assert sorted(rules[groups["gpufleet-tencent-home"]]) == sorted(
        [(derive.CONTROLLER_IP, "RW", "no_root_squash")] + [(c, "RW", "root_squash") for c in node_cidrs])
    assert rules[groups["gpufleet-tencent-slurm-state"]] == [(derive.CONTROLLER_IP, "RW", "no_root_squash")]
    ctl = controller_file(tencent_run, "/etc/gpufleet/controller.json")
    assert ctl["mounts"] == [
        {"source": f"{derive.HOME_FS_IP}:/", "target": "/home", "type": "nfs4", "options": derive.NFS_OPTIONS},
        {"source": f"{derive.STATE_FS_IP}:/", "target": slurm.STATE_DIR, "type": "nfs4",
         "options": derive.NFS_OPTIONS}]
    assert [m["target"] for m in node_json(tencent_run)["mounts"]] == ["/home"]  # never the Slurm state


def test_the_disks_and_file_systems_are_the_cost_models(tencent_run):
    """What infra.preview.cost prices: the controller's and each node's system disk, CFS Standard."""
    assert derive.NODE_SYSTEM_DISK_GB == cost.TENCENT_SYSTEM_DISK_GB
    assert derive.CONTROLLER_SYSTEM_DISK_GB == cost.TENCENT_CONTROLLER_SYSTEM_DISK_GB
    assert {f.inputs["storageType"] for f in tencent_run.of_type(FS)} == {"SD"}


# --- monitoring ---------------------------------------------------------------------------------------------

def test_alarms_reach_the_alert_group_and_the_budget_is_in_cny(tencent_run):
    cfg = tencent_config()
    group = tencent_run.one(CAM_GROUP, "gpufleet-tencent-alerts")
    notice = tencent_run.one(NOTICE)
    (user,) = notice.inputs["userNotices"]
    assert user["receiverType"] == "GROUP" and user["groupIds"] == [int(group.id)]
    alarms = {a.inputs["policyName"].removeprefix("gpufleet-tencent-"): a for a in tencent_run.of_type(ALARM)}
    assert set(alarms) == {"idle-gpus", "busy-cpu", "busy-memory", "dead-letters", "controller-down"}
    for label in ("idle-gpus", "busy-cpu", "busy-memory"):
        a = alarms[label].inputs
        assert (a["namespace"], a["monitorType"]) == ("cvm_device", "MT_QCE")
        assert a["policyTags"] == [{"key": "gpufleet-stack", "value": "tencent"}]
    rule = lambda label: alarms[label].inputs["conditions"]["rules"][0]  # noqa: E731
    assert (rule("idle-gpus")["metricName"], rule("idle-gpus")["operator"], rule("idle-gpus")["value"],
            rule("idle-gpus")["continuePeriod"]) == ("GpuUtil", "lt", "5", 6)
    assert [(rule(x)["metricName"], rule(x)["operator"], rule(x)["value"]) for x in ("busy-cpu", "busy-memory")] == [
        ("CpuUsage", "ge", "90"), ("MemUsage", "ge", "90")]
    assert all(a.inputs["noticeIds"] == [notice.id] for a in alarms.values())
    for a in alarms.values():  # Cloud Monitor's remarks: letters, digits, '_' and '-' only
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,100}", a.inputs["remark"]), a.inputs["remark"]
    bindings = {b.inputs["policyId"]: json.loads(b.inputs["dimensions"][0]["dimensionsJson"])
                for b in tencent_run.of_type(BINDING)}
    dead = tencent_run.one(QUEUE, "queue-dead")
    assert bindings[alarms["dead-letters"].id] == {"queueId": dead.id, "queueName": "gpufleet-tencent-jobs-dead"}
    assert rule("dead-letters")["metricName"] == "VisibleMsgNum" and rule("dead-letters")["operator"] == "gt"
    down = alarms["controller-down"].inputs
    assert (down["namespace"], down["eventConditions"]) == ("cvm_device", [{"metricName": "ping_unreachable"}])
    assert "conditions" not in down and "policyTags" not in down
    assert bindings[alarms["controller-down"].id] == {"unInstanceId": tencent_run.outputs["controller"]}
    b = tencent_run.one(BUDGET).inputs
    assert (b["budgetQuota"], b["cycleType"], b["planType"]) == (f"{cfg.budget_monthly_cny:.2f}", "MONTH", "FIX")
    assert b["dimensionsRange"] == {"tags": [{"tagKey": "gpufleet-stack", "tagValues": ["tencent"]}]}
    assert [(w["warnType"], w["thresholdValue"]) for w in b["warnJsons"]] == [
        ("ACTUAL", "80"), ("ACTUAL", "100"), ("FORECAST", "100")]
    topic = tencent_run.one(TOPIC).inputs
    assert topic["logsetId"] == tencent_run.one(LOGSET).id and topic["period"] == 365


# --- outputs ------------------------------------------------------------------------------------------------

def test_outputs_name_what_users_and_operators_need(tencent_run):
    out = tencent_run.outputs
    for key in ("bucket", "queueUrl", "dlqUrl", "controller", "controllerAddress", "partitions", "launchTemplates",
                "mungeKeySecret", "sharedFileSystem", "slurmStateFileSystem", "nodeRole", "controllerRole", "vpcId",
                "subnetIds", "controllerSubnet", "nodeSecurityGroup", "controllerSecurityGroup", "logTopic",
                "alertGroup", "budget", "kmsKey", "image"):
        assert out[key], key
    assert out["checkpointUriTemplate"] == f"cos://{out['bucket']}/teams/<team>/jobs/<job_id>/"
    assert out["teams"] == ["default"]  # no gpufleet:teams in Pulumi.tencent.yaml: the one default team
    assert out["cosEndpoint"] == "https://cos.ap-shanghai.myqcloud.com"
    assert out["partitions"] == ["gpu"] and out["controllerAddress"] == derive.CONTROLLER_IP
    assert out["alertGroup"] == "gpufleet-tencent-alerts" and out["mungeKeySecret"] == "gpufleet-tencent-munge"
    assert len(out["subnetIds"]) == 3 and out["vpcId"].startswith("vpc-")
    assert out["sharedFileSystem"].startswith("cfs-") and out["launchTemplates"]["gpu"].startswith("lt-")


def test_the_teams_output_is_the_configs_teams_in_order():
    """The trainer's commands take outputs["teams"][0] as the team of the stack's one queue."""
    teams = [{"name": "speech", "fairShare": 2}, {"name": "nlp"}]
    assert run_stack(tencent_config(teams=teams)).outputs["teams"] == ["speech", "nlp"]
