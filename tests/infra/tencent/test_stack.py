"""The Tencent stack on Pulumi's mock runtime: what it registers, with which inputs, under which parents."""
from __future__ import annotations

import base64
import importlib
import inspect
import ipaddress
import json
import zipfile

import pytest

from infra import catalog
from infra.preview import cost
from infra.preview.mocks import TENCENT_APP_ID, TENCENT_UIN
from infra.tencent import derive
from infra.tencent.scaler import HANDLER, SOURCES
from tests.infra.tencent.conftest import run_stack, tencent_config

T = "tencentcloud:"
VPC, SUBNET = T + "Vpc/instance:Instance", T + "Subnet/instance:Instance"
SG, RULES = T + "Security/group:Group", T + "Security/groupRuleSet:GroupRuleSet"
BUCKET, BUCKET_POLICY, KEY = T + "Cos/bucket:Bucket", T + "Cos/bucketPolicy:BucketPolicy", T + "Kms/key:Key"
ROLE, POLICY, ATTACH = T + "Cam/role:Role", T + "Cam/policy:Policy", T + "Cam/rolePolicyAttachment:RolePolicyAttachment"
CONFIG, GROUP, HOOK = T + "As/scalingConfig:ScalingConfig", T + "As/scalingGroup:ScalingGroup", T + "As/lifecycleHook:LifecycleHook"
QUEUE, LOGSET, TOPIC = T + "Tcmq/queue:Queue", T + "Cls/logset:Logset", T + "Cls/topic:Topic"
NOTICE, ALARM, BINDING = (T + "Monitor/alarmNotice:AlarmNotice", T + "Monitor/alarmPolicy:AlarmPolicy",
                          T + "Monitor/policyBindingObject:PolicyBindingObject")
BUDGET, FUNCTION, CAM_GROUP = T + "Billing/budget:Budget", T + "Scf/function:Function", T + "Cam/group:Group"


def _taggable(typ: str) -> bool:
    """Whether the SDK's class of a token (tencentcloud:As/scalingConfig:ScalingConfig) takes tags."""
    module, kind = typ.split(":")[1].split("/")
    package = "as_" if module == "As" else module.lower()
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in kind).lstrip("_")
    cls = getattr(importlib.import_module(f"tencentcloud_iac_pulumi.{package}.{snake}"), typ.rsplit(":", 1)[1])
    return "tags" in inspect.signature(cls._internal_init).parameters


def doc(resource) -> dict:
    return json.loads(resource.inputs["document"] if "document" in resource.inputs else resource.inputs["policy"])


def test_every_resource_sits_in_a_component_and_every_taggable_one_carries_the_tags(tencent_run):
    cfg = tencent_config()
    components = {r.type for r in tencent_run.resources if r.type.startswith("gpufleet:tencent:")}
    assert components == {f"gpufleet:tencent:{c}" for c in
                          ("Network", "Storage", "JobQueue", "Monitoring", "Identity", "Compute", "Scaler")}
    provider = [r for r in tencent_run.resources if r.type.startswith(T)]
    assert {r.type for r in provider} >= {VPC, SUBNET, SG, RULES, BUCKET, BUCKET_POLICY, KEY, ROLE, POLICY, ATTACH,
                                          CONFIG, GROUP, HOOK, QUEUE, LOGSET, TOPIC, NOTICE, ALARM, BINDING, BUDGET,
                                          FUNCTION}
    for r in provider:
        assert r.parent_type in components, r.urn
        if _taggable(r.type):
            assert r.inputs.get("tags") == cfg.all_tags, r.urn
    assert tencent_run.one(CONFIG).inputs["instanceTags"] == cfg.all_tags  # on every node, for alarms and budget


def test_network_is_private_and_only_nodes_of_the_stack_talk_to_each_other(tencent_run):
    vpc = tencent_run.one(VPC)
    space = ipaddress.ip_network(vpc.inputs["cidrBlock"])
    subnets = tencent_run.of_type(SUBNET)
    assert len(subnets) == derive.QUEUE_ZONES
    assert len({s.inputs["availabilityZone"] for s in subnets}) == 3
    assert all(s.inputs["availabilityZone"].startswith("ap-shanghai-") for s in subnets)
    for s in subnets:
        assert ipaddress.ip_network(s.inputs["cidrBlock"]).subnet_of(space) and s.inputs["vpcId"] == vpc.id
    sg = tencent_run.one(SG)
    rules = tencent_run.one(RULES).inputs
    assert rules["securityGroupId"] == sg.id
    ingress = rules["ingresses"]
    assert ingress[0] == {**ingress[0], "action": "ACCEPT", "protocol": "ALL", "sourceSecurityId": sg.id}
    assert [(r["action"], r.get("cidrBlock")) for r in ingress[1:]] == [("DROP", "0.0.0.0/0")]
    egress = rules["egresses"]
    assert (egress[0]["action"], egress[0]["cidrBlock"]) == ("ACCEPT", derive.VPC_CIDR)
    assert [(r["protocol"], r["port"]) for r in egress[1:3]] == [("TCP", "80,443"), ("UDP", "53,123")]
    assert (egress[-1]["action"], egress[-1]["cidrBlock"], egress[-1]["protocol"]) == ("DROP", "0.0.0.0/0", "ALL")
    node = tencent_run.one(CONFIG).inputs
    assert node["publicIpAssigned"] is False and node["internetMaxBandwidthOut"] == 0
    assert node["securityGroupIds"] == [sg.id]
    assert not [r for r in tencent_run.resources if "nat" in r.type.lower() or "eip" in r.type.lower()]


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
        resources = [f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{name}/", f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{name}/*"]
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


def test_node_role_policy_names_every_resource_and_no_wildcard(tencent_run):
    role = tencent_run.one(ROLE, "identity-nodes")
    assert doc(role) == {"version": "2.0", "statement": [
        {"action": ["name/sts:AssumeRole"], "effect": "allow", "principal": {"service": ["cvm.qcloud.com"]}}]}
    assert tencent_run.one(CONFIG).inputs["camRoleName"] == role.inputs["name"] == "gpufleet-tencent-nodes"
    policy = tencent_run.one(POLICY, "identity-nodes-policy")
    attach = tencent_run.one(ATTACH, "identity-nodes-policy-attachment").inputs
    assert (attach["roleId"], attach["policyId"]) == (role.id, policy.id)
    statements = doc(policy)["statement"]
    bucket = tencent_run.outputs["bucket"]
    key, group, topic = tencent_run.one(KEY).id, tencent_run.one(GROUP).id, tencent_run.one(TOPIC).id
    by_resource = {r: s["action"] for s in statements for r in s["resource"]}
    assert by_resource == {
        f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{bucket}/": list(derive.COS_BUCKET_ACTIONS + derive.COS_OBJECT_ACTIONS),
        f"qcs::cos:ap-shanghai:uid/{TENCENT_APP_ID}:{bucket}/*": list(derive.COS_BUCKET_ACTIONS + derive.COS_OBJECT_ACTIONS),
        f"qcs::kms:ap-shanghai:uin/{TENCENT_UIN}:key/creatorUin/{TENCENT_UIN}/{key}":
            ["name/kms:Encrypt", "name/kms:Decrypt", "name/kms:GenerateDataKey"],
        f"qcs::tdmq:ap-shanghai:uin/{TENCENT_UIN}:queue/gpufleet-tencent-jobs": list(derive.QUEUE_ACTIONS),
        f"qcs::tdmq:ap-shanghai:uin/{TENCENT_UIN}:queue/gpufleet-tencent-jobs-dead": ["name/tdmq:SendMessage"],
        f"qcs::as:ap-shanghai:uin/{TENCENT_UIN}:auto-scaling-group/{group}":
            ["name/as:CompleteLifecycleAction", "name/as:SetInstancesProtection",
             "name/as:DescribeAutoScalingInstances", "name/as:DescribeLifecycleHooks"],
        f"qcs::cls:ap-shanghai:uin/{TENCENT_UIN}:topic/{topic}": ["name/cls:pushLog"],
    }
    for s in statements:
        assert s["effect"] == "allow" and "*" not in s["resource"]
        assert all(not a.endswith(":*") and a != "*" for a in s["action"])


def test_launch_configuration_runs_the_cloud_config_of_this_node_on_spot(tencent_run):
    from infra.userdata import render_user_data

    cfg = tencent_config()
    node = tencent_run.one(CONFIG).inputs
    assert node["instanceTypes"] == ["GN10Xp.20XLARGE320"]
    (lookup,) = [a for t, a in tencent_run.calls if t == "tencentcloud:Images/getInstance:getInstance"]
    assert lookup == {"imageNameRegex": "^gpufleet-gpu-", "imageTypes": ["PRIVATE_IMAGE"]}
    assert node["imageId"].startswith("img-") and tencent_run.outputs["launchConfiguration"].startswith("asc-")
    assert (node["systemDiskType"], node["systemDiskSize"]) == ("CLOUD_PREMIUM", cost.TENCENT_SYSTEM_DISK_GB)
    assert "dataDisks" not in node  # AS cannot encrypt them
    assert node["keepImageLogin"] is True and "password" not in node and "keyIds" not in node
    assert node["enhancedMonitorService"] is True and node["enhancedAutomationToolsService"] is True
    assert (node["instanceChargeType"], node["spotInstanceType"], node["spotMaxPrice"]) == (
        "SPOTPAID", "one-time", f"{catalog.CATALOG['GN10Xp.20XLARGE320'].price_hour:.2f}")
    settings = derive.node_settings(cfg, derive.Names.of("tencent"), bucket=tencent_run.outputs["bucket"],
                                    app_id=TENCENT_APP_ID, log_topic=tencent_run.outputs["logTopic"])
    text = base64.b64decode(node["userData"]).decode()
    assert text.startswith("#cloud-config") and text == render_user_data(settings)
    assert settings["bucket"] == f"cos://{tencent_run.outputs['bucket']}"
    assert settings["queue_url"] == tencent_run.outputs["queueUrl"] == \
        "http://sh.mqadapter.cmq.tencentyun.com/gpufleet-tencent-jobs"
    assert settings["tencent"]["role_name"] == "gpufleet-tencent-nodes"


def test_queue_mode_group_scales_from_zero_over_three_zones_with_both_hooks(tencent_run):
    g = tencent_run.one(GROUP).inputs
    assert (g["minSize"], g["desiredCapacity"], g["maxSize"]) == (0, 0, 4)
    assert g["configurationId"] == tencent_run.one(CONFIG).id and g["vpcId"] == tencent_run.one(VPC).id
    assert sorted(g["subnetIds"]) == sorted(s.id for s in tencent_run.of_type(SUBNET)) and g["multiZoneSubnetPolicy"] == "EQUALITY"
    hooks = {h.inputs["lifecycleTransition"]: h.inputs for h in tencent_run.of_type(HOOK)}
    assert hooks["INSTANCE_LAUNCHING"] == {**hooks["INSTANCE_LAUNCHING"], "defaultResult": "ABANDON",
                                           "heartbeatTimeout": 1800, "lifecycleHookName": "gpufleet-tencent-preflight"}
    assert hooks["INSTANCE_TERMINATING"] == {**hooks["INSTANCE_TERMINATING"], "defaultResult": "CONTINUE",
                                             "heartbeatTimeout": 600, "lifecycleHookName": "gpufleet-tencent-checkpoint"}
    assert all(h["scalingGroupId"] == tencent_run.one(GROUP).id for h in hooks.values())


def test_the_scaler_function_sets_the_group_from_the_backlog_every_minute(tencent_run):
    f = tencent_run.one(FUNCTION).inputs
    group = tencent_run.one(GROUP).id
    assert (f["runtime"], f["handler"], f["timeout"]) == ("Python3.9", HANDLER, 30)
    assert f["triggers"] == [{"name": "every-minute", "type": "timer", "triggerDesc": "0 */1 * * * * *"}]
    assert f["environment"] == {"GPUFLEET_REGION": "ap-shanghai", "GPUFLEET_QUEUE": "gpufleet-tencent-jobs",
                                "GPUFLEET_GROUP_ID": group, "GPUFLEET_MIN": "0", "GPUFLEET_MAX": "4"}
    with zipfile.ZipFile(f["zipFile"]) as z:
        assert sorted(z.namelist()) == sorted(SOURCES)
        assert all(z.read(n) == SOURCES[n].read_bytes() for n in SOURCES)
    role = tencent_run.one(ROLE, "scaler-role")
    assert f["role"] == role.inputs["name"]
    assert doc(role)["statement"][0]["principal"] == {"service": ["scf.qcloud.com"]}
    assert doc(tencent_run.one(POLICY, "scaler-policy"))["statement"] == [
        {"effect": "allow", "action": ["name/tdmq:DescribeCmqQueueDetail"],
         "resource": [f"qcs::tdmq:ap-shanghai:uin/{TENCENT_UIN}:queue/gpufleet-tencent-jobs"]},
        {"effect": "allow", "action": ["name/as:ModifyDesiredCapacity"],
         "resource": [f"qcs::as:ap-shanghai:uin/{TENCENT_UIN}:auto-scaling-group/{group}"]}]


def test_job_queue_hides_a_job_for_its_window_and_dead_letters_after_three_receives(tencent_run):
    queues = {q.inputs["queueName"]: q.inputs for q in tencent_run.of_type(QUEUE)}
    jobs, dead = queues["gpufleet-tencent-jobs"], queues["gpufleet-tencent-jobs-dead"]
    assert (jobs["visibilityTimeout"], jobs["msgRetentionSeconds"], jobs["pollingWaitSeconds"]) == (10800, 43200, 20)
    assert (jobs["deadLetterQueueName"], jobs["policy"], jobs["maxReceiveCount"]) == ("gpufleet-tencent-jobs-dead", 0, 3)
    assert dead["msgRetentionSeconds"] == 43200 and "deadLetterQueueName" not in dead
    assert tencent_run.outputs["dlqUrl"] == "http://sh.mqadapter.cmq.tencentyun.com/gpufleet-tencent-jobs-dead"


def test_alarms_reach_the_alert_group_and_the_budget_is_in_cny(tencent_run):
    cfg = tencent_config()
    group = tencent_run.one(CAM_GROUP)
    notice = tencent_run.one(NOTICE)
    (user,) = notice.inputs["userNotices"]
    assert user["receiverType"] == "GROUP" and user["groupIds"] == [int(group.id)]
    alarms = {a.inputs["policyName"].removeprefix("gpufleet-tencent-"): a for a in tencent_run.of_type(ALARM)}
    assert set(alarms) == {"idle-gpus", "busy-cpu", "busy-memory", "dead-letters"}
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
    dead = tencent_run.one(QUEUE, "queue-dead")
    binding = tencent_run.one(BINDING).inputs
    assert binding["policyId"] == alarms["dead-letters"].id
    assert json.loads(binding["dimensions"][0]["dimensionsJson"]) == {"queueId": dead.id,
                                                                      "queueName": "gpufleet-tencent-jobs-dead"}
    assert rule("dead-letters")["metricName"] == "VisibleMsgNum" and rule("dead-letters")["operator"] == "gt"
    b = tencent_run.one(BUDGET).inputs
    assert (b["budgetQuota"], b["cycleType"], b["planType"]) == (f"{cfg.budget_monthly_cny:.2f}", "MONTH", "FIX")
    assert b["dimensionsRange"] == {"tags": [{"tagKey": "gpufleet-stack", "tagValues": ["tencent"]}]}
    assert [(w["warnType"], w["thresholdValue"]) for w in b["warnJsons"]] == [
        ("ACTUAL", "80"), ("ACTUAL", "100"), ("FORECAST", "100")]
    topic = tencent_run.one(TOPIC).inputs
    assert topic["logsetId"] == tencent_run.one(LOGSET).id and topic["period"] == 365


def test_outputs_name_what_users_and_nodes_need(tencent_run):
    out = tencent_run.outputs
    assert out["checkpointUriTemplate"] == f"cos://{out['bucket']}/jobs/<job_id>/"
    assert out["cosEndpoint"] == "https://cos.ap-shanghai.myqcloud.com"
    assert out["scalingGroup"].startswith("asg-") and out["scalingGroupName"] == "gpufleet-tencent-nodes"
    assert out["alertGroup"] == "gpufleet-tencent-alerts" and out["scaler"] == "gpufleet-tencent-scaler"
    assert len(out["subnetIds"]) == 3 and out["vpcId"].startswith("vpc-")


def test_gang_mode_on_demand_holds_a_fixed_size_in_one_zone_without_a_scaler():
    run = run_stack(tencent_config(mode="gang", instanceTypes=["GT4.41XLARGE948"], spot=False,
                                   nodes={"min": 2, "desired": 2, "max": 2}))
    assert run.of_type(FUNCTION) == [] and "scaler" not in run.outputs
    (subnet,) = run.of_type(SUBNET)
    g = run.one(GROUP).inputs
    assert (g["minSize"], g["desiredCapacity"], g["maxSize"]) == (2, 2, 2) and g["subnetIds"] == [subnet.id]
    node = run.one(CONFIG).inputs
    assert node["instanceChargeType"] == "POSTPAID_BY_HOUR" and "spotMaxPrice" not in node
    (zones,) = [a for t, a in run.calls if t == "tencentcloud:Instance/getTypes:getTypes"]
    assert zones["filters"] == [{"name": "instance-family", "values": ["GT4"]}] and zones["excludeSoldOut"] is True


def test_an_image_id_is_used_as_given():
    run = run_stack(tencent_config(image={"id": "img-0a1b2c3d"}))
    assert run.one(CONFIG).inputs["imageId"] == "img-0a1b2c3d"
    assert not [t for t, _ in run.calls if t == "tencentcloud:Images/getInstance:getInstance"]


def test_zones_without_the_type_are_never_used():
    assert derive.zone_at(["ap-shanghai-5", "ap-shanghai-2"], 0) == "ap-shanghai-2"
    assert derive.zone_at(["ap-shanghai-5", "ap-shanghai-2"], 2) == "ap-shanghai-2"  # round robin over two
    with pytest.raises(ValueError, match="no zone"):
        derive.zone_at([], 0)
