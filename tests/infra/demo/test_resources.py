"""What the demo creates, from the dev stack's real preview: the requests (pure), then the same created
in moto server by the box's Account and read back."""
from __future__ import annotations

import json

import pytest

from infra.demo import resources as rs
from infra.demo.account import Account, preview_document


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
    assert res.instance_types == doc["config"]["instanceTypes"]  # the first partition's, from its component
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


def test_the_account_creates_them_in_moto(doc, res, tmp_path):
    account = Account("dev", tmp_path / "demo")
    (tmp_path / "demo").mkdir()
    try:
        account.start(doc)
        account.provision()
        kms, s3, sqs = account.client("kms"), account.client("s3"), account.client("sqs")
        key = kms.describe_key(KeyId=res.alias)["KeyMetadata"]
        assert key["KeyId"] != res.key["id"] and key["Description"] == res.key["inputs"]["description"]
        assert kms.get_key_rotation_status(KeyId=key["KeyId"])["KeyRotationEnabled"]
        assert json.loads(kms.get_key_policy(KeyId=key["KeyId"], PolicyName="default")["Policy"]) == \
            json.loads(res.key["inputs"]["policy"])
        rule = s3.get_bucket_encryption(Bucket=res.bucket_name)["ServerSideEncryptionConfiguration"]["Rules"][0]
        assert rule["ApplyServerSideEncryptionByDefault"]["KMSMasterKeyID"] == key["Arn"]  # moto's key, not the mock
        assert s3.get_bucket_versioning(Bucket=res.bucket_name)["Status"] == "Enabled"
        assert all(s3.get_public_access_block(Bucket=res.bucket_name)["PublicAccessBlockConfiguration"].values())
        attrs = sqs.get_queue_attributes(QueueUrl=account.queue_url, AttributeNames=["All"])["Attributes"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=account.dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        assert json.loads(attrs["RedrivePolicy"]) == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3}
        assert attrs["KmsMasterKeyId"] == key["Arn"] and attrs["VisibilityTimeout"] == "900"
        assert json.loads(attrs["Policy"])["Statement"][0]["Sid"] == "DenyInsecureTransport"
        assert account.queue_url.endswith("/" + res.jobs.name)
        assert any("bucket policy not attached" in n for n in account.notes)
    finally:
        account.close()
    assert not (tmp_path / "demo").exists()
