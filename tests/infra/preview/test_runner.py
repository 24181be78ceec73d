"""The preview engine on Pulumi's mock runtime, with a test program shaped like the real stacks."""
from __future__ import annotations

import json

import pulumi
import pytest
from pulumi.runtime import config as runtime_config
from pulumi.runtime import settings

from infra.preview import runner
from tests.infra.preview import fake_program
from tests.infra.preview.helpers import stack_raw

CIPHER = "v1:AAABBBCCCsecretciphertext"


@pytest.fixture(scope="module")
def dev():
    raw, secrets = stack_raw("dev", **{"gpufleet:sshPublicKey": {"secure": CIPHER}})
    return runner.preview(raw, secrets, "dev", program=fake_program.main)


def by_name(doc, name, custom=True):
    [res] = [r for r in doc["resources"] if r["name"] == name and r["custom"] == custom]
    return res


def by_type(doc, typ):
    [res] = [r for r in doc["resources"] if r["type"] == typ]
    return res


def test_components_resources_and_stack_are_recorded_with_engine_urns(dev):
    types = {r["type"] for r in dev["resources"]}
    assert {"pulumi:pulumi:Stack", "gpufleet:test:Storage", "gpufleet:test:Cluster", "aws:s3/bucket:Bucket",
            "aws:s3/bucketPolicy:BucketPolicy", "aws:ec2/launchTemplate:LaunchTemplate",
            "aws:autoscaling/group:Group"} <= types
    stack = dev["resources"][0]
    assert stack["urn"] == "urn:pulumi:dev::gpufleet::pulumi:pulumi:Stack::gpufleet-dev"
    storage, bucket = by_name(dev, "data", custom=False), by_name(dev, "data-bucket")
    # As the engine names them: the root stack is left out of the type chain.
    assert storage["urn"] == "urn:pulumi:dev::gpufleet::gpufleet:test:Storage::data"
    assert storage["parent"] == stack["urn"] and storage["custom"] is False and storage["id"] is None
    assert bucket["urn"] == "urn:pulumi:dev::gpufleet::gpufleet:test:Storage$aws:s3/bucket:Bucket::data-bucket"
    assert bucket["parent"] == storage["urn"] and bucket["custom"] is True
    urns = {r["urn"] for r in dev["resources"]}
    assert len(urns) == len(dev["resources"])
    assert all(r["parent"] in urns for r in dev["resources"][1:])


def test_ids_and_arns_resolve_into_dependent_inputs(dev):
    bucket = by_name(dev, "data-bucket")
    assert bucket["id"].startswith("data-bucket-") and bucket["id"] == bucket["id"].lower()
    policy = json.loads(by_name(dev, "data-policy")["inputs"]["policy"])
    statement = policy["Statement"][0]
    assert statement["Resource"] == [f"arn:aws:s3:::{bucket['id']}", f"arn:aws:s3:::{bucket['id']}/*"]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert by_name(dev, "data-policy")["inputs"]["bucket"] == bucket["id"]

    key = by_name(dev, "data-key")
    jobs = by_name(dev, "gpu-jobs")
    assert jobs["inputs"]["kmsMasterKeyId"] == f"arn:aws:kms:eu-west-1:123456789012:key/{key['id']}"
    dlq_url = by_name(dev, "gpu-dlq")["id"]
    assert dlq_url.startswith("https://sqs.eu-west-1.amazonaws.com/123456789012/gpu-dlq-")
    redrive = json.loads(jobs["inputs"]["redrivePolicy"])
    assert redrive["deadLetterTargetArn"] == "arn:aws:sqs:eu-west-1:123456789012:" + dlq_url.rsplit("/", 1)[1]

    lt = by_type(dev, "aws:ec2/launchTemplate:LaunchTemplate")
    assert lt["id"].startswith("lt-") and len(lt["id"]) == 20
    assert lt["inputs"]["imageId"].startswith("ami-")
    assert lt["inputs"]["metadataOptions"] == {"httpTokens": "required", "httpEndpoint": "enabled"}
    assert lt["inputs"]["iamInstanceProfile"]["arn"].startswith("arn:aws:iam::123456789012:instance-profile/gpu-node-")
    asg = by_type(dev, "aws:autoscaling/group:Group")
    assert asg["inputs"]["launchTemplate"] == {"id": lt["id"], "version": "$Latest"}
    assert asg["inputs"]["maxSize"] == 4 and isinstance(asg["inputs"]["maxSize"], int)


def test_dependencies_and_property_dependencies_are_urns(dev):
    bucket, key = by_name(dev, "data-bucket"), by_name(dev, "data-key")
    policy = by_name(dev, "data-policy")
    assert policy["dependencies"] == [bucket["urn"]]
    assert policy["propertyDependencies"] == {"bucket": [bucket["urn"]], "policy": [bucket["urn"]]}
    jobs = by_name(dev, "gpu-jobs")
    dlq = by_name(dev, "gpu-dlq")
    assert set(jobs["dependencies"]) == {key["urn"], dlq["urn"]}
    assert jobs["propertyDependencies"]["redrivePolicy"] == [dlq["urn"]]
    assert jobs["propertyDependencies"]["kmsMasterKeyId"] == [key["urn"]]


def test_stack_outputs_are_captured_resolved(dev):
    out = dev["outputs"]
    bucket = by_name(dev, "data-bucket")
    assert out["bucket"] == bucket["id"]
    assert out["queue_url"] == by_name(dev, "gpu-jobs")["id"]
    assert out["role_arn"].startswith("arn:aws:iam::123456789012:role/gpu-node-")
    assert out["nodes_max"] == 4
    assert list(out) == sorted(out)


def test_document_carries_validated_config_with_secrets_masked(dev):
    assert dev["stack"] == "dev" and dev["cloud"] == "aws"
    assert dev["config"]["instanceTypes"][0] == "g6.xlarge"
    assert dev["config"]["sshPublicKey"] == "[secret]"
    assert dev["policy"]["violations"] == [] or all("level" in v for v in dev["policy"]["violations"])
    text = json.dumps(dev)
    assert CIPHER not in text
    # The ciphertext reached the program (as user data) but is masked in the recorded inputs.
    lt = by_type(dev, "aws:ec2/launchTemplate:LaunchTemplate")
    assert lt["inputs"]["userData"] == "[secret]"


def test_output_secrets_are_masked_in_inputs_and_outputs():
    raw, secrets = stack_raw("dev")
    doc = runner.preview(raw, secrets, "dev", program=fake_program.secret_config)
    assert "s3cr3t-token-value" not in json.dumps(doc)
    assert doc["outputs"]["token"] == "[secret]"
    assert by_name(doc, "token")["inputs"]["value"] == "[secret]"


def test_previews_in_one_process_are_isolated_and_deterministic(dev):
    # Other tests in this process may have set Pulumi's global context: it must come back unchanged.
    before = (settings.get_root_resource(), dict(runtime_config.CONFIG.get()), settings.get_stack())
    raw, secrets = stack_raw("prod")
    prod = runner.preview(raw, secrets, "prod", program=fake_program.main)
    assert {r["urn"].split("::")[0] for r in prod["resources"]} == {"urn:pulumi:prod"}
    assert prod["config"]["region"] == "eu-north-1"
    assert by_name(prod, "gpu-jobs")["id"].startswith("https://sqs.eu-north-1.amazonaws.com/")
    assert len(prod["resources"]) == len(dev["resources"])
    assert by_name(prod, "data-bucket")["id"] != by_name(dev, "data-bucket")["id"]
    raw, secrets = stack_raw("dev", **{"gpufleet:sshPublicKey": {"secure": CIPHER}})
    again = runner.preview(raw, secrets, "dev", program=fake_program.main)
    assert again == dev
    # Nothing leaks into the caller's Pulumi context.
    assert (settings.get_root_resource(), runtime_config.CONFIG.get(), settings.get_stack()) == before


def test_program_failures_are_one_line_with_location():
    raw, secrets = stack_raw("dev")
    with pytest.raises(runner.ProgramError) as exc:
        runner.preview(raw, secrets, "dev", program=fake_program.failing)
    msg = str(exc.value)
    assert "\n" not in msg and "KeyError: 'no-such-instance-type'" in msg
    assert "(at tests/infra/preview/fake_program.py:" in msg
    with pytest.raises(runner.ProgramError, match="AttributeError: .*nonexistent"):
        runner.preview(raw, secrets, "dev", program=fake_program.failing_apply)
    with pytest.raises(runner.ProgramError, match="no result for function aws:ec2/getInstanceType:getInstanceType"):
        runner.preview(raw, secrets, "dev", program=fake_program.unknown_invoke)


def test_secure_values_are_masked_in_program_errors():
    raw, secrets = stack_raw("dev", **{"gpufleet:sshPublicKey": {"secure": CIPHER}})
    with pytest.raises(runner.ProgramError) as exc:
        runner.preview(raw, secrets, "dev", program=fake_program.leaking)
    assert str(exc.value).startswith("ValueError: cannot use key [secret] (at tests/infra/preview/fake_program.py:")


def test_pulumi_log_errors_fail_and_warnings_are_reported():
    raw, secrets = stack_raw("dev")

    def warns():
        pulumi.log.warn("capacity may be short")
        pulumi.export("x", 1)

    doc = runner.preview(raw, secrets, "dev", program=warns)
    assert doc["warnings"] == ["capacity may be short"] and doc["outputs"] == {"x": 1}

    def errs():
        pulumi.log.error("quota exceeded for p5")

    with pytest.raises(runner.ProgramError, match="^quota exceeded for p5$"):
        runner.preview(raw, secrets, "dev", program=errs)


def test_bad_config_fails_before_the_program_runs():
    from infra.config import ConfigError

    ran = []
    raw, secrets = stack_raw("dev", **{"gpufleet:nodes": {"min": 3, "desired": 1, "max": 2}})
    with pytest.raises(ConfigError, match="gpufleet:nodes"):
        runner.preview(raw, secrets, "dev", program=lambda: ran.append(1))
    assert ran == []
