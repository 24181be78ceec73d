"""The Azure node provider (trainer/clouds/azure_nodes.py) against tests/trainer/fake_azure_compute.py, a fake of
Resource Manager, the instance metadata service and Key Vault written from Azure's REST documentation, over real
HTTP on 127.0.0.1; tokens come from azure-identity's ManagedIdentityCredential through the fake's identity
endpoint. Slurm's side is a recording fake (the box's tests run the real one)."""
from __future__ import annotations

import base64
import itertools
import json
import logging
import threading
import time

import pytest

from tests.trainer.fake_azure_compute import FakeAzure
from trainer.clouds import node_adapter
from trainer.clouds import azure_nodes as az
from trainer.errors import Fault, UsageError

SUB, RG = "0000-sub", "rg-gpufleet-t"
RGID = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers"
SCALE_SET = f"{RGID}/Microsoft.Compute/virtualMachineScaleSets/gpufleet-t-gpu"
SUBNET = f"{RGID}/Microsoft.Network/virtualNetworks/gpufleet-t/subnets/nodes"
IMAGE = f"{RGID}/Microsoft.Compute/galleries/gpufleet/images/node/versions/2026.12.1"
IDENTITY = f"{RGID}/Microsoft.ManagedIdentity/userAssignedIdentities/gpufleet-t-nodes"
TEAM_IDENTITY = f"{RGID}/Microsoft.ManagedIdentity/userAssignedIdentities/gpufleet-t-team-vision"
DES = f"{RGID}/Microsoft.Compute/diskEncryptionSets/gpufleet-t"
CUSTOM_DATA = base64.b64encode(b"#cloud-config\nruncmd: [[python3, -m, trainer, setup]]\n").decode()
SIZE = "Standard_ND96isr_H100_v5"


def config(stack_tag: str = "t", **partition) -> dict:
    gpu = {"instance_types": [SIZE], "vm_size": SIZE, "spot": True, "on_demand_base": 1, "gang": False,
           "subscription_id": SUB, "resource_group": RG, "location": "westeurope", "scale_set_id": SCALE_SET,
           "subnet_id": SUBNET, "image": IMAGE, "identity_id": IDENTITY, "team_identity_ids": [TEAM_IDENTITY],
           "admin_username": "gpufleet",
           "ssh_public_key": "ssh-ed25519 AAAAC3Nza test@gpufleet", "disk_encryption_set_id": DES,
           "custom_data": CUSTOM_DATA, "os_disk_gb": 256, **partition}
    return {"provider": "azure", "cloud": "azure", "stack": "t", "region": "westeurope",
            "client_id": "cid-controller", "slurm_conf": "/etc/slurm/slurm.conf",
            "tags": {"gpufleet-stack": stack_tag, "data-classification": "internal", "team": "ml"},
            "partitions": {"gpu": gpu}}


class RecordingSlurm:
    """trainer.slurm.client's update_node, recorded."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self._lock = threading.Lock()

    def update_node(self, name: str, **fields: str) -> None:
        with self._lock:
            self.calls.append((name, fields))

    def of(self, name: str) -> list[dict]:
        return [f for n, f in self.calls if n == name]


@pytest.fixture
def fake(monkeypatch):
    with FakeAzure() as f:
        monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f.base_url)  # azure-identity's IMDS
        monkeypatch.delenv("AZURE_CLIENT_ID", raising=False)
        monkeypatch.delenv("AZURE_SDK_CLOUD_CONF", raising=False)
        yield f


@pytest.fixture
def slurm():
    return RecordingSlurm()


@pytest.fixture
def make(fake, slurm):
    sleeps: list[float] = []

    def build(cfg: dict | None = None, sleep=None) -> az.NodeProvider:
        provider = az.NodeProvider(cfg or config(), slurm=slurm, arm=fake.base_url, sleep=sleep or sleeps.append,
                                   poll_s=0)
        provider.sleeps = sleeps
        return provider

    return build


def vm(name: str) -> str:
    return f"gpufleet-t-{name}"


# --- the pure parts ---------------------------------------------------------------------------------------------

def test_the_provider_is_the_azure_node_adapters():
    assert node_adapter("azure").NodeProvider is az.NodeProvider
    assert node_adapter("azure").munge_key is az.munge_key and node_adapter("azure").node_name is az.node_name


@pytest.mark.parametrize("image, ref", [
    (IMAGE, {"id": IMAGE}),
    ("microsoft-dsvm:ubuntu-hpc:2204:latest", {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204",
                                                "version": "latest"}),
    ("/SharedGalleries/abc-GPUFLEET/Images/node/Versions/1.0.0",
     {"sharedGalleryImageId": "/SharedGalleries/abc-GPUFLEET/Images/node/Versions/1.0.0"}),
])
def test_an_image_is_an_id_or_a_urn(image, ref):
    assert az.image_reference(image) == ref


def test_a_bad_image_is_one_line():
    with pytest.raises(UsageError, match=r"publisher:offer:sku:version"):
        az.image_reference("ubuntu-hpc")


def test_on_demand_base_nodes_are_regular_the_rest_spot():
    part = config()["partitions"]["gpu"]
    assert [az.is_spot(part, i) for i in (1, 2, 3)] == [False, True, True]
    assert not az.is_spot({**part, "spot": False}, 5)


@pytest.mark.parametrize("url", [
    "https://kv.vault.azure.net/secrets/munge/0123abcd",        # a version: the controller could not write
    "https://kv.example.com/secrets/munge",                      # not a vault
    "http://kv.vault.azure.net/secrets/munge",                   # not https
    "arn:aws:secretsmanager:eu-west-1:1:secret:munge",
])
def test_the_munge_secret_must_be_a_vault_secret_url(url):
    with pytest.raises(UsageError, match="Key Vault secret URL"):
        az.parse_secret_url(url)
    assert az.parse_secret_url("https://kv.vault.azure.cn/secrets/munge") == \
        ("https://kv.vault.azure.cn", "munge", "https://vault.azure.cn")


# --- resume -----------------------------------------------------------------------------------------------------

def test_resume_creates_one_vm_per_node_in_the_scale_set_and_tells_slurm_its_address(fake, slurm, make):
    make().resume(["gpu-1", "gpu-2", "gpu-3"])

    assert sorted(fake.vms) == [vm("gpu-1"), vm("gpu-2"), vm("gpu-3")]
    for index, node in enumerate(["gpu-1", "gpu-2", "gpu-3"], start=1):
        body = fake.bodies[vm(node)]
        props = body["properties"]
        assert fake.vms[vm(node)]["properties"]["provisioningState"] == "Succeeded"
        assert body["location"] == "westeurope"
        assert props["hardwareProfile"] == {"vmSize": SIZE}
        assert props["virtualMachineScaleSet"] == {"id": SCALE_SET}
        assert props["storageProfile"]["imageReference"] == {"id": IMAGE}
        os_disk = props["storageProfile"]["osDisk"]
        assert os_disk["diskSizeGB"] == 256 and os_disk["deleteOption"] == "Delete"
        assert os_disk["managedDisk"] == {"storageAccountType": "Premium_LRS", "diskEncryptionSet": {"id": DES}}
        os_profile = props["osProfile"]
        assert os_profile["computerName"] == node and os_profile["adminUsername"] == "gpufleet"
        assert os_profile["customData"] == CUSTOM_DATA
        assert os_profile["linuxConfiguration"] == {"disablePasswordAuthentication": True, "ssh": {"publicKeys": [
            {"path": "/home/gpufleet/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAAC3Nza test@gpufleet"}]}}
        assert "adminPassword" not in os_profile
        assert props["securityProfile"] == {"encryptionAtHost": True}
        # the node's identity and each team's (its jobs get that one's tokens from the node)
        assert body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {},
                                                                                       TEAM_IDENTITY: {}}}
        assert body["tags"] == {"gpufleet-stack": "t", "data-classification": "internal", "team": "ml",
                                "gpufleet-slurm-node": node}
        (nic_ref,) = props["networkProfile"]["networkInterfaces"]
        assert nic_ref["properties"] == {"primary": True, "deleteOption": "Delete"}
        nic = fake.nics[vm(node) + "-nic"]
        assert nic_ref["id"] == nic["id"]
        assert nic["properties"]["enableAcceleratedNetworking"] is True and nic["tags"] == body["tags"]
        (ipconfig,) = nic["properties"]["ipConfigurations"]
        assert ipconfig["properties"]["subnet"] == {"id": SUBNET} and "publicIPAddress" not in ipconfig["properties"]
        if index == 1:  # on_demand_base 1
            assert props["priority"] == "Regular" and "evictionPolicy" not in props and "billingProfile" not in props
        else:
            assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
            assert props["billingProfile"] == {"maxPrice": -1}
        ip = ipconfig["properties"]["privateIPAddress"]
        assert slurm.of(node) == [{"nodeaddr": ip, "nodehostname": node}]
    assert len({f["nodeaddr"] for _, f in slurm.calls}) == 3


def test_the_nodes_of_one_resume_are_created_at_once(fake, slurm, make):
    """While Azure keeps every VM creation running, all three VMs are already asked for."""
    fake.hold_operations = True
    provider = make(sleep=lambda s: time.sleep(0.01))
    done = threading.Thread(target=provider.resume, args=(["gpu-1", "gpu-2", "gpu-3"],))
    done.start()
    try:
        deadline = time.monotonic() + 20
        while len([r for r in fake.requests if r[0] == "PUT" and "virtualMachines" in r[1]]) < 3:
            assert time.monotonic() < deadline, "the three VMs were not asked for at once"
            time.sleep(0.01)
        assert slurm.calls == []  # none has finished
    finally:
        fake.hold_operations = False
        done.join(30)
    assert len(slurm.calls) == 3


@pytest.mark.parametrize("where, code", [("async", "AllocationFailed"), ("put", "SkuNotAvailable"),
                                         ("async", "OverconstrainedAllocationRequest")])
def test_a_capacity_error_sets_that_node_down_cleans_up_and_leaves_the_others(fake, slurm, make, where, code):
    fake.fail_capacity(vm("gpu-2"), code, where)
    make().resume(["gpu-1", "gpu-2", "gpu-3"])  # no capacity is an answer, not a fault: exit 0, the node DOWN

    (down,) = slurm.of("gpu-2")
    assert down["state"] == "DOWN"
    assert down["reason"] == f"resume failed: {code}: Allocation failed. We do not have sufficient capacity for " \
                             "the requested VM size in this region."[: 200 - len(f"resume failed: {code}: ")]
    assert len(down["reason"]) <= 200
    assert vm("gpu-2") not in fake.vms and vm("gpu-2") + "-nic" not in fake.nics
    assert not [d for d, r in fake.disks.items() if r["vm"] == vm("gpu-2")]
    for node in ("gpu-1", "gpu-3"):
        assert fake.vms[vm(node)]["properties"]["provisioningState"] == "Succeeded"
        assert list(slurm.of(node)[0]) == ["nodeaddr", "nodehostname"]


def test_a_long_reason_is_cut_to_200(fake, slurm, make):
    fake.fail_capacity(SIZE, "OperationNotAllowed", "put", "Operation could not be completed as it results in "
                       "exceeding approved standardNDSH100v5Family Cores quota. " + "Additional details. " * 20)
    make().resume(["gpu-1"])
    (down,) = slurm.of("gpu-1")
    assert down["reason"].startswith("resume failed: OperationNotAllowed: Operation could not be completed")
    assert len(down["reason"]) == 200 and "\n" not in down["reason"]


def test_a_gang_batch_is_all_or_nothing(fake, slurm, make):
    fake.fail_capacity(vm("gpu-3"), "AllocationFailed")
    make(config(gang=True)).resume(["gpu-1", "gpu-2", "gpu-3"])
    assert fake.vms == {} and fake.nics == {}
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        assert slurm.of(node)[-1]["state"] == "DOWN"
    assert slurm.of("gpu-1")[-1]["reason"].startswith("resume failed: gang: gpu-3 got no machine")


def test_throttling_is_retried_after_retry_after(fake, slurm, make):
    fake.throttle_left, fake.retry_after = 2, "7"
    fake.server_errors_left = 1
    provider = make()
    provider.resume(["gpu-1"])
    assert fake.throttled == 2 and provider.sleeps.count(7.0) == 2
    assert fake.vms[vm("gpu-1")]["properties"]["provisioningState"] == "Succeeded"
    assert list(slurm.of("gpu-1")[0]) == ["nodeaddr", "nodehostname"]


def test_throttling_without_end_fails_the_node_after_bounded_attempts(fake, slurm, make):
    fake.throttle_left = 10_000
    with pytest.raises(Fault, match="TooManyRequests"):
        make().resume(["gpu-1"])
    assert slurm.of("gpu-1")[0]["reason"].startswith("resume failed: TooManyRequests:")
    assert fake.throttled <= 3 * az.THROTTLE_ATTEMPTS  # the NIC PUT, then the VM and NIC deletes


def test_a_node_of_no_partition_is_down_with_the_reason(fake, slurm, make):
    with pytest.raises(Fault, match="cpu-1"):
        make().resume(["cpu-1"])
    assert slurm.of("cpu-1")[0]["reason"].startswith("resume failed: UsageError: nodes: cpu-1 is not")
    assert fake.requests == []


# --- suspend ----------------------------------------------------------------------------------------------------

def test_suspend_deletes_only_this_stacks_vms(fake, slurm, make):
    make().resume(["gpu-1", "gpu-2"])
    make(config(stack_tag="someone-else")).resume(["gpu-3"])  # same name, another stack's tag
    orphan = make()._nic(config()["partitions"]["gpu"], "gpu-5")
    fake.nics[vm("gpu-5") + "-nic"] = {"id": orphan.split("?")[0], "name": vm("gpu-5") + "-nic",
                                       "location": "westeurope", "properties": {},
                                       "tags": {"gpufleet-stack": "t", "gpufleet-slurm-node": "gpu-5"}}
    fake.requests.clear()

    make().suspend(["gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"])
    deletes = sorted(p.rsplit("/", 1)[-1] for m, p in fake.requests if m == "DELETE")
    assert deletes == [vm("gpu-1"), vm("gpu-2"), vm("gpu-5") + "-nic"]
    assert fake.vms[vm("gpu-1")]["properties"]["provisioningState"] == "Deleting"  # accepted, not waited for
    assert fake.vms[vm("gpu-3")]["properties"]["provisioningState"] == "Succeeded"

    fake.finish_operations()
    assert sorted(fake.vms) == [vm("gpu-3")] and sorted(fake.nics) == [vm("gpu-3") + "-nic"]
    assert {r["vm"] for r in fake.disks.values()} == {vm("gpu-3")}  # OS disks went with their VMs

    make().suspend(["gpu-1", "gpu-2"])  # again: nothing there, nothing to do
    assert not [r for r in fake.requests[-4:] if r[0] == "DELETE"]


def test_resume_failed_deletes_the_vm_and_leaves_the_node_down(fake, slurm, make):
    provider = make()
    provider.resume(["gpu-2"])
    provider.resume_failed(["gpu-2"])
    assert fake.vms[vm("gpu-2")]["properties"]["provisioningState"] == "Deleting"
    assert slurm.of("gpu-2")[-1] == {"state": "DOWN", "reason": "resume failed: did not register within "
                                                                "ResumeTimeout"}


def test_resume_right_after_suspend_waits_for_the_old_vm_to_go(fake, slurm, make):
    fake.op_polls = 3
    provider = make()
    provider.resume(["gpu-2"])
    first = fake.vms[vm("gpu-2")]["properties"]["vmId"]
    provider.suspend(["gpu-2"])
    assert fake.vms[vm("gpu-2")]["properties"]["provisioningState"] == "Deleting"
    provider.resume(["gpu-2"])
    again = fake.vms[vm("gpu-2")]["properties"]
    assert again["provisioningState"] == "Succeeded" and again["vmId"] != first
    assert [list(f) for f in slurm.of("gpu-2")] == [["nodeaddr", "nodehostname"]] * 2


# --- node_name --------------------------------------------------------------------------------------------------

def test_node_name_waits_for_the_tag_in_the_instance_metadata(fake):
    fake.instance["compute"].update(name="gpufleet-t-gpu-7", osProfile={"computerName": "not-trusted"})

    def tag_later():
        while fake.instance_gets < 2:
            time.sleep(0.01)
        fake.instance["compute"]["tagsList"] = [{"name": "gpufleet-stack", "value": "t"},
                                                {"name": "gpufleet-slurm-node", "value": "gpu-7"}]

    threading.Thread(target=tag_later, daemon=True).start()
    assert az.node_name({"stack": "t"}, timeout_s=60, base_url=fake.base_url, poll_s=0.01) == "gpu-7"
    assert fake.instance_gets >= 3


def test_node_name_falls_back_to_the_computer_name_only_of_a_vm_the_provider_named(fake):
    fake.instance["compute"].update(name="gpufleet-t-gpu-4", osProfile={"computerName": "gpu-4"})
    assert az.node_name({"stack": "t"}, timeout_s=5, base_url=fake.base_url) == "gpu-4"
    fake.instance["compute"]["name"] = "some-vm"
    with pytest.raises(Fault) as err:
        az.node_name({"stack": "t"}, timeout_s=0.2, base_url=fake.base_url, poll_s=0.05)
    assert "\n" not in str(err.value) and "gpufleet-slurm-node" in str(err.value)


def test_node_name_without_a_metadata_service_is_one_line():
    with pytest.raises(Fault, match="no instance metadata service"):
        az.node_name({}, timeout_s=0.1, base_url="http://127.0.0.1:9", poll_s=0.05)


# --- munge_key --------------------------------------------------------------------------------------------------

def settings(fake) -> dict:
    return {"cloud": "azure", "stack": "t", "azure": {"client_id": "cid-controller"},
            "slurm": {"controller_addr": "10.0.0.10", "controller_port": 6817,
                      "munge": f"{fake.base_url}/secrets/gpufleet-t-munge"}}


def latest(fake) -> dict:
    return fake.secrets["gpufleet-t-munge"][-1]


def test_a_node_refuses_the_placeholder(fake):
    fake.add_secret_version("gpufleet-t-munge", "unset", "unset")
    with pytest.raises(Fault) as err:
        az.munge_key(settings(fake))
    assert "\n" not in str(err.value) and "holds no key yet" in str(err.value)
    assert fake.secret_puts == 0


def test_the_controller_creates_the_key_once_and_nodes_read_it(fake, caplog):
    caplog.set_level(logging.DEBUG)
    fake.add_secret_version("gpufleet-t-munge", "unset", "unset")
    key = az.munge_key(settings(fake), create=True, settle_s=0)
    assert len(key) == 1024
    stored = latest(fake)
    assert base64.b64decode(stored["value"]) == key and stored["tags"] == {"gpufleet-munge": "set"}
    puts = fake.secret_puts
    assert az.munge_key(settings(fake), create=True, settle_s=0) == key  # a reboot: nothing written
    assert az.munge_key(settings(fake)) == key
    assert fake.secret_puts == puts
    assert stored["value"] not in caplog.text and stored["value"][:40] not in caplog.text


@pytest.mark.parametrize("same_second", [False, True])
def test_two_controllers_racing_end_with_the_same_key(fake, same_second):
    """Candidates written a second apart (the first is older and wins) or within one second (Key Vault's
    `created` cannot tell them apart: the version id decides, the same for both)."""
    fake.clock = (lambda: 1_800_000_000) if same_second else itertools.count(1_800_000_000).__next__
    fake.add_secret_version("gpufleet-t-munge", "unset", "unset")
    fake.put_barrier = threading.Barrier(2)  # both candidates are written before either looks
    keys: list[bytes] = []

    def controller():
        keys.append(az.munge_key(settings(fake), create=True, settle_s=0))

    threads = [threading.Thread(target=controller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(keys) == 2 and keys[0] == keys[1]
    fake.put_barrier = None
    assert base64.b64decode(latest(fake)["value"]) == keys[0] and latest(fake)["tags"] == {"gpufleet-munge": "set"}
    candidates = [v for v in fake.secrets["gpufleet-t-munge"] if v["tags"] == {"gpufleet-munge": "generated"}]
    assert len(candidates) == 2
    if not same_second:
        assert base64.b64decode(candidates[0]["value"]) == keys[0]  # the older one won
    assert az.munge_key(settings(fake)) == keys[0]


def test_a_controller_finding_an_unsettled_race_settles_it_on_the_oldest_candidate(fake):
    """The versions page by page; an older generation of keys (before the placeholder was set again) is past."""
    fake.page_size = 2
    old = base64.b64encode(b"o" * 1024).decode()
    a, b = base64.b64encode(b"a" * 1024).decode(), base64.b64encode(b"b" * 1024).decode()
    fake.add_secret_version("gpufleet-t-munge", "unset", "unset", created=100)
    fake.add_secret_version("gpufleet-t-munge", old, "generated", created=101)
    fake.add_secret_version("gpufleet-t-munge", "unset", "unset", created=200)  # rotated by hand
    fake.add_secret_version("gpufleet-t-munge", a, "generated", created=210)
    fake.add_secret_version("gpufleet-t-munge", b, "generated", created=211)
    assert az.munge_key(settings(fake)) == b"b" * 1024  # a node reads the latest, whatever it is
    assert az.munge_key(settings(fake), create=True, settle_s=0) == b"a" * 1024
    assert latest(fake)["value"] == a and latest(fake)["tags"] == {"gpufleet-munge": "set"}
    assert az.munge_key(settings(fake)) == b"a" * 1024


def test_no_secret_is_one_line(fake):
    with pytest.raises(Fault) as err:
        az.munge_key(settings(fake))
    assert "\n" not in str(err.value) and "SecretNotFound" in str(err.value)


def test_a_token_for_another_identity_is_refused_in_one_line(fake):
    other = {**settings(fake), "azure": {"client_id": "cid-someone-else"}}
    with pytest.raises(UsageError) as err:
        az.munge_key(other)
    assert "\n" not in str(err.value) and "managed identity" in str(err.value)


def test_the_fake_checks_tokens(fake):
    """The ARM and vault paths refuse a request without the right bearer token (the fake is not a pass-through)."""
    import urllib.error
    import urllib.request

    for path in (f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/x"
                 f"?api-version=2024-07-01", "/secrets/x?api-version=7.4"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(fake.base_url + path, timeout=5)
        assert err.value.code == 401 and json.loads(err.value.read())["error"]["code"]


def test_a_gang_on_infiniband_goes_into_its_availability_set_on_demand_only():
    from trainer.clouds.azure_nodes import vm_body
    from trainer.errors import UsageError

    aset = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/availabilitySets/big"
    part = {**config(gang=True, spot=False, availability_set_id=aset)["partitions"]["gpu"]}
    body = vm_body("gpu-2", 2, part, {"gpufleet-stack": "t"}, "nic")
    assert body["properties"]["availabilitySet"] == {"id": aset}
    assert "virtualMachineScaleSet" not in body["properties"] and body["properties"]["priority"] == "Regular"
    with pytest.raises(UsageError, match="takes no spot VM"):
        vm_body("gpu-2", 2, {**part, "spot": True}, {}, "nic")
    plan = {"publisher": "p", "product": "o", "name": "s"}
    assert vm_body("gpu-1", 1, {**part, "plan": plan}, {}, "nic")["plan"] == plan
