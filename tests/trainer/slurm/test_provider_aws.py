"""The AWS node provider (trainer.clouds.aws_nodes) against a moto server on loopback: real HTTP, real botocore
(its retries, its endpoint from AWS_ENDPOINT_URL, the config's region), a VPC, subnets and launch templates made
in moto by the tests. Slurm's side is a recording fake (scontrol update calls); one test runs
`python -m trainer nodes resume` as a subprocess with a recording `scontrol` stub on PATH (hostlists expanded by
the real scontrol).

What moto does not do, and how the tests show it instead:
- it never refuses capacity, never fulfils part of a fleet and never throttles: those are EC2's answers put in
  with botocore event hooks on the provider's own client (`before-call` returns the response EC2 documents,
  `before-send` returns an HTTP 503 RequestLimitExceeded for botocore's retries to handle, `before-parameter-build`
  plus `after-call` make a partial fleet: moto launches fewer, the response gains EC2's error);
- it drops the placement group override, the template's network interfaces (EFA) and the volume tags from the
  instances a fleet launches, and treats SingleInstanceType/SingleAvailabilityZone/MinTargetCapacity as nothing:
  the CreateFleet requests are recorded (`before-parameter-build`) and asserted, and the template's EFA interfaces
  are read back from the template;
- the purchase option is seen on the instances (moto sets InstanceLifecycle "spot" on a fleet's spot instances).
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from infra.demo.imds import FakeImds
from trainer.clouds import aws, aws_nodes
from trainer.clouds.aws_nodes import MUNGE_VERSION, NOT_REGISTERED, NodeProvider, munge_key, node_name
from trainer.errors import Fault, UsageError

ROOT = Path(__file__).resolve().parents[3]
REGION = "us-east-2"  # not the environment's default region: the provider must use the config's
STACK = "dev"
TAGS = {"gpufleet-stack": STACK, "data-classification": "internal", "team": "ml"}


class RecordingSlurm:
    """trainer.slurm.client as the provider uses it: scontrol update calls, recorded."""

    def __init__(self):
        self.updates: list[tuple[str, dict]] = []

    def update_node(self, name: str, **fields: str) -> None:
        self.updates.append((name, fields))

    def down(self) -> dict[str, str]:
        return {n: f["reason"] for n, f in self.updates if f.get("state") == "DOWN"}

    def addresses(self) -> dict[str, tuple[str, str]]:
        return {n: (f["nodeaddr"], f["nodehostname"]) for n, f in self.updates if "nodeaddr" in f}


@pytest.fixture
def cloud(moto_endpoint):
    """A VPC with two subnets in two zones, a plain node template and an EFA one (a p5-like layout), in moto;
    the nodes config the controller's user-data would write for them."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"{REGION}{zone}")
               ["Subnet"]["SubnetId"] for i, zone in ((1, "a"), (2, "b"))]
    group = ec2.create_security_group(GroupName="nodes", Description="nodes", VpcId=vpc)["GroupId"]
    image = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-2.0.*"]}]
                                )["Images"][0]["ImageId"]  # one of moto's (listing them all is slow)
    plain = ec2.create_launch_template(LaunchTemplateName="dev-node", LaunchTemplateData={
        "ImageId": image, "NetworkInterfaces": [{"DeviceIndex": 0, "Groups": [group]}]})["LaunchTemplate"]
    efa = ec2.create_launch_template(LaunchTemplateName="dev-big", LaunchTemplateData={
        "ImageId": image, "NetworkInterfaces": [
            {"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "interface", "Groups": [group]},
            {"NetworkCardIndex": 0, "DeviceIndex": 1, "InterfaceType": "efa-only", "Groups": [group]},
            {"NetworkCardIndex": 1, "DeviceIndex": 0, "InterfaceType": "efa-only", "Groups": [group]}]}
    )["LaunchTemplate"]
    config = {
        "provider": "aws", "cloud": "aws", "stack": STACK, "region": REGION, "slurm_conf": "/etc/slurm/slurm.conf",
        "tags": TAGS,
        "partitions": {
            "gpu": {"instance_types": ["g5.xlarge", "g6.xlarge"], "spot": True, "on_demand_base": 1, "gang": False,
                    "launch_template_id": plain["LaunchTemplateId"], "subnet_ids": subnets, "placement_group": None},
            "big": {"instance_types": ["p5.48xlarge"], "spot": False, "on_demand_base": 0, "gang": True,
                    "launch_template_id": efa["LaunchTemplateId"], "subnet_ids": subnets[:1],
                    "placement_group": "dev-big"}}}
    return {"ec2": ec2, "config": config, "subnets": subnets, "image": image, "efa_template": efa["LaunchTemplateId"]}


@pytest.fixture
def provider(cloud):
    """The provider with its own EC2 client (config's region, botocore's retries, AWS_ENDPOINT_URL), a recording
    Slurm, and its CreateFleet requests recorded as sent."""
    slurm = RecordingSlurm()
    p = NodeProvider(cloud["config"], slurm=slurm, sleep=lambda s: p.slept.append(s))
    p.slept, p.fleets = [], []
    p.ec2.meta.events.register("before-parameter-build.ec2.CreateFleet",
                               lambda params, **_: p.fleets.append(copy.deepcopy(params)))
    return p


def instances(ec2, filters: dict | None = None) -> list[dict]:
    flt = [{"Name": k, "Values": v if isinstance(v, list) else [v]} for k, v in (filters or {}).items()]
    return [i for r in ec2.describe_instances(Filters=flt)["Reservations"] for i in r["Instances"]]


def tags(instance: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags") or []}


def running(ec2, stack: str = STACK) -> dict[str, dict]:
    """Node name -> its live instance, of the stack's instances in moto."""
    return {tags(i).get("gpufleet-slurm-node", i["InstanceId"]): i
            for i in instances(ec2, {"tag:gpufleet-stack": stack, "instance-state-name": ["pending", "running"]})}


def answer(parsed: dict, status: int = 200):
    """A before-call hook's answer: EC2's response, the request never sent."""
    return AWSResponse("https://ec2.example/", status, {}, None), parsed


def fleet_errors(code: str, message: str, lifecycle: str = "spot") -> list[dict]:
    """Errors as an instant fleet reports them: the real one, then the follow-on entry pointing at it."""
    return [{"LaunchTemplateAndOverrides": {}, "Lifecycle": lifecycle, "ErrorCode": code, "ErrorMessage": message},
            {"LaunchTemplateAndOverrides": {}, "Lifecycle": lifecycle, "ErrorCode": "UnfulfillableCapacity",
             "ErrorMessage": "Failed to fulfill capacity. Please review errors in the response."}]


# --- resume ----------------------------------------------------------------------------------------------------

def test_resume_launches_one_tagged_instance_per_node_and_tells_slurm_its_address(cloud, provider):
    provider.resume(["gpu-1", "gpu-2", "gpu-3"])

    nodes = running(cloud["ec2"])
    assert sorted(nodes) == ["gpu-1", "gpu-2", "gpu-3"]
    part = cloud["config"]["partitions"]["gpu"]
    for name, inst in nodes.items():
        assert tags(inst) == {**TAGS, "gpufleet-slurm-node": name, "Name": f"gpufleet-dev-{name}"}
        assert inst["InstanceType"] in part["instance_types"] and inst["SubnetId"] in cloud["subnets"]
        assert inst["ImageId"] == cloud["image"]  # the stack's launch template
    # the on-demand base (gpu-1) on-demand, the rest spot
    assert {n: i.get("InstanceLifecycle") for n, i in nodes.items()} == {"gpu-1": None, "gpu-2": "spot",
                                                                          "gpu-3": "spot"}
    assert provider.slurm.addresses() == {
        n: (i["PrivateIpAddress"], i["PrivateDnsName"].split(".")[0]) for n, i in nodes.items()}
    assert provider.slurm.down() == {}

    on_demand, spot = provider.fleets  # one fleet per purchase option, as sent
    overrides = [{"InstanceType": t, "SubnetId": s} for t in part["instance_types"] for s in cloud["subnets"]]
    tag_specs = [{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in TAGS.items()]}
                 for kind in ("instance", "volume")]
    for fleet, count, option in ((on_demand, 1, "on-demand"), (spot, 2, "spot")):
        assert fleet["Type"] == "instant" and fleet["ClientToken"]
        assert fleet["LaunchTemplateConfigs"] == [{"LaunchTemplateSpecification": {
            "LaunchTemplateId": part["launch_template_id"], "Version": "$Latest"}, "Overrides": overrides}]
        assert fleet["TargetCapacitySpecification"] == {"TotalTargetCapacity": count,
                                                        "DefaultTargetCapacityType": option}
        assert fleet["TagSpecifications"] == tag_specs
    assert spot["SpotOptions"] == {"AllocationStrategy": "price-capacity-optimized"} and "OnDemandOptions" not in spot
    assert on_demand["OnDemandOptions"] == {"AllocationStrategy": "lowest-price"} and "SpotOptions" not in on_demand


def test_a_gang_partition_is_all_or_nothing_in_its_placement_group_with_the_templates_efa(cloud, provider):
    echoed = []
    provider.ec2.meta.events.register("after-call.ec2.CreateFleet", lambda parsed, **_: echoed.append(parsed))
    provider.resume(["big-1", "big-2"])

    (fleet,) = provider.fleets
    assert fleet["OnDemandOptions"] == {"AllocationStrategy": "lowest-price", "MinTargetCapacity": 2,
                                        "SingleInstanceType": True, "SingleAvailabilityZone": True}
    assert fleet["LaunchTemplateConfigs"][0]["Overrides"] == [
        {"InstanceType": "p5.48xlarge", "SubnetId": cloud["subnets"][0], "Placement": {"GroupName": "dev-big"}}]
    # moto launched from those overrides (it echoes them; it keeps no placement group on the instance)
    assert {inst["LaunchTemplateAndOverrides"]["Overrides"]["Placement"]["GroupName"]
            for inst in echoed[0]["Instances"]} == {"dev-big"}
    nodes = running(cloud["ec2"])
    assert sorted(nodes) == ["big-1", "big-2"] and {i["InstanceType"] for i in nodes.values()} == {"p5.48xlarge"}
    # the EFA interfaces come from the template the fleet names (moto does not put them on fleet instances)
    version = cloud["ec2"].describe_launch_template_versions(LaunchTemplateId=cloud["efa_template"],
                                                              Versions=["$Latest"])["LaunchTemplateVersions"][0]
    assert [n["InterfaceType"] for n in version["LaunchTemplateData"]["NetworkInterfaces"]] == \
        ["interface", "efa-only", "efa-only"]
    assert sorted(provider.slurm.addresses()) == ["big-1", "big-2"]


def test_a_capacity_error_sets_the_nodes_down_with_the_reason_and_launches_nothing_else(cloud, provider):
    message = ("We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested "
               "(us-east-2a). Our system will be working on provisioning additional capacity. You can currently get "
               "g5.xlarge capacity by not specifying an Availability Zone in your request or choosing us-east-2b.")

    def no_spot(params, **_):  # the request as serialized: EC2's query parameters
        if params["body"]["TargetCapacitySpecification.DefaultTargetCapacityType"] == "spot":
            return answer({"FleetId": "fleet-1", "Errors": fleet_errors("InsufficientInstanceCapacity", message),
                           "Instances": []})
        return None
    provider.ec2.meta.events.register("before-call.ec2.CreateFleet", no_spot)

    provider.resume(["gpu-1", "gpu-2", "gpu-3"])  # capacity is no fault: no exception (exit 0)

    assert sorted(running(cloud["ec2"])) == ["gpu-1"]  # the on-demand base only
    why = f"resume failed: InsufficientInstanceCapacity: {message}"[:200]
    assert provider.slurm.down() == {"gpu-2": why, "gpu-3": why} and len(why) == 200
    assert sorted(provider.slurm.addresses()) == ["gpu-1"]


def test_a_gang_without_capacity_starts_none_of_its_nodes(cloud, provider):
    provider.ec2.meta.events.register("before-call.ec2.CreateFleet", lambda **_: answer({
        "FleetId": "fleet-2", "Errors": fleet_errors("InsufficientInstanceCapacity", "no p5", "on-demand")}))
    provider.resume(["big-1", "big-2"])
    assert running(cloud["ec2"]) == {}
    assert provider.slurm.down() == {"big-1": "resume failed: InsufficientInstanceCapacity: no p5",
                                     "big-2": "resume failed: InsufficientInstanceCapacity: no p5"}


def test_part_of_a_gang_is_no_use_and_is_terminated(cloud, provider):
    def only_one(params, **_):  # should EC2 ever launch part of a gang
        params["TargetCapacitySpecification"]["TotalTargetCapacity"] = 1
    provider.ec2.meta.events.register("before-parameter-build.ec2.CreateFleet", only_one)
    provider.ec2.meta.events.register("after-call.ec2.CreateFleet", lambda parsed, **_: parsed.update(
        Errors=fleet_errors("InsufficientInstanceCapacity", "one p5 only", "on-demand")))
    provider.resume(["big-1", "big-2"])
    assert running(cloud["ec2"]) == {} and len(instances(cloud["ec2"])) == 1  # launched, then terminated
    assert sorted(provider.slurm.down()) == ["big-1", "big-2"] and provider.slurm.addresses() == {}


def test_a_partly_fulfilled_fleet_names_what_it_got_and_sets_the_rest_down(cloud, provider):
    def only_one(params, **_):  # EC2 found capacity for one instance of three
        params["TargetCapacitySpecification"]["TotalTargetCapacity"] = 1

    def with_error(parsed, **_):
        parsed["Errors"] = fleet_errors("InsufficientInstanceCapacity", "no more g5.xlarge spot capacity")
    provider.ec2.meta.events.register("before-parameter-build.ec2.CreateFleet", only_one)
    provider.ec2.meta.events.register("after-call.ec2.CreateFleet", with_error)

    provider.resume(["gpu-2", "gpu-3", "gpu-4"])

    assert sorted(running(cloud["ec2"])) == ["gpu-2"]
    assert sorted(provider.slurm.addresses()) == ["gpu-2"]
    assert provider.slurm.down() == {n: "resume failed: InsufficientInstanceCapacity: no more g5.xlarge spot capacity"
                                     for n in ("gpu-3", "gpu-4")}
    assert provider.fleets[0]["TargetCapacitySpecification"]["TotalTargetCapacity"] == 3  # asked for all three


class _Raw:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body


def test_a_throttled_request_is_retried_by_botocore_until_it_succeeds(cloud, provider):
    throttled = []

    def throttle(request, **_):
        if len(throttled) < 2:
            throttled.append(request.url)
            body = (b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>RequestLimitExceeded'
                    b'</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>r</RequestID>'
                    b'</Response>')
            return AWSResponse(request.url, 503, {}, _Raw(body))
        return None
    provider.ec2.meta.events.register("before-send.ec2.CreateFleet", throttle)

    provider.resume(["gpu-2"])

    assert len(throttled) == 2  # two answers of 503 RequestLimitExceeded, then the request went through
    assert sorted(running(cloud["ec2"])) == ["gpu-2"] and provider.slurm.down() == {}


def test_launches_ec2_throttled_inside_a_fleet_are_tried_again(cloud, provider):
    throttled = fleet_errors("RequestLimitExceeded", "Request limit exceeded.")
    answers = [answer({"FleetId": "fleet-3", "Errors": throttled})]  # the first fleet: EC2 throttled its launches
    provider.ec2.meta.events.register("before-call.ec2.CreateFleet", lambda **_: answers.pop() if answers else None)
    provider.resume(["gpu-2", "gpu-3"])
    assert sorted(running(cloud["ec2"])) == ["gpu-2", "gpu-3"] and provider.slurm.down() == {}
    assert provider.slept == [1.0] and [f["TargetCapacitySpecification"]["TotalTargetCapacity"]
                                         for f in provider.fleets] == [2, 2]


def test_a_stale_instance_of_the_node_is_terminated_before_the_new_one_starts(cloud, provider):
    ec2 = cloud["ec2"]

    def launch(stack: str, name: str) -> str:
        return ec2.run_instances(ImageId=cloud["image"], MinCount=1, MaxCount=1, SubnetId=cloud["subnets"][0],
                                 TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                     {"Key": "gpufleet-stack", "Value": stack},
                                     {"Key": "gpufleet-slurm-node", "Value": name}]}])["Instances"][0]["InstanceId"]
    stale, other_stack = launch(STACK, "gpu-1"), launch("prod", "gpu-1")

    provider.resume(["gpu-1"])

    state = {i["InstanceId"]: i["State"]["Name"] for i in instances(ec2)}
    assert state[stale] in ("shutting-down", "terminated") and state[other_stack] == "running"
    (fresh,) = [i for i in instances(ec2, {"tag:gpufleet-stack": STACK, "instance-state-name": "running"})]
    assert fresh["InstanceId"] != stale and tags(fresh)["gpufleet-slurm-node"] == "gpu-1"
    assert provider.slurm.addresses()["gpu-1"][0] == fresh["PrivateIpAddress"]


def test_an_unexpected_error_fails_the_batch_and_is_one_line(cloud, provider):
    cloud["config"]["partitions"]["gpu"]["launch_template_id"] = "lt-0123456789abcdef0"  # deleted, say
    with pytest.raises(Fault) as caught:
        provider.resume(["gpu-1", "gpu-2"])
    assert str(caught.value) == ("nodes resume gpu-1, gpu-2: InvalidLaunchTemplateId.NotFound: The specified launch "
                                 "template, with template ID lt-0123456789abcdef0, does not exist.")
    why = ("resume failed: InvalidLaunchTemplateId.NotFound: The specified launch template, with template ID "
           "lt-0123456789abcdef0, does not exist.")
    assert provider.slurm.down() == {"gpu-1": why, "gpu-2": why}
    assert running(cloud["ec2"]) == {}


def test_a_name_that_is_no_node_of_the_config_is_a_usage_error_and_nothing_starts(cloud, provider):
    for names, expected in ((["gpu-1", "tiny-1"], "partition 'tiny' is not in the nodes config (partitions: big, gpu)"),
                            (["gpu-0"], "'gpu-0' is not a node name; expected <partition>-<n>, n from 1")):
        with pytest.raises(UsageError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            provider.resume(names)
    assert provider.fleets == [] and provider.slurm.updates == []


# --- suspend, resume-fail ----------------------------------------------------------------------------------------

def test_suspend_terminates_exactly_this_stacks_instances_of_those_nodes(cloud, provider):
    ec2 = cloud["ec2"]
    provider.resume(["gpu-1", "gpu-2", "gpu-3"])
    other = ec2.run_instances(ImageId=cloud["image"], MinCount=1, MaxCount=1, TagSpecifications=[{
        "ResourceType": "instance", "Tags": [{"Key": "gpufleet-stack", "Value": "prod"},
                                             {"Key": "gpufleet-slurm-node", "Value": "gpu-1"}]}])["Instances"][0]
    before, told = running(ec2), list(provider.slurm.updates)

    provider.suspend(["gpu-1", "gpu-2"])

    state = {i["InstanceId"]: i["State"]["Name"] for i in instances(ec2)}
    assert {state[before[n]["InstanceId"]] for n in ("gpu-1", "gpu-2")} <= {"shutting-down", "terminated"}
    assert state[before["gpu-3"]["InstanceId"]] == "running" and state[other["InstanceId"]] == "running"
    provider.suspend(["gpu-1", "gpu-2"])  # nothing left to terminate: fine
    provider.suspend(["gpu-9"])
    assert provider.slurm.updates == told  # suspend tells Slurm nothing


def test_resume_fail_terminates_the_instance_and_leaves_the_node_down(cloud, provider):
    provider.resume(["gpu-1"])
    instance = running(cloud["ec2"])["gpu-1"]["InstanceId"]
    provider.resume_failed(["gpu-1"])
    (gone,) = instances(cloud["ec2"], {"instance-id": instance})
    assert gone["State"]["Name"] in ("shutting-down", "terminated") and running(cloud["ec2"]) == {}
    assert provider.slurm.down() == {"gpu-1": NOT_REGISTERED}
    assert NOT_REGISTERED == "resume failed: did not register within ResumeTimeout"


def test_the_provider_is_found_through_the_aws_node_adapter(cloud):
    from trainer.clouds import node_adapter
    from trainer.slurm.nodes import provider

    found = node_adapter("aws")
    assert found.NodeProvider is NodeProvider and found.node_name is node_name and found.munge_key is munge_key
    assert not hasattr(aws, "NodeProvider")  # the cloud module knows nothing of its Slurm side (no cycle)
    assert isinstance(provider(cloud["config"], "/etc/gpufleet/nodes.json"), NodeProvider)
    with pytest.raises(UsageError, match="lacks region"):
        provider({"provider": "aws", "stack": "dev", "partitions": {"gpu": {}}}, "x")


# --- the command, as slurmctld runs it --------------------------------------------------------------------------

def _command(tmp_path: Path, config: dict, *argv: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`python -m trainer nodes ARGV --config FILE`, with a `scontrol` on PATH that records its updates and
    expands hostlists with the real scontrol (a minimal slurm.conf)."""
    tmp_path = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    bin_dir, record = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir(parents=True)
    stub = bin_dir / "scontrol"
    stub.write_text("#!/bin/sh\n"
                    'if [ "$1" = show ] && [ "$2" = hostnames ]; then exec /usr/bin/scontrol "$@"; fi\n'
                    f'printf "%s\\n" "$*" >> {record}\n')
    stub.chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({**config, "slurm_conf": str(conf)}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": str(conf)}
    done = subprocess.run([sys.executable, "-m", "trainer", "nodes", *argv, "--config", str(path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    return done, record.read_text().splitlines() if record.exists() else []


def test_the_resume_command_launches_and_tells_slurm_through_scontrol(cloud, tmp_path):
    done, calls = _command(tmp_path, cloud["config"], "resume", "gpu-[1-2]")
    assert done.returncode == 0, done.stderr
    nodes = running(cloud["ec2"])
    assert sorted(calls) == sorted(
        f"update nodename={n} nodeaddr={i['PrivateIpAddress']} nodehostname={i['PrivateDnsName'].split('.')[0]}"
        for n, i in nodes.items())
    assert sorted(nodes) == ["gpu-1", "gpu-2"]

    done, calls = _command(tmp_path, cloud["config"], "suspend", "gpu-[1-2]")
    assert done.returncode == 0 and calls == [] and running(cloud["ec2"]) == {}


def test_the_resume_command_fails_in_one_line_and_sets_the_nodes_down(cloud, tmp_path):
    config = copy.deepcopy(cloud["config"])
    config["partitions"]["gpu"]["launch_template_id"] = "lt-0123456789abcdef0"
    done, calls = _command(tmp_path, config, "resume", "gpu-1")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error: nodes resume gpu-1: InvalidLaunchTemplateId.NotFound: The specified launch template, with template "
        "ID lt-0123456789abcdef0, does not exist.")
    assert calls == ["update nodename=gpu-1 state=DOWN reason=resume failed: InvalidLaunchTemplateId.NotFound: The "
                     "specified launch template, with template ID lt-0123456789abcdef0, does not exist."]
    done, calls = _command(tmp_path, config, "resume", "cpu-1")
    assert done.returncode == 2 and "partition 'cpu' is not in the nodes config" in done.stderr and calls == []


# --- on a node: its name, the munge key --------------------------------------------------------------------------

@pytest.fixture
def imds(monkeypatch):
    with FakeImds(region=REGION) as fake:
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.endpoint)
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)
        yield fake


def test_a_node_learns_its_name_from_its_tag_once_the_controller_sets_it(cloud, imds):
    ec2 = cloud["ec2"]
    instance = ec2.run_instances(ImageId=cloud["image"], MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    imds.set("meta-data/instance-id", instance)
    timer = threading.Timer(0.5, lambda: ec2.create_tags(Resources=[instance], Tags=[
        {"Key": "gpufleet-slurm-node", "Value": "gpu-7"}]))
    timer.start()
    try:
        assert node_name({"region": REGION}, timeout_s=60, poll_s=0.1) == "gpu-7"
    finally:
        timer.cancel()
    assert "meta-data/instance-id" in imds.gets


def test_a_node_without_its_tag_gives_up_in_one_line(cloud, imds):
    instance = cloud["ec2"].run_instances(ImageId=cloud["image"], MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    imds.set("meta-data/instance-id", instance)
    with pytest.raises(Fault) as caught:
        node_name({"region": REGION}, timeout_s=0.3, poll_s=0.1)
    assert str(caught.value) == (f"node name: instance {instance} has no gpufleet-slurm-node tag after 0.3 s (the "
                                 "controller's `trainer nodes resume` tags it; see its power-saving log)")


@pytest.fixture
def secret(moto_endpoint):
    """The stack's munge secret: created empty, as the stack creates it."""
    sm = boto3.client("secretsmanager", region_name=REGION)
    arn = sm.create_secret(Name="gpufleet-dev-munge", Description="munge key")["ARN"]
    return sm, arn


def test_the_controller_creates_the_munge_key_once_and_nodes_read_it(secret, caplog):
    sm, arn = secret
    settings = {"region": REGION, "slurm": {"controller_addr": "10.0.0.10", "munge": arn}}
    key = munge_key(settings, create=True)
    assert len(key) == 1024
    assert munge_key(settings) == key  # a node
    assert munge_key({"region": REGION, "slurm": {"munge": "gpufleet-dev-munge"}}) == key  # by name
    assert munge_key(settings, create=True) == key  # a restarted controller: the same key
    versions = sm.list_secret_version_ids(SecretId=arn)["Versions"]
    assert [v["VersionId"] for v in versions] == [MUNGE_VERSION]
    assert key.hex() not in caplog.text and repr(key) not in caplog.text


def test_two_controllers_racing_store_one_key(secret):
    sm, arn = secret
    settings = {"region": REGION, "slurm": {"munge": arn}}
    both_read = threading.Barrier(2, timeout=30)
    results, errors = {}, []

    def controller(n: int) -> None:
        client = boto3.client("secretsmanager", region_name=REGION)
        # each has seen "no value" before either writes
        client.meta.events.register("before-call.secrets-manager.PutSecretValue",
                                    lambda **_: (both_read.wait(), None)[1])
        try:
            results[n] = munge_key(settings, create=True, client=client)
        except Exception as exc:  # reported below
            errors.append(exc)
    threads = [threading.Thread(target=controller, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and results[1] == results[2] and len(results[1]) == 1024
    assert len(sm.list_secret_version_ids(SecretId=arn)["Versions"]) == 1
    assert sm.get_secret_value(SecretId=arn)["SecretBinary"] == results[1]


def test_a_node_before_the_controller_stored_the_key_is_told_in_one_line(secret):
    _, arn = secret
    with pytest.raises(Fault) as caught:
        munge_key({"region": REGION, "slurm": {"munge": arn}})
    assert str(caught.value) == (
        f"munge key: secret {arn} holds no key: the controller has not stored the munge key yet (Secrets Manager "
        "can't find the specified secret value for staging label: AWSCURRENT)")
    with pytest.raises(Fault, match="secret gpufleet-nope does not exist"):
        munge_key({"region": REGION, "slurm": {"munge": "gpufleet-nope"}}, create=True)
    with pytest.raises(UsageError, match="no slurm.munge"):
        munge_key({"region": REGION})


def test_aws_nodes_imports_no_cloud_sdk_at_import_time():
    code = ("import sys, trainer.clouds.aws_nodes, trainer.clouds.aws; "
            "print(any(m.split('.')[0] in ('boto3', 'botocore') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert aws_nodes.LAUNCH_TEMPLATE_VERSION == "$Latest"
