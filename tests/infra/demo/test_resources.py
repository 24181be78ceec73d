"""What the demo creates, from the dev stack's real preview: the requests (pure), then the same created
in moto server by the demo's Cluster and read back."""
from __future__ import annotations

import json

import pytest

from infra.demo import resources as rs
from infra.demo.cluster import Cluster, node_settings, preview_document
from trainer.node import node_schema


@pytest.fixture(scope="module")
def doc():
    return preview_document("dev")


@pytest.fixture(scope="module")
def res(doc):
    return rs.stack_resources(doc)


def test_names_come_from_the_preview(doc, res):
    out = doc["outputs"]
    assert res.bucket_name == out["bucket"]
    assert res.jobs.mock_url == out["queueUrl"] and res.dlq.mock_url == out["dlqUrl"]
    assert res.jobs.name == out["queueUrl"].rsplit("/", 1)[1] and res.dlq.name == out["dlqUrl"].rsplit("/", 1)[1]
    assert res.key_arn == out["kmsKey"] and res.key_arn.endswith(res.key["id"])
    assert res.group_name == out["autoscalingGroup"]
    assert res.instance_types == doc["config"]["instanceTypes"]
    assert res.alias == "alias/gpufleet-dev" and res.region == "eu-west-1"


def test_bucket_requests_carry_the_previewed_settings(res):
    calls = dict(rs.bucket_requests(res))
    assert calls["create_bucket"] == {"Bucket": res.bucket_name,
                                      "CreateBucketConfiguration": {"LocationConstraint": "eu-west-1"}}
    assert calls["put_bucket_versioning"]["VersioningConfiguration"] == {"Status": "Enabled"}
    rule = calls["put_bucket_encryption"]["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule == {"ApplyServerSideEncryptionByDefault": {"KMSMasterKeyID": res.key_arn, "SSEAlgorithm": "aws:kms"},
                    "BucketKeyEnabled": True}
    assert set(calls["put_public_access_block"]["PublicAccessBlockConfiguration"].values()) == {True}
    assert calls["put_bucket_ownership_controls"]["OwnershipControls"] == {
        "Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    assert calls["put_bucket_lifecycle_configuration"]["LifecycleConfiguration"]["Rules"][0]["ID"] == \
        "expire-old-versions"
    arn = f"arn:aws:s3:::{res.bucket_name}"
    assert rs.policy_resources(calls["put_bucket_policy"]["Policy"]) == {arn, f"{arn}/*"}


def test_queue_requests_carry_redrive_encryption_and_policies(res):
    (op, create), (op2, extra) = rs.queue_requests(res.jobs)
    attrs = create["Attributes"]
    assert (op, op2, create["QueueName"]) == ("create_queue", "set_queue_attributes", res.jobs.name)
    assert attrs["VisibilityTimeout"] == "900" and attrs["KmsMasterKeyId"] == res.key_arn
    assert json.loads(attrs["RedrivePolicy"]) == {"deadLetterTargetArn": res.dlq.mock_arn, "maxReceiveCount": 3}
    assert res.jobs.mock_arn in extra["Attributes"]["Policy"] and extra["QueueUrl"] == res.jobs.mock_url
    dlq_extra = rs.queue_requests(res.dlq)[1][1]["Attributes"]
    assert json.loads(dlq_extra["RedriveAllowPolicy"])["sourceQueueArns"] == [res.jobs.mock_arn]


def test_group_request_keeps_the_previewed_group(res):
    g = rs.group_request(res, "subnet-1", "lt-demo", 2)
    assert (g["AutoScalingGroupName"], g["MinSize"], g["MaxSize"], g["DesiredCapacity"]) == (res.group_name, 0, 4, 2)
    assert [o["InstanceType"] for o in g["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]] == res.instance_types
    assert g["MixedInstancesPolicy"]["InstancesDistribution"] == {
        "OnDemandPercentageAboveBaseCapacity": 0, "SpotAllocationStrategy": "price-capacity-optimized",
        "OnDemandBaseCapacity": 0}
    assert g["CapacityRebalance"] is True
    assert {"Key": "gpufleet-stack", "Value": "dev", "PropagateAtLaunch": True} in g["Tags"]


def test_substitute_replaces_whole_arns_before_ids_inside_json():
    mapping = {"k-1": "real-1", "arn:aws:kms:r:1:key/k-1": "arn:aws:kms:r:2:key/real-1"}
    value = {"a": ["arn:aws:kms:r:1:key/k-1", json.dumps({"Key": "k-1"})], "n": 3}
    assert rs.substitute(value, mapping) == {"a": ["arn:aws:kms:r:2:key/real-1", '{"Key": "real-1"}'], "n": 3}


def test_pascal_case_with_the_s3_names():
    assert rs.pascal({"sseAlgorithm": "x", "kmsMasterKeyId": "k", "id": "i", "noncurrentDays": [{"aB": 1}]}) == \
        {"SSEAlgorithm": "x", "KMSMasterKeyID": "k", "ID": "i", "NoncurrentDays": [{"AB": 1}]}


def test_deny_statements_moto_cannot_evaluate(res):
    policy = dict(rs.bucket_requests(res))["put_bucket_policy"]["Policy"]
    assert rs.unevaluable_denies(policy) == ["DenyInsecureTransport", "DenyTlsBelow12"]
    fine = {"Statement": [{"Sid": "S", "Effect": "Deny", "Condition": {"StringEquals": {"aws:x": "y"}}},
                          {"Sid": "A", "Effect": "Allow", "Condition": {"Bool": {"aws:x": "true"}}}]}
    assert rs.unevaluable_denies(json.dumps(fine)) == []


def test_other_stacks_are_refused_in_one_line(doc):
    with pytest.raises(rs.PreviewMismatch, match="on 'azure'; the demo runs an AWS stack"):
        rs.stack_resources({**doc, "cloud": "azure"})
    with pytest.raises(rs.PreviewMismatch, match="in 'gang' mode"):
        rs.stack_resources({**doc, "config": {**doc["config"], "mode": "gang"}})
    with pytest.raises(rs.PreviewMismatch, match="the preview has 0 aws:s3/bucket:Bucket"):
        rs.stack_resources({**doc, "resources": [r for r in doc["resources"] if r["type"] != rs.BUCKET]})


def test_node_settings_are_what_user_data_writes(res):
    node = node_settings(res, "http://127.0.0.1:1/123456789012/q")
    assert node_schema.check(node, complete=True) == node  # the contract's keys, hooks null: moto cannot complete them
    assert (node["bucket"], node["asg_name"], node["cloud"]) == (res.bucket_name, res.group_name, "aws")


def test_the_cluster_creates_them_in_moto(doc, res, tmp_path):
    cluster = Cluster("dev", tmp_path / "demo")
    (tmp_path / "demo").mkdir()
    try:
        cluster.start(doc)
        cluster.provision()
        kms, s3, sqs = cluster.client("kms"), cluster.client("s3"), cluster.client("sqs")
        key = kms.describe_key(KeyId=res.alias)["KeyMetadata"]
        assert key["KeyId"] != res.key["id"] and key["Description"] == res.key["inputs"]["description"]
        assert kms.get_key_rotation_status(KeyId=key["KeyId"])["KeyRotationEnabled"]
        assert json.loads(kms.get_key_policy(KeyId=key["KeyId"], PolicyName="default")["Policy"]) == \
            json.loads(res.key["inputs"]["policy"])
        rule = s3.get_bucket_encryption(Bucket=res.bucket_name)["ServerSideEncryptionConfiguration"]["Rules"][0]
        assert rule["ApplyServerSideEncryptionByDefault"]["KMSMasterKeyID"] == key["Arn"]  # moto's key, not the mock
        assert s3.get_bucket_versioning(Bucket=res.bucket_name)["Status"] == "Enabled"
        assert all(s3.get_public_access_block(Bucket=res.bucket_name)["PublicAccessBlockConfiguration"].values())
        attrs = sqs.get_queue_attributes(QueueUrl=cluster.queue_url, AttributeNames=["All"])["Attributes"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=cluster.dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        assert json.loads(attrs["RedrivePolicy"]) == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3}
        assert attrs["KmsMasterKeyId"] == key["Arn"] and attrs["VisibilityTimeout"] == "900"
        assert json.loads(attrs["Policy"])["Statement"][0]["Sid"] == "DenyInsecureTransport"
        assert cluster.queue_url.endswith("/" + res.jobs.name)
        assert any("bucket policy not attached" in n for n in cluster.notes)
        instances = cluster.start_group(2)
        assert len(instances) == 2 and {t for _, t, _ in instances} == {res.instance_types[0]}
        group = cluster.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[res.group_name])["AutoScalingGroups"][0]
        assert group["MaxSize"] == res.group["inputs"]["maxSize"] and group["DesiredCapacity"] == 2
        assert {t["Key"] for t in group["Tags"]} >= {"gpufleet-stack", "data-classification"}
    finally:
        cluster.close()
    assert not (tmp_path / "demo").exists()
