"""Tencent Cloud for Slurm: the node provider of power saving (``python -m trainer nodes resume|suspend|resume-fail``
on the controller), and, on a node, its Slurm name and the stack's munge key.

Everything goes through API 3.0 (trainer.clouds.tencent_api, TC3-signed) with the CAM role's temporary key from the
metadata service (trainer.clouds.tencent.credentials): CVM 2017-03-12 for the machines, Secrets Manager 2019-09-23
for the munge key. API facts are from Tencent's API documentation (RunInstances, DescribeInstances,
TerminateInstances and the CVM error codes; GetSecretValue, PutSecretValue and the SSM error codes).

One RunInstances call per node name, InstanceCount 1. Tencent names the instances of one call after one
InstanceName (a suffix 1..n, or a ``{R:x}`` sequence), and TagSpecification gives all of them the same tags; a batch
of names that need not be consecutive (gpu-2, gpu-7) would need a rename and a per-instance Tag API call afterwards,
leaving a window in which a machine exists without its node tag, which suspend and the node itself look it up by. One
call per name launches each machine with its own name (``gpufleet-<stack>-<node>``) and its
``gpufleet-slurm-node`` tag at once, and a capacity error costs only that name's try. The cost is one call per
node (RunInstances allows 10 a second; throttling is retried with backoff). A gang partition's batch is all or
nothing: every name tries the same type and zone, and a capacity error for one terminates what the batch got
there and moves the whole batch to the next type or zone.

Each call carries a ClientToken (RunInstances' idempotency key), so a call repeated after a lost answer launches
nothing twice. Before launching, resume terminates whatever still carries these node names in this stack (a
suspend that failed earlier), so no two machines answer to one name.
"""
from __future__ import annotations

import base64
import logging
import os
import time
import uuid

from trainer.clouds.tencent_api import (CVM_VERSION, SSM_VERSION, Api, ApiError, Metadata, MetadataUnavailable,
                                        call_with_backoff, error_message)
from trainer.clouds.tencent import credentials, region_of
from trainer.errors import Fault
from trainer.slurm import client
from trainer.slurm.nodes import NodeProvider as Provider

log = logging.getLogger("gpufleet.tencent.nodes")

NODE_TAG = "gpufleet-slurm-node"
STACK_TAG = "gpufleet-stack"
INSTANCE_ID = "meta-data/instance-id"
ON_DEMAND, SPOT = "POSTPAID_BY_HOUR", "SPOTPAID"
FILTER_VALUES = 5        # DescribeInstances: at most 5 values per filter
PAGE = 100               # DescribeInstances: Limit at most 100; TerminateInstances: at most 100 ids
IP_WAIT_S = 300.0
REASON_MAX = 200
MUNGE_VERSION = "munge-1"   # the secret's version that holds the key; the infra's first version ("init") does not
MUNGE_BYTES = 1024
GONE = ("TERMINATING",)     # DescribeInstances states of an instance on its way out: nothing left to terminate

# RunInstances errors that say "not here, not now": the next instance type or zone may work (CVM error codes).
CAPACITY_PREFIXES = ("ResourceInsufficient.", "ResourcesSoldOut.")
CAPACITY_CODES = {
    "LimitExceeded.InstanceQuota", "LimitExceeded.CvmInstanceQuota", "LimitExceeded.SpotQuota",
    "LimitExceeded.UserSpotQuota", "LimitExceeded.VpcSubnetNum", "ResourceUnavailable.InstanceType",
    "ResourceNotFound.InvalidZoneInstanceType", "FailedOperation.NoAvailableIpAddressCountInSubnet",
}
# ... of which these concern the whole zone (or its subnet), whatever the type.
ZONE_CODES = {
    "ResourceInsufficient.AvailabilityZoneSoldOut", "ResourcesSoldOut.AvailableZone", "ResourceInsufficient.CidrBlock",
    "LimitExceeded.VpcSubnetNum", "FailedOperation.NoAvailableIpAddressCountInSubnet",
}
# TerminateInstances errors of an instance that is already going or gone.
ALREADY_GONE = {"InvalidInstanceId.NotFound", "UnsupportedOperation.InstanceStateTerminating",
                "UnsupportedOperation.InstanceStateTerminated", "UnsupportedOperation.InstanceStateLaunchFailed"}


def capacity(code: str) -> bool:
    return code in CAPACITY_CODES or code.startswith(CAPACITY_PREFIXES)


def reason(code: str, message: str) -> str:
    return f"resume failed: {code}: {message}"[:REASON_MAX]


class NoCapacity(Exception):
    def __init__(self, error: ApiError | None):
        super().__init__(str(error))
        self.error = error


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


class NodeProvider(Provider):
    """CVM instances behind Slurm's CLOUD nodes ``<partition>-<n>`` of one stack.

    config: /etc/gpufleet/nodes.json (``provider``/``cloud`` "tencent", ``stack``, ``region``, ``tags``, and per
    partition ``instance_types``, ``spot``, ``on_demand_base``, ``gang``, ``launch_template_id``, ``vpc_id``,
    ``subnet_ids`` with the ``zones`` they lie in, one each, ``placement_set_id`` or null, and optionally
    ``spot_max_price``, the spot bid). Optional: ``tencent`` {"role_name"} (the controller's CAM role),
    ``ip_wait_s``.
    """

    def __init__(self, config: dict, slurm=client, api: Api | None = None):
        self.config, self.slurm = config, slurm
        self.stack = config["stack"]
        self.partitions = config.get("partitions") or {}
        self.ip_wait_s = float(config.get("ip_wait_s", IP_WAIT_S))
        self.poll_s, self.backoff_s, self.attempts = 2.0, 0.5, 8
        self.sleep = time.sleep
        self._api = api

    # --- plumbing ------------------------------------------------------------------------------------------
    @property
    def api(self) -> Api:
        if self._api is None:
            settings = {"cloud": "tencent", "tencent": self.config.get("tencent") or {}}
            self._api = Api(credentials(settings), self.config["region"])
        return self._api

    def _cvm(self, action: str, params: dict, retry_codes: tuple[str, ...] = ()) -> dict:
        return call_with_backoff(self.api, "cvm", CVM_VERSION, action, params, attempts=self.attempts,
                                 base_s=self.backoff_s, retry_codes=retry_codes, sleep=self.sleep)

    def _tags(self, name: str) -> list[dict]:
        tags = {**(self.config.get("tags") or {}), STACK_TAG: self.stack, NODE_TAG: name}
        return [{"Key": k, "Value": str(v)} for k, v in tags.items()]

    def instances(self, names: list[str]) -> list[dict]:
        """This stack's instances that carry one of these node names (terminating ones too)."""
        found = []
        for group in _chunks(sorted(set(names)), FILTER_VALUES):
            filters = [{"Name": f"tag:{STACK_TAG}", "Values": [self.stack]},
                       {"Name": f"tag:{NODE_TAG}", "Values": group}]
            offset = 0
            while True:
                page = self._cvm("DescribeInstances", {"Filters": filters, "Offset": offset, "Limit": PAGE})
                rows = page.get("InstanceSet") or []
                found += rows
                offset += len(rows)
                if not rows or offset >= int(page.get("TotalCount") or 0):
                    break
        return found

    def terminate(self, ids: list[str]) -> None:
        """TerminateInstances, 100 ids a call; ids already going or gone are skipped."""
        for batch in _chunks(ids, PAGE):
            try:
                self._cvm("TerminateInstances", {"InstanceIds": batch},
                          retry_codes=("UnsupportedOperation.InstanceStatePending",))
            except ApiError as exc:
                if exc.code not in ALREADY_GONE:
                    raise
                if len(batch) > 1:  # one instance spoiled the batch: the others one by one
                    for one in batch:
                        self.terminate([one])

    # --- suspend ------------------------------------------------------------------------------------------
    def suspend(self, names: list[str]) -> None:
        """Terminate this stack's machines of these nodes; nothing to do for a name without one."""
        try:
            self._clear(names)
        except (ApiError, MetadataUnavailable, OSError) as exc:
            raise Fault(f"nodes suspend: {_one_line(exc)}") from exc

    def _clear(self, names: list[str]) -> None:
        rows = [r for r in self.instances(names) if r.get("InstanceState") not in GONE]
        self.terminate([r["InstanceId"] for r in rows])
        for r in rows:
            log.info("node %s: terminating %s", _node_tag(r), r["InstanceId"])

    def resume_failed(self, names: list[str]) -> None:
        """Nodes that did not register in time: their machines are terminated, the nodes stay DOWN."""
        try:
            self.suspend(names)
        finally:
            for name in names:
                self.slurm.update_node(name, state="DOWN",
                                       reason="resume failed: not registered within ResumeTimeout")

    # --- resume -------------------------------------------------------------------------------------------
    def resume(self, names: list[str]) -> None:
        launched: dict[str, str] = {}     # node -> instance id
        failed: dict[str, str] = {}       # node -> reason
        faults: list[str] = []
        try:
            self._clear(names)  # leftovers of an earlier power cycle
            self._launch(names, launched, failed)
        except Exception as exc:  # an unexpected answer: the nodes without a machine go DOWN with it
            faults.append(_one_line(exc))
            failed.update({n: f"resume failed: {faults[0]}"[:REASON_MAX] for n in names
                           if n not in launched and n not in failed})
        addresses: dict[str, str] = {}
        if launched:
            try:
                self._wait_for_addresses(launched, failed, addresses)
            except Exception as exc:
                faults.append(_one_line(exc))
                lost = [n for n in launched if n not in addresses and n not in failed]
                failed.update({n: f"resume failed: {faults[-1]}"[:REASON_MAX] for n in lost})
                try:
                    self.terminate([launched[n] for n in lost])
                except Exception as again:  # suspend or resume-fail finds them later by their tags
                    log.error("could not terminate the machines of %s: %s", ", ".join(lost), _one_line(again))
        for name, ip in addresses.items():
            try:
                self.slurm.update_node(name, nodeaddr=ip, nodehostname=name)
                log.info("node %s: %s at %s", name, launched[name], ip)
            except Exception as exc:
                faults.append(_one_line(exc))
        for name, why in failed.items():
            log.error("node %s: %s", name, why)
            try:
                self.slurm.update_node(name, state="DOWN", reason=why)
            except Exception as exc:
                faults.append(_one_line(exc))
        if faults:
            raise Fault(f"nodes resume: {len(failed)} of {len(names)} nodes DOWN: {faults[0]}"[:300])

    def _launch(self, names: list[str], launched: dict[str, str], failed: dict[str, str]) -> None:
        for part_name, members in self._by_partition(names).items():
            part = self.partitions.get(part_name)
            if part is None:
                raise Fault(f"partition {part_name!r} of {members[0]} is not in the nodes config")
            if part.get("gang"):
                self._launch_gang(part, members, launched, failed)
                continue
            bad: dict[tuple, ApiError] = {}
            for name, index in members_with_index(members):
                try:
                    launched[name] = self._launch_one(part, name, index, bad)
                except NoCapacity as exc:
                    failed[name] = _reason_of(exc.error)

    @staticmethod
    def _by_partition(names: list[str]) -> dict[str, list[str]]:
        parts: dict[str, list[str]] = {}
        for name in names:
            parts.setdefault(name.rpartition("-")[0] or name, []).append(name)
        return parts

    def _charge(self, part: dict, index: int) -> str:
        return SPOT if part.get("spot") and index > int(part.get("on_demand_base") or 0) else ON_DEMAND

    def _choices(self, part: dict) -> list[tuple[str, str, str]]:
        """(instance type, zone, subnet) in the order tried: the partition's types in order, each in every zone."""
        zones, subnets = part.get("zones") or [], part.get("subnet_ids") or []
        if not zones or len(zones) != len(subnets):
            raise Fault(f"nodes config: a partition needs subnet_ids and their zones, one each (got {subnets} in "
                        f"{zones})")
        return [(t, z, s) for t in part["instance_types"] for z, s in zip(zones, subnets)]

    def _launch_one(self, part: dict, name: str, index: int, bad: dict, choice=None) -> str:
        """The instance id of ``name``'s machine, from the first type and zone with capacity; NoCapacity when none
        has. ``bad`` remembers the capacity errors of this resume: (type, zone, charge) and (zone, charge)."""
        charge = self._charge(part, index)
        last = None
        for itype, zone, subnet in [choice] if choice else self._choices(part):
            known = bad.get((itype, zone, charge)) or bad.get((zone, charge))
            if known:
                last = known
                continue
            try:
                return self._run(part, name, itype, zone, subnet, charge)
            except ApiError as exc:
                if not capacity(str(exc.code)):
                    raise
                log.warning("node %s: %s in %s (%s): %s", name, itype, zone, charge, exc)
                bad[(zone, charge) if exc.code in ZONE_CODES else (itype, zone, charge)] = last = exc
        raise NoCapacity(last)

    def _launch_gang(self, part: dict, members: list[str], launched: dict, failed: dict) -> None:
        """All of the batch in one type and zone, or none of it."""
        bad: dict[tuple, ApiError] = {}
        last = None
        for choice in self._choices(part):
            got: dict[str, str] = {}
            try:
                for name, index in members_with_index(members):
                    got[name] = self._launch_one(part, name, index, bad, choice)
            except NoCapacity as exc:
                last = exc.error or last
                if got:
                    log.warning("gang %s: %s in %s short; terminating %d", members[0], choice[0], choice[1], len(got))
                    self.terminate(list(got.values()))
                continue
            except Exception:
                launched.update(got)  # they get their addresses; the rest go DOWN with the fault
                raise
            launched.update(got)
            return
        for name in members:
            failed[name] = _reason_of(last)

    def _run(self, part: dict, name: str, itype: str, zone: str, subnet: str, charge: str) -> str:
        params = {
            "LaunchTemplate": {"LaunchTemplateId": part["launch_template_id"]},
            "InstanceChargeType": charge,
            "InstanceType": itype,
            "InstanceCount": 1,
            "Placement": {"Zone": zone},
            "VirtualPrivateCloud": {"VpcId": part["vpc_id"], "SubnetId": subnet},
            "InstanceName": f"gpufleet-{self.stack}-{name}",
            "TagSpecification": [{"ResourceType": "instance", "Tags": self._tags(name)}],
            "ClientToken": uuid.uuid4().hex,  # the same for the repeats of this call (call_with_backoff)
        }
        if charge == SPOT:
            spot = {"SpotInstanceType": "one-time"}
            if part.get("spot_max_price"):
                spot["MaxPrice"] = str(part["spot_max_price"])
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        if part.get("placement_set_id"):
            params["DisasterRecoverGroupIds"] = [part["placement_set_id"]]
        ids = self._cvm("RunInstances", params).get("InstanceIdSet") or []
        if len(ids) != 1:
            raise Fault(f"RunInstances for {name} answered {len(ids)} instance ids")
        log.info("node %s: launched %s (%s, %s, %s)", name, ids[0], itype, zone, charge)
        return ids[0]

    def _wait_for_addresses(self, launched: dict[str, str], failed: dict[str, str], found: dict[str, str]) -> None:
        """Fill ``found`` (node -> private IP) as DescribeInstances shows each machine's; a machine whose launch
        failed, or that shows none within ip_wait_s, is terminated and its node failed."""
        waiting = dict(launched)
        deadline = time.monotonic() + self.ip_wait_s
        while waiting:
            by_id = {}
            for batch in _chunks(list(waiting.values()), PAGE):
                rows = self._cvm("DescribeInstances", {"InstanceIds": batch, "Limit": PAGE}).get("InstanceSet") or []
                by_id.update({r["InstanceId"]: r for r in rows})
            for name, iid in list(waiting.items()):
                row = by_id.get(iid) or {}
                ips = row.get("PrivateIpAddresses") or []
                if ips:
                    found[name] = ips[0]
                    del waiting[name]
                elif row.get("InstanceState") == "LAUNCH_FAILED":
                    why = row.get("LatestOperationErrorMsg") or f"{iid} failed to start"
                    failed[name] = reason("LaunchFailed", why)
                    del waiting[name]
                    self.terminate([iid])
            if waiting and time.monotonic() >= deadline:
                for name, iid in waiting.items():
                    failed[name] = reason("Timeout", f"{iid} had no private IP after {self.ip_wait_s:g} s")
                self.terminate(list(waiting.values()))
                break
            if waiting:
                self.sleep(self.poll_s)


def members_with_index(members: list[str]):
    for name in members:
        number = name.rpartition("-")[2]
        if not number.isdigit():
            raise Fault(f"nodes resume: node name {name!r} is not <partition>-<n>")
        yield name, int(number)


def _reason_of(error: ApiError | None) -> str:
    if error is None:
        return reason("NoCapacity", "no instance type and zone to try")
    return reason(str(error.code), error_message(error))


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        return f"{exc.code}: {error_message(exc)}"
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _node_tag(row: dict) -> str | None:
    return next((t.get("Value") for t in row.get("Tags") or [] if t.get("Key") == NODE_TAG), None)


# --- on a node -------------------------------------------------------------------------------------------

def _node_api(settings: dict) -> Api:
    return Api(credentials(settings), region_of(settings))


def node_name(settings: dict, timeout_s: float = 300, *, api: Api | None = None, metadata: Metadata | None = None,
              poll_s: float = 2.0) -> str:
    """This machine's Slurm name: its instance id from the metadata service, then its ``gpufleet-slurm-node`` tag
    through DescribeInstances with the node's CAM role. The tag is what the provider set at launch and what
    suspend finds the machine by; the instance name (``gpufleet-<stack>-<node>``) is only for people (anyone
    allowed ModifyInstancesAttribute can rename an instance). Waits until the tag is there."""
    metadata = metadata or Metadata()
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    instance_id = None
    while True:
        try:
            instance_id = instance_id or metadata.get(INSTANCE_ID)
            if instance_id:
                api = api or _node_api(settings)
                rows = call_with_backoff(api, "cvm", CVM_VERSION, "DescribeInstances",
                                         {"InstanceIds": [instance_id]}, attempts=3).get("InstanceSet") or []
                name = _node_tag(rows[0]) if rows else None
                if name:
                    return name
                last = f"{instance_id} has no {NODE_TAG} tag"
            else:
                last = "the metadata service has no instance-id"
        except (MetadataUnavailable, ApiError, OSError) as exc:
            last = str(exc).splitlines()[0]
        if time.monotonic() >= deadline:
            raise Fault(f"node name: none after {timeout_s:g} s ({last})")
        time.sleep(poll_s)


def munge_key(settings: dict, create: bool = False, *, api: Api | None = None) -> bytes:
    """The stack's munge key: version ``munge-1`` of the Secrets Manager secret ``settings["slurm"]["munge"]``
    (SecretBinary, base64). The infra creates the secret with a placeholder first version ("init"); the
    controller (``create=True``) adds ``munge-1`` with 1024 random bytes when it is missing. A version, once
    there, cannot be put again (ResourceInUse.VersionIdExists): a second controller racing the first loses that
    way and reads the winner's key. Nodes only read. The key is never logged."""
    name = (settings.get("slurm") or {}).get("munge")
    if not name:
        raise Fault("munge key: settings have no slurm.munge (the secret's name); the user-data writes it")
    api = api or _node_api(settings)

    def ssm(action: str, params: dict) -> dict:
        try:
            return call_with_backoff(api, "ssm", SSM_VERSION, action, params, attempts=6)
        except (MetadataUnavailable, OSError) as exc:
            raise Fault(f"munge key: secret {name!r}: {_one_line(exc)}") from None

    def read() -> bytes | None:
        try:
            answer = ssm("GetSecretValue", {"SecretName": name, "VersionId": MUNGE_VERSION})
        except ApiError as exc:
            if exc.code == "ResourceNotFound.SecretNotExist":
                raise Fault(f"munge key: secret {name!r} does not exist (the stack creates it)") from None
            if str(exc.code).startswith("ResourceNotFound"):
                return None
            raise Fault(f"munge key: secret {name!r}: {exc.code}: {error_message(exc)}") from None
        if not answer.get("SecretBinary"):
            raise Fault(f"munge key: secret {name!r} version {MUNGE_VERSION} holds no binary value")
        return base64.b64decode(answer["SecretBinary"])

    key = read()
    if key is not None:
        return key
    if not create:
        raise Fault(f"munge key: secret {name!r} has no version {MUNGE_VERSION} yet (the controller creates it "
                    "at its first boot)")
    try:
        ssm("PutSecretValue", {"SecretName": name, "VersionId": MUNGE_VERSION,
                               "SecretBinary": base64.b64encode(os.urandom(MUNGE_BYTES)).decode()})
        log.info("munge key: stored in secret %s version %s", name, MUNGE_VERSION)
    except ApiError as exc:
        if exc.code != "ResourceInUse.VersionIdExists":
            raise Fault(f"munge key: secret {name!r}: {exc.code}: {error_message(exc)}") from None
        log.info("munge key: another controller stored it first; using that one")
    key = read()
    if key is None:
        raise Fault(f"munge key: secret {name!r} version {MUNGE_VERSION} is missing right after it was stored")
    return key
