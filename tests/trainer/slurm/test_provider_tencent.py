"""The Tencent Cloud node provider of Slurm's power saving, a node's Slurm name and the munge key, against the fakes
of CVM 2017-03-12, Secrets Manager 2019-09-23 (API 3.0, TC3-signed) and the CVM metadata service in
tests/trainer/fake_tencent.py (written from Tencent's documentation), over real HTTP on 127.0.0.1. Slurm is a
recording stand-in: the provider's calls of update_node are what it tells slurmctld."""
from __future__ import annotations

import base64
import copy
import logging

import pytest

from tests.trainer.fake_tencent import KEY, FakeApi3, FakeCvm, FakeMetadata, FakeSsm
from trainer.clouds import node_adapter
from trainer.clouds.tencent_api import Api, Credentials, Metadata, RoleCredentials, StaticCredentials
from trainer.clouds.tencent_nodes import NODE_TAG, NodeProvider, munge_key, node_name
from trainer.errors import Fault

REGION = "ap-shanghai"
T1, T2 = "GN10Xp.20XLARGE320", "GN10Xp.10XLARGE160"
ZA, ZB = "ap-shanghai-2", "ap-shanghai-4"
SA, SB = "subnet-aaaa1111", "subnet-bbbb2222"
TAGS = {"gpufleet-stack": "tencent", "data-classification": "personal", "team": "ml-platform"}
CONFIG = {
    "provider": "tencent", "cloud": "tencent", "stack": "tencent", "region": REGION,
    "slurm_conf": "/etc/slurm/slurm.conf", "tags": TAGS,
    "partitions": {"gpu": {
        "instance_types": [T1, T2], "spot": True, "on_demand_base": 1, "gang": False,
        "launch_template_id": "lt-1a2b3c4d", "vpc_id": "vpc-1a2b3c4d", "subnet_ids": [SA, SB], "zones": [ZA, ZB],
        "placement_set_id": "ps-1a2b3c4d", "spot_max_price": "120.5"}},
}
NODES = ["gpu-1", "gpu-2", "gpu-3"]


class RecordingSlurm:
    """What the provider asks of slurmctld (trainer.slurm.client's update_node)."""

    def __init__(self):
        self.updates: list[tuple[str, dict]] = []

    def update_node(self, name: str, **fields: str) -> None:
        self.updates.append((name, fields))

    def of(self, name: str) -> list[dict]:
        return [f for n, f in self.updates if n == name]


@pytest.fixture
def cloud():
    with FakeApi3() as api:
        cvm = FakeCvm({SA: ZA, SB: ZB}).install(api)
        ssm = FakeSsm().install(api)
        yield api, cvm, ssm


def client_of(api: FakeApi3, credentials=None) -> Api:
    return Api(credentials or StaticCredentials(KEY), REGION, endpoint=api.endpoint)


def provider(cloud, config=None) -> tuple[NodeProvider, RecordingSlurm]:
    api = cloud[0]
    slurm = RecordingSlurm()
    nodes = NodeProvider(copy.deepcopy(config or CONFIG), slurm=slurm, api=client_of(api))
    nodes.poll_s = nodes.backoff_s = 0.01   # quick polls and backoffs; nothing here is timed
    return nodes, slurm


def runs(api: FakeApi3) -> list[dict]:
    return [p for service, action, p in api.calls if (service, action) == ("cvm", "RunInstances")]


def tried(api: FakeApi3) -> list[tuple[str, str, str]]:
    return [(p["InstanceType"], p["Placement"]["Zone"], p["InstanceChargeType"]) for p in runs(api)]


def with_partition(**changes) -> dict:
    config = copy.deepcopy(CONFIG)
    config["partitions"]["gpu"].update(changes)
    return config


# --- resume ------------------------------------------------------------------------------------------------

def test_resume_launches_each_node_from_the_template_with_its_name_tags_charge_and_placement(cloud):
    api, cvm, _ = cloud
    nodes, slurm = provider(cloud)
    nodes.resume(NODES)

    launches = runs(api)
    assert len(launches) == 3 and all(p["InstanceCount"] == 1 for p in launches)
    for name, p in zip(NODES, launches):
        assert p["LaunchTemplate"] == {"LaunchTemplateId": "lt-1a2b3c4d"}
        assert (p["InstanceType"], p["Placement"], p["VirtualPrivateCloud"]) == (
            T1, {"Zone": ZA}, {"VpcId": "vpc-1a2b3c4d", "SubnetId": SA})
        assert p["DisasterRecoverGroupIds"] == ["ps-1a2b3c4d"]
        assert p["InstanceName"] == f"gpufleet-tencent-{name}"
        assert p["TagSpecification"] == [{"ResourceType": "instance", "Tags": [
            {"Key": k, "Value": v} for k, v in {**TAGS, NODE_TAG: name}.items()]}]
    # on_demand_base 1: gpu-1 on demand, the rest spot (one-time, the partition's bid)
    assert [p["InstanceChargeType"] for p in launches] == ["POSTPAID_BY_HOUR", "SPOTPAID", "SPOTPAID"]
    assert "InstanceMarketOptions" not in launches[0]
    assert launches[1]["InstanceMarketOptions"] == {
        "MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time", "MaxPrice": "120.5"}}
    assert len({p["ClientToken"] for p in launches}) == 3

    for name in NODES:
        (machine,) = cvm.by_node(name)
        assert (machine.name, machine.tags["gpufleet-stack"], machine.tags["team"]) == (
            f"gpufleet-tencent-{name}", "tencent", "ml-platform")
        # the address once DescribeInstances shows it (the fake shows none in its first answer)
        assert slurm.of(name) == [{"nodeaddr": machine.ip, "nodehostname": name}]
    assert set(api.regions) == {REGION}


def test_the_adapter_finds_the_provider_and_a_spot_off_partition_is_all_on_demand(cloud):
    assert node_adapter("tencent").NodeProvider is NodeProvider
    api, _, _ = cloud
    nodes, _ = provider(cloud, with_partition(spot=False, placement_set_id=None))
    nodes.resume(NODES)
    assert {p["InstanceChargeType"] for p in runs(api)} == {"POSTPAID_BY_HOUR"}
    assert not any("DisasterRecoverGroupIds" in p or "InstanceMarketOptions" in p for p in runs(api))


def test_a_sold_out_first_type_falls_back_to_the_second_and_is_not_tried_again(cloud):
    api, cvm, _ = cloud
    cvm.sold_out[(T1, None)] = "ResourcesSoldOut.SpecifiedInstanceType"
    nodes, slurm = provider(cloud)
    nodes.resume(NODES)
    assert {m.type for n in NODES for m in cvm.by_node(n)} == {T2}
    # each charge type finds out once, in each zone; gpu-3 (spot, like gpu-2) goes straight to the second type
    od, spot = "POSTPAID_BY_HOUR", "SPOTPAID"
    assert tried(api) == [(T1, ZA, od), (T1, ZB, od), (T2, ZA, od),
                          (T1, ZA, spot), (T1, ZB, spot), (T2, ZA, spot),
                          (T2, ZA, spot)]
    assert all(set(slurm.of(n)[0]) == {"nodeaddr", "nodehostname"} for n in NODES)


def test_a_sold_out_zone_is_left_for_every_type(cloud):
    api, cvm, _ = cloud
    cvm.sold_out[(T1, ZA)] = "ResourceInsufficient.AvailabilityZoneSoldOut"
    nodes, _ = provider(cloud, with_partition(spot=False))
    nodes.resume(NODES)
    assert tried(api) == [(T1, ZA, "POSTPAID_BY_HOUR")] + [(T1, ZB, "POSTPAID_BY_HOUR")] * 3
    assert {(m.zone, m.subnet) for n in NODES for m in cvm.by_node(n)} == {(ZB, SB)}


def test_when_every_type_and_zone_is_sold_out_the_nodes_go_down_with_the_reason(cloud):
    api, cvm, _ = cloud
    cvm.sold_out[(T1, None)] = "ResourcesSoldOut.SpecifiedInstanceType"
    cvm.sold_out[(T2, None)] = "ResourceInsufficient.SpecifiedInstanceType"
    nodes, slurm = provider(cloud)
    nodes.resume(NODES)  # capacity is not a fault: the program exits 0, Slurm has the reason
    assert cvm.live() == []
    for name in NODES:
        (update,) = slurm.of(name)
        assert update == {"state": "DOWN", "reason": f"resume failed: ResourceInsufficient.SpecifiedInstanceType: "
                                                     f"{T2} is sold out in {ZB}"}
        assert len(update["reason"]) <= 200


def test_request_limit_exceeded_is_retried_with_the_same_client_token(cloud):
    api, cvm, _ = cloud
    cvm.throttle.update({"RunInstances": 2, "DescribeInstances": 1, "TerminateInstances": 1})
    nodes, slurm = provider(cloud)
    nodes.resume(["gpu-1"])
    (machine,) = cvm.by_node("gpu-1")
    assert slurm.of("gpu-1") == [{"nodeaddr": machine.ip, "nodehostname": "gpu-1"}]
    assert len(runs(api)) == 3 and len({p["ClientToken"] for p in runs(api)}) == 1  # a repeat, not a new launch
    nodes.suspend(["gpu-1"])
    assert cvm.by_node("gpu-1") == []


def test_throttling_that_does_not_end_is_a_fault_and_the_nodes_go_down(cloud):
    api, cvm, _ = cloud
    nodes, slurm = provider(cloud)
    cvm.throttle["RunInstances"] = 1000
    with pytest.raises(Fault) as err:
        nodes.resume(["gpu-1", "gpu-2"])
    assert "\n" not in str(err.value) and "RequestLimitExceeded" in str(err.value)
    assert len(runs(api)) == nodes.attempts   # bounded
    for name in ("gpu-1", "gpu-2"):
        assert slurm.of(name) == [{"state": "DOWN", "reason": "resume failed: RequestLimitExceeded: "
                                                              "The number of requests exceeds the frequency limit."}]


def test_an_unexpected_error_sets_the_nodes_down_and_fails_in_one_line(cloud):
    _, cvm, _ = cloud
    nodes, slurm = provider(cloud, with_partition(launch_template_id="lt-deadbeef"))
    with pytest.raises(Fault, match=r"^nodes resume: 3 of 3 nodes DOWN: InvalidParameterValue\."
                                    r"LaunchTemplateIdNotExisted: launch template 'lt-deadbeef'$"):
        nodes.resume(NODES)
    assert cvm.live() == []
    assert {f["reason"] for n in NODES for f in slurm.of(n)} == {
        "resume failed: InvalidParameterValue.LaunchTemplateIdNotExisted: launch template 'lt-deadbeef'"}


def test_an_unknown_partition_is_a_fault_too(cloud):
    nodes, slurm = provider(cloud)
    with pytest.raises(Fault, match="partition 'cpu' of cpu-1 is not in the nodes config"):
        nodes.resume(["cpu-1"])
    assert slurm.of("cpu-1")[0]["state"] == "DOWN"


def test_a_machine_that_fails_to_launch_is_terminated_and_its_node_goes_down(cloud):
    _, cvm, _ = cloud
    cvm.fail_launch.add(T1)
    nodes, slurm = provider(cloud)
    nodes.resume(["gpu-1"])
    assert cvm.live() == [] and len(cvm.terminated) == 1
    assert slurm.of("gpu-1") == [{"state": "DOWN", "reason": f"resume failed: LaunchFailed: {T1}: creation failed"}]


def test_a_gang_batch_is_all_in_one_type_and_zone_or_moves_whole(cloud):
    api, cvm, _ = cloud
    cvm.sold_out[(T1, ZA, "SPOTPAID")] = "LimitExceeded.SpotQuota"  # gpu-1 (on demand) gets one, gpu-2 does not
    nodes, slurm = provider(cloud, with_partition(gang=True))
    nodes.resume(NODES)
    machines = [m for n in NODES for m in cvm.by_node(n)]
    assert len(machines) == 3 and {(m.type, m.zone) for m in machines} == {(T1, ZB)}
    assert len(cvm.terminated) == 1  # gpu-1's machine in the zone the batch left
    assert tried(api)[:2] == [(T1, ZA, "POSTPAID_BY_HOUR"), (T1, ZA, "SPOTPAID")]
    assert all("nodeaddr" in slurm.of(n)[0] for n in NODES)


def test_a_gang_batch_with_no_type_and_zone_for_all_gets_nothing(cloud):
    _, cvm, _ = cloud
    for zone in (ZA, ZB):
        for itype in (T1, T2):
            cvm.sold_out[(itype, zone, "SPOTPAID")] = "LimitExceeded.SpotQuota"
    nodes, slurm = provider(cloud, with_partition(gang=True))
    nodes.resume(NODES)
    assert cvm.live() == [] and len(cvm.terminated) == 4  # gpu-1's machine in each of the four tries
    assert {slurm.of(n)[0]["reason"] for n in NODES} == {
        f"resume failed: LimitExceeded.SpotQuota: {T2} is sold out in {ZB}"}


def test_resume_terminates_a_leftover_with_the_same_node_name_first(cloud):
    _, cvm, _ = cloud
    old = cvm.add("gpufleet-tencent-gpu-1", {**TAGS, NODE_TAG: "gpu-1"})
    nodes, _ = provider(cloud)
    nodes.resume(["gpu-1"])
    (machine,) = cvm.by_node("gpu-1")
    assert machine.id != old.id and cvm.terminated == [old.id]


# --- suspend -----------------------------------------------------------------------------------------------

def test_suspend_terminates_only_this_stacks_machines_of_those_nodes_and_is_idempotent(cloud):
    api, cvm, _ = cloud
    others = cvm.add("gpufleet-other-gpu-1", {"gpufleet-stack": "other", NODE_TAG: "gpu-1"})
    nodes, _ = provider(cloud)
    names = [f"gpu-{n}" for n in range(1, 8)]   # more names than a filter's five values
    nodes.resume(names)
    nodes.suspend(names[:6])
    assert [m.tags[NODE_TAG] for m in cvm.live() if m.tags["gpufleet-stack"] == "tencent"] == ["gpu-7"]
    assert others in cvm.live()
    terminations = [p for s, a, p in api.calls if a == "TerminateInstances"]
    nodes.suspend(names[:6])
    nodes.suspend(names[:6])
    assert [p for s, a, p in api.calls if a == "TerminateInstances"] == terminations  # nothing left to do
    filters = [p["Filters"] for s, a, p in api.calls if a == "DescribeInstances" and "Filters" in p]
    assert all({"Name": "tag:gpufleet-stack", "Values": ["tencent"]} in f for f in filters)


def test_resume_failed_terminates_and_leaves_the_nodes_down(cloud):
    _, cvm, _ = cloud
    nodes, slurm = provider(cloud)
    nodes.resume(["gpu-1", "gpu-2"])
    nodes.resume_failed(["gpu-1"])
    assert cvm.by_node("gpu-1") == [] and len(cvm.by_node("gpu-2")) == 1
    assert slurm.of("gpu-1")[-1] == {"state": "DOWN",
                                     "reason": "resume failed: not registered within ResumeTimeout"}


def test_an_instance_already_gone_does_not_stop_the_others_being_terminated(cloud):
    _, cvm, _ = cloud
    nodes, _ = provider(cloud)
    nodes.resume(["gpu-1"])
    (machine,) = cvm.by_node("gpu-1")
    nodes.terminate(["ins-0000dead", machine.id])   # the batch is refused for the unknown id; then one by one
    assert cvm.by_node("gpu-1") == [] and cvm.terminated == [machine.id]


def test_a_refused_suspend_is_one_line_and_resume_fail_still_sets_the_nodes_down(cloud):
    api, _, _ = cloud
    nodes, slurm = provider(cloud)
    nodes._api = Api(StaticCredentials(Credentials(KEY.secret_id, "not-the-key", KEY.token)), REGION,
                     endpoint=api.endpoint)
    with pytest.raises(Fault, match=r"^nodes suspend: AuthFailure.SignatureFailure: bad signature$"):
        nodes.resume_failed(["gpu-1"])
    assert slurm.of("gpu-1") == [{"state": "DOWN", "reason": "resume failed: not registered within ResumeTimeout"}]


# --- on a node: its Slurm name -----------------------------------------------------------------------------

NODE_SETTINGS = {"cloud": "tencent", "region": REGION, "stack": "tencent",
                 "tencent": {"role_name": "gpufleet-test-nodes"},
                 "slurm": {"controller_addr": "10.0.0.10", "controller_port": 6817, "munge": "gpufleet-tencent-munge"}}


@pytest.fixture
def metadata(monkeypatch):
    with FakeMetadata() as fake:
        monkeypatch.setenv("TENCENTCLOUD_METADATA_ENDPOINT", fake.endpoint)
        for var in ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield fake


def role_client(api: FakeApi3) -> Api:
    """The node's own identity: its CAM role's key from the (fake) metadata service."""
    return client_of(api, RoleCredentials(Metadata(), "gpufleet-test-nodes"))


def test_node_name_is_the_tag_the_provider_gave_the_machine(cloud, metadata):
    api, cvm, _ = cloud
    nodes, _ = provider(cloud)
    nodes.resume(["gpu-2"])
    (machine,) = cvm.by_node("gpu-2")
    metadata.set("meta-data/instance-id", machine.id)
    assert node_name(NODE_SETTINGS, api=role_client(api), poll_s=0.01) == "gpu-2"
    assert metadata.key_fetches >= 1 and "meta-data/instance-id" in metadata.gets


def test_node_name_waits_for_the_tag_and_gives_up_in_one_line(cloud, metadata):
    api, cvm, _ = cloud
    machine = cvm.add("nameless", {"gpufleet-stack": "tencent"})
    metadata.set("meta-data/instance-id", machine.id)
    with pytest.raises(Fault, match=rf"^node name: none after 0.3 s \({machine.id} has no {NODE_TAG} tag\)$"):
        node_name(NODE_SETTINGS, timeout_s=0.3, api=role_client(api), poll_s=0.01)

    describe = api.handlers[("cvm", "DescribeInstances")]
    seen = []

    def tagged_later(params):  # the tag shows up on the third look
        seen.append(params)
        if len(seen) == 3:
            machine.tags[NODE_TAG] = "gpu-5"
        return describe(params)

    api.handlers[("cvm", "DescribeInstances")] = tagged_later
    assert node_name(NODE_SETTINGS, timeout_s=60, api=role_client(api), poll_s=0.01) == "gpu-5"
    assert len(seen) == 3 and seen[0] == {"InstanceIds": [machine.id]}


# --- the munge key -----------------------------------------------------------------------------------------

SECRET = "gpufleet-tencent-munge"


def test_the_controller_creates_the_key_once_and_nodes_read_it(cloud, caplog):
    api, _, ssm = cloud
    ssm.create(SECRET)  # the stack's secret: a placeholder first version, no key
    caplog.set_level(logging.DEBUG)
    key = munge_key(NODE_SETTINGS, create=True, api=client_of(api))
    assert len(key) == 1024
    assert ssm.secrets[SECRET]["munge-1"] == {"SecretBinary": base64.b64encode(key).decode()}
    assert munge_key(NODE_SETTINGS, create=True, api=client_of(api)) == key   # a reboot: the same key
    assert munge_key(NODE_SETTINGS, api=client_of(api)) == key                # a node
    logged = caplog.text
    assert base64.b64encode(key).decode() not in logged and key.hex() not in logged
    puts = [p for s, a, p in api.calls if a == "PutSecretValue"]
    assert len(puts) == 1 and puts[0]["VersionId"] == "munge-1"


def test_a_node_before_the_controller_gets_one_line_and_a_missing_secret_too(cloud):
    api, _, ssm = cloud
    with pytest.raises(Fault, match=rf"^munge key: secret '{SECRET}' does not exist \(the stack creates it\)$"):
        munge_key(NODE_SETTINGS, api=client_of(api))
    ssm.create(SECRET)
    with pytest.raises(Fault, match=rf"^munge key: secret '{SECRET}' has no version munge-1 yet"):
        munge_key(NODE_SETTINGS, api=client_of(api))
    assert not [a for s, a, p in api.calls if a == "PutSecretValue"]


def test_a_second_controller_racing_the_first_takes_the_winners_key(cloud):
    api, _, ssm = cloud
    ssm.create(SECRET)
    winner = bytes(range(256)) * 4
    ssm.before_put = lambda params: ssm.put_binary(SECRET, "munge-1", winner)  # the other one got there first
    assert munge_key(NODE_SETTINGS, create=True, api=client_of(api)) == winner
    assert munge_key(NODE_SETTINGS, api=client_of(api)) == winner
