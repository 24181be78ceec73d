"""AWS: Slurm's power saving on EC2 (the node provider), and on a node its Slurm name and the stack's munge key.

The controller's slurmctld runs ``python -m trainer nodes resume|suspend|resume-fail HOSTLIST``; with
``"provider": "aws"`` in /etc/gpufleet/nodes.json that is :class:`NodeProvider`:

- ``resume``: the names of a partition (``<partition>-<n>``) are split by purchase option (``<partition>-1`` to
  ``-<on_demand_base>`` on-demand, the rest spot when the partition's ``spot`` is true) and each batch is one EC2
  Fleet of type ``instant`` (CreateFleet: the stack's launch template, every instance type in every subnet, spot
  by price-capacity-optimized; a ``gang`` partition's batch all or nothing, one instance type in one zone). Each
  instance gets its node's name as a tag (``gpufleet-slurm-node``, and ``Name``), and Slurm its address
  (``scontrol update nodename=NAME nodeaddr=IP nodehostname=HOST``). A name that got no instance (insufficient
  capacity, a spot price, a quota, a refused request) is set DOWN with ``resume failed: <code>: <message>``, so
  Slurm requeues its job at once; the controller's heal daemon powers such a node down after a hold
  (trainer.slurm.nodes.RESUME_FAIL_HOLD_S) so that a later job may try again.
- ``suspend``: every instance of this stack tagged with one of the names is terminated.
- ``resume_failed`` (ResumeFailProgram, a node that did not register within ResumeTimeout): its instance is
  terminated and the node left DOWN with a reason the heal daemon recognises.

On a node, :func:`node_name` waits for its instance's ``gpufleet-slurm-node`` tag (DescribeTags with the node's
role) and :func:`munge_key` reads the stack's munge key from Secrets Manager (the controller creates it once).

Throttled requests are retried by botocore (standard mode, RETRY_ATTEMPTS attempts with exponential backoff); a
launch that EC2 throttled inside a fleet (an error of the response, not of the request) is tried again here up
to LAUNCH_TRIES times. Every client is made in the config's region; botocore's own ``AWS_ENDPOINT_URL`` points
them at an emulator.
"""
from __future__ import annotations

import logging
import os
import re
import time
import uuid

from trainer.clouds.aws import Imds, ImdsUnavailable, explain
from trainer.errors import Fault, UsageError
from trainer.slurm import client as slurm_client
from trainer.slurm.nodes import NodeProvider as SlurmNodeProvider

log = logging.getLogger("gpufleet.nodes")

NODE_TAG = "gpufleet-slurm-node"
STACK_TAG = "gpufleet-stack"
# "$Latest": a node launched after `pulumi up` gets what that update wrote (image, user-data) without depending
# on the template's default version being moved along (the stack sets update_default_version, but $Latest does
# not need it); what ParallelCluster's fleet manager uses too.
LAUNCH_TEMPLATE_VERSION = "$Latest"
RETRY_ATTEMPTS = 10          # botocore standard mode: about 2 minutes of backoff at worst
LAUNCH_TRIES = 3             # fleets whose launches EC2 throttled (RequestLimitExceeded in the response's Errors)
CONSISTENCY_WAIT_S = 60.0    # a new instance unknown to DescribeInstances/CreateTags a moment (eventual consistency)
LIVE_STATES = ("pending", "running", "stopping", "stopped")
REASON_MAX = 200
RESUME_FAILED = "resume failed:"
NOT_REGISTERED = f"{RESUME_FAILED} did not register within ResumeTimeout"
THROTTLED = {"RequestLimitExceeded", "Throttling", "ThrottlingException"}
# Errors of an instant fleet that mean "no capacity for this now", not a fault of the setup: the nodes are DOWN with
# the reason and the command still exits 0.
CAPACITY = {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
            "InsufficientReservedInstanceCapacity", "InsufficientCapacityOnHost", "MaxSpotInstanceCountExceeded",
            "SpotMaxPriceTooLow", "Unsupported", "UnfulfillableCapacity", "UnfulfilledCapacity"}
# An override EC2 did not try because another one failed is reported with this pair; it points at the real error.
FOLLOW_ON = ("UnfulfillableCapacity", "Failed to fulfill capacity. Please review errors in the response.")
# One version of the munge key: two controllers racing write the same version, the second is refused.
MUNGE_VERSION = "gpufleet-munge-key-0000000000000000000001"
MUNGE_MIN_BYTES = 32
NODE_NAME = re.compile(r"([a-z][a-z0-9]{0,14})-([1-9][0-9]*)\Z")
PARTITION_KEYS = ("instance_types", "launch_template_id", "subnet_ids")


def _boto_config():
    from botocore.config import Config  # lazy: AWS SDK (~0.2 s) only when used

    return Config(retries={"mode": "standard", "total_max_attempts": RETRY_ATTEMPTS})


def _code(exc: BaseException) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "") or type(exc).__name__


def _message(exc: BaseException) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Message", "") or str(exc)


def reason(code: str, message: str) -> str:
    """The DOWN reason of a node that got no machine: one line, at most REASON_MAX characters."""
    return " ".join(f"{RESUME_FAILED} {code}: {message}".split())[:REASON_MAX]


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


class _Batch:
    """Names of one partition launched with one purchase option, and what became of them."""

    def __init__(self, partition: str, option: str, names: list[str]):
        self.partition, self.option, self.names = partition, option, names
        self.launched: list[str] = []                 # every instance id its fleets returned
        self.instances: dict[str, str] = {}           # name -> instance id
        self.failed: dict[str, tuple[str, str]] = {}  # name -> (error code, DOWN reason)
        self.fault: BaseException | None = None       # an unexpected error of a request

    def fail(self, names, code: str, message: str) -> None:
        why = reason(code, message)
        self.failed.update({n: (code, why) for n in names if n not in self.failed})


class NodeProvider(SlurmNodeProvider):
    """Slurm CLOUD nodes as EC2 instances of the stack's launch template (config: /etc/gpufleet/nodes.json)."""

    def __init__(self, config: dict, slurm=slurm_client, ec2=None, sleep=time.sleep):
        if not isinstance(config, dict):
            raise UsageError("nodes: the nodes config must be a JSON object")
        missing = [k for k in ("stack", "region", "partitions") if not config.get(k)]
        if missing:
            raise UsageError(f"nodes: the nodes config lacks {', '.join(missing)}; the controller's user-data writes "
                             "stack, region, tags and partitions")
        self.config, self.slurm, self.sleep = config, slurm, sleep
        self.stack, self.region = config["stack"], config["region"]
        self.tags = {**(config.get("tags") or {}), STACK_TAG: self.stack}
        self._ec2 = ec2

    @property
    def ec2(self):
        if self._ec2 is None:
            import boto3  # lazy: AWS SDK (~0.2 s) only when used

            self._ec2 = boto3.client("ec2", region_name=self.region, config=_boto_config())
        return self._ec2

    # --- names -> batches --------------------------------------------------------------------------------------

    def partition(self, name: str) -> dict:
        part = self.config["partitions"].get(name)
        if not isinstance(part, dict):
            known = ", ".join(sorted(self.config["partitions"])) or "none"
            raise UsageError(f"nodes: partition {name!r} is not in the nodes config (partitions: {known})")
        missing = [k for k in PARTITION_KEYS if not part.get(k)]
        if missing:
            raise UsageError(f"nodes: partition {name} lacks {', '.join(missing)} in the nodes config")
        return part

    def batches(self, names: list[str]) -> list[_Batch]:
        """The names grouped by partition and purchase option, in a stable order; a name that is no node of the
        config is a UsageError (nothing is launched)."""
        groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for name in dict.fromkeys(names):
            m = NODE_NAME.match(name)
            if not m:
                raise UsageError(f"nodes: {name!r} is not a node name; expected <partition>-<n>, n from 1")
            part_name, index = m.group(1), int(m.group(2))
            part = self.partition(part_name)
            if part.get("count") and index > int(part["count"]):
                raise UsageError(f"nodes: {name} is not a node of partition {part_name} ({part['count']} nodes)")
            spot = bool(part.get("spot")) and index > int(part.get("on_demand_base") or 0)
            groups.setdefault((part_name, "spot" if spot else "on-demand"), []).append((index, name))
        return [_Batch(p, option, [n for _, n in sorted(members)])
                for (p, option), members in sorted(groups.items())]

    def fleet_request(self, batch: _Batch, count: int) -> dict:
        """CreateFleet's parameters for ``count`` instances of a batch."""
        part = self.partition(batch.partition)
        placement = {"Placement": {"GroupName": part["placement_group"]}} if part.get("placement_group") else {}
        overrides = [{"InstanceType": t, "SubnetId": s, **placement}
                     for t in part["instance_types"] for s in part["subnet_ids"]]
        tags = [{"Key": k, "Value": str(v)} for k, v in self.tags.items()]
        spot = batch.option == "spot"
        options: dict = {"AllocationStrategy": "price-capacity-optimized" if spot else "lowest-price"}
        if part.get("gang"):  # all or nothing, one instance type in one zone
            options.update(MinTargetCapacity=count, SingleInstanceType=True, SingleAvailabilityZone=True)
        return {
            "Type": "instant",
            "ClientToken": str(uuid.uuid4()),  # idempotency: botocore's retries of this request launch nothing twice
            "LaunchTemplateConfigs": [{
                "LaunchTemplateSpecification": {"LaunchTemplateId": part["launch_template_id"],
                                                "Version": LAUNCH_TEMPLATE_VERSION},
                "Overrides": overrides}],
            "TargetCapacitySpecification": {"TotalTargetCapacity": count, "DefaultTargetCapacityType": batch.option},
            "SpotOptions" if spot else "OnDemandOptions": options,
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}],
        }

    # --- power saving --------------------------------------------------------------------------------------------

    def resume(self, names: list[str]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError  # lazy: AWS SDK (~0.2 s) only when used

        batches = self.batches(names)
        try:
            stale = self.instances(names)
            if stale:
                log.warning("nodes %s: instances still there from an earlier start (%s); terminated first",
                            ", ".join(sorted(set(stale.values()))), ", ".join(sorted(stale)))
                self.terminate(sorted(stale))
        except (ClientError, BotoCoreError) as exc:
            self._down({n: reason(_code(exc), _message(exc)) for n in names})
            raise self._told(exc, "resume", names) from None
        for batch in batches:
            self._resume_batch(batch)
        self._down({n: why for b in batches for n, (_, why) in b.failed.items()})
        faulty = [b for b in batches if b.fault is not None]
        if faulty:
            raise self._told(faulty[0].fault, "resume", [n for b in faulty for n in b.names])
        odd = {n: why for b in batches for n, (code, why) in b.failed.items() if code not in CAPACITY | THROTTLED}
        if odd:
            raise Fault(f"nodes resume {', '.join(odd)}: {next(iter(odd.values()))}")

    def _resume_batch(self, batch: _Batch) -> None:
        from botocore.exceptions import BotoCoreError, ClientError  # lazy: AWS SDK (~0.2 s) only when used

        try:
            self.launch(batch)
            addresses = self.name_instances(batch)
        except (ClientError, BotoCoreError) as exc:
            batch.fault = exc
            leftover = list(dict.fromkeys(batch.launched))
            batch.instances.clear()
            batch.fail(batch.names, _code(exc), _message(exc))
            if leftover:  # launched but not named: no node could ever use them
                try:
                    self.terminate(leftover)
                except (ClientError, BotoCoreError) as again:
                    log.error("instances %s: not terminated (%s); terminate them by hand", ", ".join(leftover), again)
            return
        for name, instance in batch.instances.items():
            ip, host = addresses[instance]
            log.info("node %s: instance %s (%s) at %s", name, instance, batch.option, ip)
            try:
                self.slurm.update_node(name, nodeaddr=ip, nodehostname=host)
            except Exception as exc:  # slurmctld away a moment: slurmd's registration tells it (cloud_reg_addrs)
                log.warning("node %s: address %s not told to Slurm (%s); its registration will", name, ip, exc)

    def launch(self, batch: _Batch) -> None:
        """CreateFleet for the batch's names, again for the rest while EC2 throttles the launches (an error in the
        response, which botocore does not retry). Each instance is assigned to a name in ``batch.instances``, in
        order; the names without one are in ``batch.failed`` with EC2's error."""
        part = self.partition(batch.partition)
        ids = batch.launched
        errors: list[dict] = []
        for attempt in range(LAUNCH_TRIES):
            want = len(batch.names) - len(ids)
            resp = self.ec2.create_fleet(**self.fleet_request(batch, want))
            got = [i for inst in resp.get("Instances") or [] for i in inst.get("InstanceIds") or []]
            errors = _real_errors(resp.get("Errors") or [])
            log.info("partition %s, %s: fleet %s launched %d of %d%s", batch.partition, batch.option,
                     resp.get("FleetId", "?"), len(got), want,
                     "".join(f"; {e.get('ErrorCode')}: {e.get('ErrorMessage')}" for e in errors))
            ids.extend(got)
            if len(ids) >= len(batch.names) or not errors or attempt + 1 == LAUNCH_TRIES or \
                    any(e.get("ErrorCode") not in THROTTLED for e in errors) or (part.get("gang") and ids):
                break  # done, or not for trying again (a gang's rest could land apart from its first nodes)
            self.sleep(2.0 ** attempt)
        if part.get("gang") and 0 < len(ids) < len(batch.names):  # all or nothing: part of a gang is no use
            log.warning("partition %s: %d of %d gang nodes launched; terminated", batch.partition, len(ids),
                        len(batch.names))
            self.terminate(ids)
            ids = []
        if len(ids) > len(batch.names):
            self.terminate(ids[len(batch.names):])
        batch.instances = dict(zip(batch.names, ids))
        if len(ids) < len(batch.names):
            first = errors[0] if errors else {}
            batch.fail(batch.names[len(ids):], first.get("ErrorCode") or "UnfulfilledCapacity",
                       first.get("ErrorMessage") or f"EC2 Fleet launched {len(ids)} of {len(batch.names)}")

    def name_instances(self, batch: _Batch) -> dict[str, tuple[str, str]]:
        """Tag each instance with its node's name, then read the addresses (instance id -> (IP, host name)); a node
        whose instance has none within CONSISTENCY_WAIT_S fails and the instance is terminated."""
        for name, instance in batch.instances.items():
            tags = [{"Key": NODE_TAG, "Value": name}, {"Key": "Name", "Value": f"gpufleet-{self.stack}-{name}"}]
            self._eventually(lambda instance=instance, tags=tags:
                             self.ec2.create_tags(Resources=[instance], Tags=tags))
        addresses = self.addresses(list(batch.instances.values()))
        lost = {n: i for n, i in batch.instances.items() if i not in addresses}
        if lost:
            self.terminate(list(lost.values()))
            for name, instance in lost.items():
                del batch.instances[name]
                batch.fail([name], "NoAddress",
                           f"instance {instance} has no private IP after {CONSISTENCY_WAIT_S:g} s; terminated")
        return addresses

    def _eventually(self, call):
        """A call about an instance just launched: retried while EC2 does not know it yet."""
        from botocore.exceptions import ClientError  # lazy: AWS SDK (~0.2 s) only when used

        deadline, delay = time.monotonic() + CONSISTENCY_WAIT_S, 0.5
        while True:
            try:
                return call()
            except ClientError as exc:
                if _code(exc) != "InvalidInstanceID.NotFound" or time.monotonic() + delay > deadline:
                    raise
            self.sleep(delay)
            delay = min(delay * 2, 5.0)

    def addresses(self, ids: list[str]) -> dict[str, tuple[str, str]]:
        """Instance id -> (private IP, short private DNS name) of those that have one within CONSISTENCY_WAIT_S."""
        from botocore.exceptions import ClientError  # lazy: AWS SDK (~0.2 s) only when used

        found: dict[str, tuple[str, str]] = {}
        deadline, delay = time.monotonic() + CONSISTENCY_WAIT_S, 0.5
        while True:
            pending = [i for i in ids if i not in found]
            if not pending:
                return found
            try:
                for chunk in _chunks(pending, 200):
                    for inst in self._described(InstanceIds=chunk):
                        ip = inst.get("PrivateIpAddress")
                        if ip:
                            host = (inst.get("PrivateDnsName") or "").split(".")[0] or ip
                            found[inst["InstanceId"]] = (ip, host)
            except ClientError as exc:
                if _code(exc) != "InvalidInstanceID.NotFound":
                    raise
            if len(found) == len(ids) or time.monotonic() + delay > deadline:
                return found
            self.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _described(self, **params):
        for page in self.ec2.get_paginator("describe_instances").paginate(**params):
            for reservation in page.get("Reservations", []):
                yield from reservation.get("Instances", [])

    def instances(self, names: list[str]) -> dict[str, str]:
        """Instance id -> node name of this stack's instances (pending to stopped) tagged with one of ``names``."""
        found: dict[str, str] = {}
        for chunk in _chunks(sorted(set(names)), 100):
            for inst in self._described(Filters=[
                    {"Name": f"tag:{STACK_TAG}", "Values": [self.stack]},
                    {"Name": f"tag:{NODE_TAG}", "Values": chunk},
                    {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]):
                found[inst["InstanceId"]] = next((t["Value"] for t in inst.get("Tags") or [] if t["Key"] == NODE_TAG),
                                                 "")
        return found

    def terminate(self, ids: list[str]) -> None:
        for chunk in _chunks(list(ids), 500):
            self.ec2.terminate_instances(InstanceIds=chunk)

    def suspend(self, names: list[str]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError  # lazy: AWS SDK (~0.2 s) only when used

        try:
            held = self.instances(names)
            if held:
                self.terminate(sorted(held))
        except (ClientError, BotoCoreError) as exc:
            raise self._told(exc, "suspend", names) from None
        for instance, name in sorted(held.items(), key=lambda kv: kv[1]):
            log.info("node %s: instance %s terminated", name, instance)
        if not held:
            log.info("nodes %s: no instance to terminate", ", ".join(names))

    def resume_failed(self, names: list[str]) -> None:
        """Nodes that did not register within ResumeTimeout. Slurm 22.05 has already set them DOWN and powered
        down (reason "ResumeTimeout reached") and requeued their jobs; here their instances are terminated and the
        reason becomes one the heal daemon holds and then powers down (trainer.slurm.nodes.heal)."""
        try:
            self.suspend(names)
        finally:
            self._down({n: NOT_REGISTERED for n in names})

    # --- helpers -------------------------------------------------------------------------------------------------

    def _down(self, failed: dict[str, str]) -> None:
        for name, why in failed.items():
            log.error("node %s: DOWN: %s", name, why)
            self.slurm.update_node(name, state="DOWN", reason=why)

    def _told(self, exc: BaseException, action: str, names: list[str]) -> Exception:
        """The one line of an unexpected error (a user's setup: UsageError; else a Fault)."""
        told = explain(exc)
        if told is not None:
            return told
        listed = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        return Fault(f"nodes {action} {listed}: {_code(exc)}: {' '.join(_message(exc).split())}")


def _real_errors(errors: list[dict]) -> list[dict]:
    """A fleet's errors without the follow-on entries that only point at another error (unless that is all)."""
    real = [e for e in errors if (e.get("ErrorCode"), e.get("ErrorMessage")) != FOLLOW_ON]
    return real or errors


# --- On a node -----------------------------------------------------------------------------------------------

def node_name(settings: dict, timeout_s: float = 300, ec2=None, imds=None, poll_s: float = 2.0) -> str:
    """This instance's Slurm node name: its ``gpufleet-slurm-node`` tag, which the controller's resume sets just
    after the launch; waits up to ``timeout_s`` for it. The instance id from the metadata service."""
    imds = imds or Imds()
    deadline = time.monotonic() + timeout_s
    instance = None
    while instance is None:
        try:
            instance = imds.instance_id()
        except ImdsUnavailable as exc:
            if time.monotonic() >= deadline:
                raise Fault(f"node name: no instance id from the metadata service ({exc})") from None
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            continue
        if instance is None:
            raise Fault("node name: the metadata service has no instance-id; is this an EC2 instance?")
    if ec2 is None:
        import boto3  # lazy: AWS SDK (~0.2 s) only when used

        ec2 = boto3.client("ec2", region_name=settings.get("region") or imds.region(), config=_boto_config())
    while True:
        tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance]},
                                          {"Name": "key", "Values": [NODE_TAG]}]).get("Tags", [])
        name = next((t["Value"] for t in tags if t.get("Value")), None)
        if name:
            return name
        left = deadline - time.monotonic()
        if left <= 0:
            raise Fault(f"node name: instance {instance} has no {NODE_TAG} tag after {timeout_s:g} s (the "
                        "controller's `trainer nodes resume` tags it; see its power-saving log)")
        time.sleep(min(poll_s, left))


def munge_key(settings: dict, create: bool = False, client=None) -> bytes:
    """The stack's munge key from the Secrets Manager secret ``settings["slurm"]["munge"]`` (an ARN or a name).

    The stack creates the secret without a value. With ``create`` (the controller) a key is generated
    (os.urandom(1024)) and stored when the secret has none yet, under a fixed ClientRequestToken, so that of two
    controllers racing one writes the version and the other is refused and reads it. What the store holds is
    returned. Without ``create`` (a node) a secret with no value is a Fault. The key is never logged."""
    from botocore.exceptions import ClientError  # lazy: AWS SDK (~0.2 s) only when used

    secret = (settings.get("slurm") or {}).get("munge")
    if not secret:
        raise UsageError("munge key: the settings have no slurm.munge (the secret's ARN or name); the stack's "
                         "user-data writes it")
    if client is None:
        import boto3  # lazy: AWS SDK (~0.2 s) only when used

        client = boto3.client("secretsmanager", region_name=settings.get("region"), config=_boto_config())
    try:
        return _munge_value(secret, client.get_secret_value(SecretId=secret))
    except ClientError as exc:
        if _code(exc) != "ResourceNotFoundException":
            raise
        why = _message(exc)
    if not create:
        raise Fault(f"munge key: secret {secret} holds no key: the controller has not stored the munge key yet "
                    f"({why})")
    try:
        client.put_secret_value(SecretId=secret, SecretBinary=os.urandom(1024), ClientRequestToken=MUNGE_VERSION)
        log.info("munge key: generated and stored in %s", secret)
    except ClientError as exc:
        code = _code(exc)
        if code == "ResourceNotFoundException":
            raise Fault(f"munge key: secret {secret} does not exist ({_message(exc)}); the stack creates it") from None
        if code != "ResourceExistsException":
            raise
        log.info("munge key: another controller stored it first in %s; using that one", secret)
    return _munge_value(secret, client.get_secret_value(SecretId=secret))


def _munge_value(secret: str, resp: dict) -> bytes:
    key = resp.get("SecretBinary")
    if key is None:
        raise Fault(f"munge key: secret {secret} holds a string, not the binary key the controller stores; delete "
                    "its value (or the secret, then `pulumi up`) and let the controller generate one")
    if len(key) < MUNGE_MIN_BYTES:
        raise Fault(f"munge key: secret {secret} holds {len(key)} bytes; munge needs at least {MUNGE_MIN_BYTES}")
    return key
