"""The typed, validated stack configuration: the only reader of ``pulumi.Config``.

Two sources feed one validator, ``parse``:
- ``load()`` inside a Pulumi program (``pulumi up`` or the offline preview's mock runtime);
- ``read_stack_file()`` reads ``Pulumi.<stack>.yaml`` into the flat ``{"ns:key": value}`` map the
  Pulumi engine hands the program, which the preview installs into the mock runtime.
Every user error is a ``ConfigError`` whose message is one line: the key, the bad value, what is allowed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, model_validator

from infra import catalog, regions
from trainer.errors import UsageError
from trainer.slurm import users

NAMESPACE = "gpufleet"
KEYS = ("cloud", "mode", "instanceTypes", "nodes", "spot", "dataClassification", "allowedRegions",
        "tags", "budgetMonthlyUsd", "budgetMonthlyCny", "image", "network", "onDemandBase", "alertEmails", "alerts",
        "sshPublicKey", "pullThrough", "partitions", "controller", "teams")
# The keys one partition is made of when `partitions` is not given (today's single node group).
SINGLE_GROUP_KEYS = ("mode", "instanceTypes", "nodes", "spot", "onDemandBase")

# What each key means, in the order the docs list them: docs/stacks.md's table is generated from this
# (`python -m infra.docgen`; tests/test_docs.py fails while they differ).
KEY_DOCS = {
    'cloud': (
        '`aws`, `azure` or `tencent`'),
    'mode': (
        '`queue` (single-node jobs) or `gang` (multi-node jobs over EFA/InfiniBand, one instance type, one '
        'placement group): with `instanceTypes`, `nodes`, `spot` and `onDemandBase` the one Slurm partition '
        '`gpu`, unless `partitions` is given'),
    'instanceTypes': (
        "list; the first is primary (the nodes' shape in Slurm), the rest spot alternatives; all in the "
        'catalog (`python -m infra.catalog list`)'),
    'nodes': (
        '`{min, max}` (`desired` is still read, and ignored: Slurm powers nodes up and down), `0 <= min <= '
        'max`, `max >= 1`; the first `min` nodes never power down'),
    'spot': (
        'bool'),
    'partitions': (
        'optional list of Slurm partitions, each `{name, instanceTypes, nodes: {min, max}, spot, '
        'onDemandBase, gang}` (name: 1-15 lowercase letters and digits; its nodes are '
        "`<name>-1..<name>-<max>`; the first partition is Slurm's default); excludes `mode`, `instanceTypes`,"
        ' `nodes`, `spot` and `onDemandBase`'),
    'teams': (
        'optional list of `{name, fairShare, gpuLimit, azureGroup}` (name: 1-15 lowercase letters and digits, each '
        "once; `fairShare` a whole number >= 1, default 1; `gpuLimit` the GPUs a team's running jobs may hold "
        "together, default none; `azureGroup`, Azure only, the object id of the Entra group whose members submit "
        "the team's jobs): each team is a Slurm account in the controller's accounting (slurmdbd over "
        'MariaDB) whose fair share and GPU limit Slurm enforces; default one team, `default`. On AWS each team '
        "gets its own job queue and submit role (on Tencent a submit CAM group; on Azure the rights of its "
        "`azureGroup`), and its jobs run under its account (see "
        '[Teams](slurm.md#slurm-the-scheduler-trainerslurm-and-a-real-one-in-a-box-gpufleet-box))'),
    'controller': (
        "optional `{instanceType}`: the Slurm controller's size (default m6i.large, Standard_D2s_v5, "
        'S5.LARGE8; the sizes allowed are `CONTROLLER_TYPES` in `infra/catalog.py`)'),
    'dataClassification': (
        '`public`, `internal`, `personal` (GDPR; PIPL on Tencent) or `phi` (HIPAA; not on Tencent)'),
    'allowedRegions': (
        'list; defaults to EU regions for `personal` and `phi`, mainland China regions for `personal` on '
        'Tencent'),
    'tags': (
        'string map added to every taggable resource, with `data-classification` and `gpufleet-stack`'),
    'budgetMonthlyUsd': (
        "number > 0, AWS and Azure: the monthly budget alert and the preview's budget line"),
    'budgetMonthlyCny': (
        "number > 0, Tencent (its prices are CNY): the same, in CNY; the other currency's key is an error"),
    'image': (
        'AWS `{id: ami-...}` or `{name: <pattern>, owners: [...]}`; Azure gallery image id or marketplace '
        'URN; Tencent `{id: img-...}` or `{name: <regular expression>}` (newest private image)'),
    'network': (
        'optional, AWS: `{vpcId, subnetIds}` to use an existing VPC instead of creating one'),
    'onDemandBase': (
        "optional integer (default 0): a spot partition's first N nodes launch on-demand, the rest spot"),
    'alertEmails': (
        'optional list of addresses subscribed to budget and alarm notifications (not on Tencent: Cloud '
        "Monitor notifies CAM users and groups; add recipients to the stack's alert group)"),
    'alerts': (
        'optional list of more recipients, each one of `{email: ADDRESS}`, `{https: URL}` (an endpoint that '
        'confirms SNS subscriptions: paging and incident tools) or `{chat: URL}` (a Slack, Teams, Google Chat'
        ' or Mattermost incoming webhook; AWS only). Without any recipient the program warns `alerts reach '
        'nobody` in every preview format'),
    'sshPublicKey': (
        'Azure: the OpenSSH public key of the admin user (Azure nodes allow SSH keys only)'),
    'pullThrough': (
        'optional, AWS: ECR pull-through cache rules, a list of `{prefix, upstream, credentialSecret?}`; '
        '`upstream` one of `public.ecr.aws`, `registry.k8s.io`, `quay.io` (no credentials) or '
        '`registry-1.docker.io`, `ghcr.io`, `registry.gitlab.com`, `<name>.azurecr.io` (with '
        '`credentialSecret`: the name or ARN of a Secrets Manager secret named `ecr-pullthroughcache/…`, '
        'holding `username` and `accessToken`, created before `pulumi up`, which looks a name up); `prefix` '
        '2-30 lowercase characters, one rule per prefix. ECR has no cache for NGC (`nvcr.io`): push those '
        "images into the stack's repository"),
}
PARTITION_NAME = re.compile(r"^[a-z][a-z0-9]{0,14}\Z")  # Slurm node names are <partition>-<n>
DEFAULT_PARTITION = "gpu"
REGION_KEY = {"aws": "aws:region", "azure": "azure-native:location", "tencent": "tencentcloud:region"}
# The budget key of each cloud: its amount is in the currency of the cloud's catalog prices.
BUDGET_KEY = {"USD": "budgetMonthlyUsd", "CNY": "budgetMonthlyCny"}

EU_REGIONS = {
    "aws": ("eu-central-1", "eu-west-1", "eu-west-3", "eu-north-1", "eu-south-1", "eu-south-2"),
    "azure": ("westeurope", "northeurope", "francecentral", "francesouth", "germanywestcentral",
              "germanynorth", "swedencentral", "swedensouth", "italynorth", "polandcentral",
              "spaincentral"),
}
CLASSIFICATION_TAG = "data-classification"
# PIPL: personal information stays in mainland China by default (Hong Kong, Macao and abroad are
# cross-border transfers). Tencent Cloud's mainland regions, financial-zone regions included.
MAINLAND_CHINA_REGIONS = ("ap-beijing", "ap-shanghai", "ap-guangzhou", "ap-chengdu", "ap-chongqing",
                          "ap-nanjing", "ap-shenzhen-fsi", "ap-shanghai-fsi", "ap-beijing-fsi")
# A multi-node gang partition's VMs share InfiniBand in one availability set (Flexible scale sets have none), which
# holds at most 200 VMs and takes no spot VMs.
AZURE_AVAILABILITY_SET_MAX = 200
_SECRET = "[secret]"


class ConfigError(Exception):
    """A user error in stack configuration, told as one line."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}: {_show(value)} is not allowed; {allowed}")


def _show(value: Any) -> str:
    if value is _MISSING:
        return "missing value"
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


_MISSING = object()


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Nodes(_Frozen):
    min: StrictInt = Field(ge=0)
    max: StrictInt = Field(ge=0, le=1000)
    desired: Optional[StrictInt] = Field(default=None, ge=0)  # read before Slurm; power saving sizes the cluster now


class PartitionNodes(_Frozen):
    min: StrictInt = Field(default=0, ge=0)   # the first `min` nodes never power down
    max: StrictInt = Field(ge=1, le=1000)


class Partition(_Frozen):
    """One Slurm partition: a node group of one shape, CLOUD nodes ``<name>-1..<name>-<nodes.max>`` powered up
    when jobs need them. ``gang``: its nodes talk to each other over EFA / InfiniBand in one placement group, and
    a multi-node job's nodes start all together or not at all."""
    name: str = Field(min_length=1, max_length=15)
    instance_types: tuple[str, ...] = Field(alias="instanceTypes", min_length=1)
    nodes: PartitionNodes
    spot: StrictBool = False
    on_demand_base: StrictInt = Field(default=0, ge=0, alias="onDemandBase")
    gang: StrictBool = False

    @property
    def primary(self) -> catalog.InstanceType:
        """The partition's node shape: its first instance type (Slurm's CPUs, memory and GPUs of its nodes)."""
        return catalog.CATALOG[self.instance_types[0]]

    @property
    def multi_node(self) -> bool:
        """Nodes that talk to each other: a gang partition of more than one node."""
        return self.gang and self.nodes.max > 1


GUID = r"^[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$"  # an Entra object id (pydantic's regex: $ is the end)


class Team(_Frozen):
    """One team: a Slurm account with its fair share (how much of the cluster it gets against the others when
    they all wait) and its GPU limit (the GPUs its running jobs may hold together; none: no limit); on Azure, the
    Entra group whose members submit its jobs (none: the administrators grant the rights themselves)."""
    name: str = Field(min_length=1, max_length=15)
    fair_share: StrictInt = Field(default=1, ge=1, le=1000000, alias="fairShare")
    gpu_limit: Optional[StrictInt] = Field(default=None, ge=0, alias="gpuLimit")
    azure_group: Optional[str] = Field(default=None, alias="azureGroup", pattern=GUID)

    def as_json(self) -> dict:
        """As controller.json and trainer.slurm.accounts.teams_of take it."""
        return {"name": self.name, "fair_share": self.fair_share, "gpu_limit": self.gpu_limit}


DEFAULT_TEAMS = (Team(name="default"),)


class Controller(_Frozen):
    instance_type: Optional[str] = Field(default=None, alias="instanceType")


class AwsImage(_Frozen):
    id: Optional[str] = Field(default=None, pattern=r"^ami-[0-9a-f]{8,17}$")
    name: Optional[str] = Field(default=None, min_length=1, max_length=128)
    owners: tuple[str, ...] = ("self",)


class TencentImage(_Frozen):
    id: Optional[str] = Field(default=None, pattern=r"^img-[0-9a-z]{8}$")
    name: Optional[str] = Field(default=None, min_length=1, max_length=128)  # a regular expression


class Network(_Frozen):
    vpc_id: str = Field(alias="vpcId", pattern=r"^vpc-[0-9a-f]{8,17}$")
    subnet_ids: tuple[str, ...] = Field(alias="subnetIds", min_length=1)


# Upstream registries an ECR pull-through cache rule can name, and whether it needs a credential secret
# (Amazon ECR user guide, "Sync an upstream registry"); `<name>.azurecr.io` needs one too.
PULL_THROUGH_UPSTREAMS = {"public.ecr.aws": False, "registry.k8s.io": False, "quay.io": False,
                          "registry-1.docker.io": True, "ghcr.io": True, "registry.gitlab.com": True}
_ACR_UPSTREAM = re.compile(r"^[a-z0-9]{5,50}\.azurecr\.io\Z")
_UPSTREAM_HINTS = {"nvcr.io": "ECR has no pull-through cache for NGC (nvcr.io); push NGC images into the stack's "
                              "repository from a machine with internet access",
                   "docker.io": "Docker Hub's registry is registry-1.docker.io"}
_ECR_PREFIX = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*\Z")
PULL_THROUGH_SECRET_PREFIX = "ecr-pullthroughcache/"
_PULL_THROUGH_SECRET = re.compile(
    r"^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:)?ecr-pullthroughcache/[\w/+=.@-]{1,480}\Z")


class PullThrough(_Frozen):
    """One ECR pull-through cache rule: `<registry>/<prefix>/<image>` pulls `<upstream>/<image>`."""
    prefix: str = Field(min_length=2, max_length=30)
    upstream: str
    credential_secret: Optional[str] = Field(default=None, alias="credentialSecret")

    @property
    def needs_credentials(self) -> bool:
        return PULL_THROUGH_UPSTREAMS.get(self.upstream, True)


def _pull_through(entries: Any) -> tuple[PullThrough, ...]:
    key = "gpufleet:pullThrough"
    if not isinstance(entries, (list, tuple)):
        raise ConfigError(key, entries, "a list of {prefix, upstream, credentialSecret?}")
    rules: list[PullThrough] = []
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if isinstance(entry, PullThrough):
            entry = entry.model_dump(by_alias=True, exclude_none=True)
        if not isinstance(entry, dict):
            raise ConfigError(where, entry, "an object {prefix, upstream, credentialSecret?}")
        try:
            rule = PullThrough(**entry)
        except ValidationError as exc:
            raise _from_validation(exc, where) from None
        if not _ECR_PREFIX.match(rule.prefix) or rule.prefix == "ROOT":
            raise ConfigError(f"{where}.prefix", rule.prefix, "an ECR repository prefix: lowercase letters and "
                              "digits separated by . _ - or /, 2-30 characters")
        upstream = rule.upstream
        if upstream not in PULL_THROUGH_UPSTREAMS and not _ACR_UPSTREAM.match(upstream):
            hint = _UPSTREAM_HINTS.get(upstream.lower().removeprefix("https://"))
            raise ConfigError(f"{where}.upstream", upstream, (hint + "; " if hint else "") + "one of "
                              + ", ".join(PULL_THROUGH_UPSTREAMS) + " or <name>.azurecr.io")
        secret = rule.credential_secret
        if rule.needs_credentials and secret is None:
            raise ConfigError(f"{where}.credentialSecret", _MISSING, f"{upstream} needs credentials: the name or "
                              f"ARN of a Secrets Manager secret named {PULL_THROUGH_SECRET_PREFIX}...")
        if not rule.needs_credentials and secret is not None:
            raise ConfigError(f"{where}.credentialSecret", secret, f"{upstream} is pulled without credentials; "
                              "remove credentialSecret")
        if secret is not None and not _PULL_THROUGH_SECRET.match(secret):
            raise ConfigError(f"{where}.credentialSecret", secret, "the name (or ARN) of a Secrets Manager secret "
                              f"whose name starts with {PULL_THROUGH_SECRET_PREFIX} (ECR reads no other)")
        for other in rules:
            if f"{rule.prefix}/".startswith(f"{other.prefix}/") or f"{other.prefix}/".startswith(f"{rule.prefix}/"):
                raise ConfigError(f"{where}.prefix", rule.prefix, f"a prefix apart from '{other.prefix}' "
                                  "(each cached repository belongs to one rule)")
        rules.append(rule)
    return tuple(rules)


_AZURE_IMAGE = re.compile(
    r"^(/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/galleries/[^/]+/images/[^/]+"
    r"(/versions/[^/]+)?|[\w.-]+:[\w.-]+:[\w.-]+:[\w.-]+)$", re.IGNORECASE)
_TAG_KEY = re.compile(r"^[\w .:/=+\-@]{1,128}\Z")
_TAG_VALUE = re.compile(r"^[\w .:/=+\-@]{0,256}\Z")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+\Z")
_HTTPS_URL = re.compile(r"^https://[^\s/?#]+\.[^\s/?#]+(/\S*)?\Z")
ALERTS_NOBODY = "alerts reach nobody: set gpufleet:alertEmails (or gpufleet:alerts for HTTPS endpoints and chat webhooks)"


class Alert(_Frozen):
    """One recipient of alarms and budget alerts: exactly one of its fields."""
    email: Optional[str] = None
    https: Optional[str] = None     # an endpoint that confirms SNS subscriptions (paging and incident tools)
    chat: Optional[str] = None      # a chat incoming-webhook URL (Slack, Teams, Google Chat, Mattermost)

    @property
    def kind(self) -> str:
        return next(k for k in ("email", "https", "chat") if getattr(self, k) is not None)

    @property
    def endpoint(self) -> str:
        return getattr(self, self.kind)


class StackConfig(_Frozen):
    stack: str
    cloud: Literal["aws", "azure", "tencent"]
    region: str
    mode: Optional[Literal["queue", "gang"]] = None
    instance_types: Optional[tuple[str, ...]] = Field(default=None, alias="instanceTypes", min_length=1)
    nodes: Optional[Nodes] = None
    spot: StrictBool = False
    data_classification: Literal["public", "internal", "personal", "phi"] = Field(alias="dataClassification")
    allowed_regions: tuple[str, ...] = Field(default=(), alias="allowedRegions")
    tags: dict[str, str] = Field(default_factory=dict)
    budget_monthly_usd: Optional[float] = Field(default=None, alias="budgetMonthlyUsd", gt=0)
    budget_monthly_cny: Optional[float] = Field(default=None, alias="budgetMonthlyCny", gt=0)
    image: Any = None
    network: Optional[Network] = None
    on_demand_base: StrictInt = Field(default=0, ge=0, alias="onDemandBase")
    alert_emails: tuple[str, ...] = Field(default=(), alias="alertEmails")
    alerts: tuple[Alert, ...] = ()
    ssh_public_key: Optional[str] = Field(default=None, alias="sshPublicKey")
    pull_through: Any = Field(default=(), alias="pullThrough")
    partitions: Any = ()
    controller: Any = None
    teams: tuple[Team, ...] = DEFAULT_TEAMS

    @model_validator(mode="after")
    def _cross_checks(self) -> "StackConfig":
        object.__setattr__(self, "partitions", self._partitions())
        object.__setattr__(self, "controller", self._controller())
        self._check_budget()
        if self.cloud == "tencent" and self.data_classification == "phi":
            raise ConfigError("gpufleet:dataClassification", "phi", "public, internal or personal on tencent "
                              "(phi is this project's HIPAA class, which the tencent stack does not offer)")
        regions = self.effective_allowed_regions
        if regions and self.region not in regions:
            raise ConfigError(REGION_KEY[self.cloud], self.region,
                              f"{self.data_classification} data must stay in: {', '.join(regions)}")
        for key, value in self.tags.items():
            if not _TAG_KEY.match(key) or key.lower().startswith(("aws:", "azure", "microsoft", "windows")):
                raise ConfigError("gpufleet:tags", key, "tag keys are 1-128 letters, digits, spaces or _.:/=+-@, "
                                  "not starting with aws:, azure, microsoft or windows")
            if not _TAG_VALUE.match(value):
                raise ConfigError(f"gpufleet:tags.{key}", value, "tag values are 0-256 letters, digits, spaces or _.:/=+-@")
        if CLASSIFICATION_TAG in self.tags:
            raise ConfigError(f"gpufleet:tags.{CLASSIFICATION_TAG}", self.tags[CLASSIFICATION_TAG],
                              "set by gpufleet:dataClassification; remove this tag")
        for email in self.alert_emails:
            if not _EMAIL.match(email):
                raise ConfigError("gpufleet:alertEmails", email, "an e-mail address such as ops@example.com")
        self._check_alerts()
        self._check_teams()
        self._check_image()
        object.__setattr__(self, "pull_through", _pull_through(self.pull_through))
        if self.cloud == "azure":
            if not self.ssh_public_key or not self.ssh_public_key.startswith(("ssh-rsa ", "ssh-ed25519 ", "ecdsa-")):
                raise ConfigError("gpufleet:sshPublicKey", self.ssh_public_key or _MISSING,
                                  "an OpenSSH public key (ssh-ed25519 ... or ssh-rsa ...); Azure nodes allow SSH keys only")
            for i, part in enumerate(self.partitions):
                if len(part.instance_types) > 1:
                    raise ConfigError(self._key(i, "instanceTypes"), list(part.instance_types),
                                      "one size on azure (the node provider creates a partition's VMs of one size)")
                if part.multi_node and part.spot:
                    raise ConfigError(self._key(i, "spot"), True, "false for a gang partition on azure (its nodes "
                                      "share InfiniBand in an availability set, which takes no spot VMs)")
                if part.multi_node and part.nodes.max > AZURE_AVAILABILITY_SET_MAX:
                    raise ConfigError(self._key(i, "nodes"), part.nodes.model_dump(), f"max at most "
                                      f"{AZURE_AVAILABILITY_SET_MAX} on azure for a gang partition (one availability "
                                      "set, one InfiniBand fabric)")
        if self.cloud != "aws" and self.network is not None:
            raise ConfigError("gpufleet:network", self.network.model_dump(by_alias=True),
                              "an existing network is supported on aws only")
        if self.cloud == "tencent":
            for key, value in self.tags.items():
                if len(key) > 127 or len(value) > 255 or key.lower().startswith(("qcloud", "tencent", "project")):
                    raise ConfigError("gpufleet:tags", key, "on tencent tag keys are at most 127 characters, not "
                                      "starting with qcloud, tencent or project, and values at most 255")
        if self.cloud == "tencent" and self.alert_emails:
            raise ConfigError("gpufleet:alertEmails", list(self.alert_emails),
                              "not on tencent: Cloud Monitor notifies CAM users and groups, not addresses; "
                              "add the recipients to the stack's alert group (output alertGroup)")
        if self.cloud != "aws" and self.pull_through:
            raise ConfigError("gpufleet:pullThrough", [r.model_dump(by_alias=True, exclude_none=True)
                                                       for r in self.pull_through],
                              "pull-through caches are ECR rules, aws only (on azure, `az acr import` "
                              "images into the stack's registry)")
        if self.cloud == "tencent" and self.alerts:
            raise ConfigError("gpufleet:alerts", [a.model_dump(exclude_none=True) for a in self.alerts],
                              "not on tencent: Cloud Monitor notifies CAM users and groups; add the recipients "
                              "to the stack's alert group (output alertGroup)")
        return self

    def _key(self, i: int, key: str) -> str:
        """The config key a partition's setting came from: gpufleet:partitions[i].key, or today's top-level key."""
        return f"gpufleet:partitions[{i}].{key}" if self._given_partitions() else f"gpufleet:{key}"

    def _given_partitions(self) -> bool:
        return "partitions" in self.model_fields_set

    def _partitions(self) -> tuple[Partition, ...]:
        """The stack's partitions: `partitions`, or one partition "gpu" from today's keys (instanceTypes, nodes,
        spot, onDemandBase, mode; gang mode makes it a gang partition). Each is checked against the catalog."""
        given = {f.alias or name for name, f in type(self).model_fields.items() if name in self.model_fields_set}
        if self._given_partitions():
            entries = self.partitions
            if not isinstance(entries, (list, tuple)) or not entries:
                raise ConfigError("gpufleet:partitions", entries, "a non-empty list of {name, instanceTypes, "
                                  "nodes: {min, max}, spot, onDemandBase, gang}")
            mixed = [k for k in SINGLE_GROUP_KEYS if k in given]
            if mixed:
                raise ConfigError(f"gpufleet:{mixed[0]}", getattr(self, _KEY_TO_FIELD[mixed[0]]),
                                  "set partitions or the single group's keys (" + ", ".join(SINGLE_GROUP_KEYS) +
                                  "), not both; move it into a partition")
            parts = []
            for i, entry in enumerate(entries):
                if isinstance(entry, Partition):
                    entry = entry.model_dump(by_alias=True)
                if not isinstance(entry, dict):
                    raise ConfigError(f"gpufleet:partitions[{i}]", entry, "an object {name, instanceTypes, nodes, "
                                      "spot, onDemandBase, gang}")
                try:
                    parts.append(Partition(**entry))
                except ValidationError as exc:
                    raise _from_validation(exc, f"gpufleet:partitions[{i}]") from None
        else:
            for key in ("mode", "instanceTypes", "nodes"):
                if key not in given or getattr(self, _KEY_TO_FIELD[key]) is None:
                    raise ConfigError(f"gpufleet:{key}", _MISSING, "this key is required (or give partitions)")
            n = self.nodes
            desired = n.min if n.desired is None else n.desired
            if not n.min <= desired <= n.max:
                raise ConfigError("gpufleet:nodes", n.model_dump(exclude_none=True), "needs 0 <= min <= desired <= max")
            if n.max == 0:
                raise ConfigError("gpufleet:nodes", n.model_dump(exclude_none=True), "max must be at least 1")
            parts = [Partition(name=DEFAULT_PARTITION, instanceTypes=self.instance_types,
                               nodes=PartitionNodes(min=n.min, max=n.max), spot=self.spot,
                               onDemandBase=self.on_demand_base, gang=self.mode == "gang")]
        names = [p.name for p in parts]
        for i, part in enumerate(parts):
            self._check_partition(i, part)
            if part.name in names[:i]:
                raise ConfigError(self._key(i, "name"), part.name, "each partition name once")
        total = sum(p.nodes.max for p in parts)
        if total > MAX_NODES:
            raise ConfigError("gpufleet:partitions", total, f"at most {MAX_NODES} nodes in all partitions")
        if self._given_partitions():  # today's readers of the single group see the first partition
            first = parts[0]
            object.__setattr__(self, "mode", "gang" if first.gang else "queue")
            object.__setattr__(self, "instance_types", first.instance_types)
            object.__setattr__(self, "nodes", Nodes(min=first.nodes.min, max=first.nodes.max))
            object.__setattr__(self, "spot", first.spot)
            object.__setattr__(self, "on_demand_base", first.on_demand_base)
        return tuple(parts)

    def _check_partition(self, i: int, part: Partition) -> None:
        if not PARTITION_NAME.match(part.name):
            raise ConfigError(self._key(i, "name"), part.name, "1-15 lowercase letters and digits, starting with a "
                              "letter (Slurm names its nodes <partition>-<n>)")
        n = part.nodes
        if n.min > n.max:
            raise ConfigError(self._key(i, "nodes"), n.model_dump(), "needs 0 <= min <= max")
        for name in part.instance_types:
            row = catalog.CATALOG.get(name)
            if row is None or row.cloud != self.cloud:
                raise ConfigError(self._key(i, "instanceTypes"), name,
                                  f"allowed for {self.cloud}: {', '.join(catalog.names(self.cloud))}")
        if len(set(part.instance_types)) != len(part.instance_types):
            raise ConfigError(self._key(i, "instanceTypes"), list(part.instance_types), "each type at most once")
        if part.gang and n.max > 1:
            if not part.primary.rdma and self.cloud != "tencent":  # Tencent: NCCL over TCP
                fabric = "EFA" if self.cloud == "aws" else "InfiniBand"
                raise ConfigError(self._key(i, "instanceTypes"), part.primary.name,
                                  f"gang mode with more than one node needs an {fabric} type")
            if len(part.instance_types) > 1:
                raise ConfigError(self._key(i, "instanceTypes"), list(part.instance_types),
                                  "gang mode uses one instance type (NCCL needs identical nodes)")
        if part.on_demand_base > n.max:
            raise ConfigError(self._key(i, "onDemandBase"), part.on_demand_base, f"at most nodes.max ({n.max})")

    def _controller(self) -> Controller:
        raw = self.controller if self.controller is not None else {}
        if isinstance(raw, Controller):
            raw = raw.model_dump(by_alias=True, exclude_none=True)
        if not isinstance(raw, dict):
            raise ConfigError("gpufleet:controller", raw, "an object {instanceType}")
        try:
            ctl = Controller(**raw)
        except ValidationError as exc:
            raise _from_validation(exc, "gpufleet:controller") from None
        allowed = catalog.controller_types(self.cloud)
        if ctl.instance_type is None:
            return Controller(instanceType=allowed[0])
        if ctl.instance_type not in allowed:
            raise ConfigError("gpufleet:controller.instanceType", ctl.instance_type,
                              f"allowed for {self.cloud}: {', '.join(allowed)}")
        return ctl

    def _check_alerts(self) -> None:
        for i, alert in enumerate(self.alerts):
            key = f"gpufleet:alerts.{i}"
            given = alert.model_dump(exclude_none=True)
            if len(given) != 1:
                raise ConfigError(key, given, "exactly one of email, https or chat")
            if alert.email is not None and not _EMAIL.match(alert.email):
                raise ConfigError(f"{key}.email", alert.email, "an e-mail address such as ops@example.com")
            for kind in ("https", "chat"):
                url = getattr(alert, kind)
                if url is not None and not _HTTPS_URL.match(url):
                    raise ConfigError(f"{key}.{kind}", url, "an https:// URL")
            if alert.chat is not None and self.cloud == "azure":
                raise ConfigError(f"{key}.chat", alert.chat, "chat webhooks are supported on aws; on azure give an "
                                  "https endpoint (autoscale notifications post their own JSON)")

    def _check_teams(self) -> None:
        names = [t.name for t in self.teams]
        if not names:
            raise ConfigError("gpufleet:teams", [], "at least one team {name, fairShare, gpuLimit} (or leave the key "
                              "out: one team, default)")
        for i, name in enumerate(names):
            if not PARTITION_NAME.match(name):
                raise ConfigError(f"gpufleet:teams.{i}.name", name, "1-15 lowercase letters and digits, starting with "
                                  "a letter (a team is a Slurm account of that name)")
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError("gpufleet:teams", repeated, "each team name once")
        for i, team in enumerate(self.teams):
            if team.azure_group and self.cloud != "azure":
                raise ConfigError(f"gpufleet:teams.{i}.azureGroup", team.azure_group,
                                  f"only an Azure stack's teams have an Entra group; this stack is on {self.cloud}")
        try:
            users.check_ids(names)  # each team's jobs run as a Unix user whose uid hashes its name
        except UsageError as exc:
            raise ConfigError("gpufleet:teams", names, str(exc)) from None

    def _check_budget(self) -> None:
        wanted = BUDGET_KEY[self.currency]
        given = {key: getattr(self, f"budget_monthly_{cur.lower()}") for cur, key in BUDGET_KEY.items()}
        for key, value in given.items():
            if key != wanted and value is not None:
                raise ConfigError(f"gpufleet:{key}", value,
                                  f"{self.cloud} prices are in {self.currency}: set gpufleet:{wanted} instead")
        if given[wanted] is None:
            raise ConfigError(f"gpufleet:{wanted}", _MISSING, f"the monthly budget in {self.currency}, a number > 0")

    def _check_image(self) -> None:
        if self.cloud == "tencent":
            if not isinstance(self.image, dict):
                raise ConfigError("gpufleet:image", self.image if self.image is not None else _MISSING,
                                  "an object {id: img-...} or {name: <image name regular expression>}")
            try:
                image = TencentImage(**self.image)
            except ValidationError as exc:
                raise _from_validation(exc, "gpufleet:image") from None
            if (image.id is None) == (image.name is None):
                raise ConfigError("gpufleet:image", self.image, "exactly one of id or name")
            object.__setattr__(self, "image", image)
        elif self.cloud == "aws":
            if not isinstance(self.image, dict):
                raise ConfigError("gpufleet:image", self.image if self.image is not None else _MISSING,
                                  "an object {id: ami-...} or {name: <AMI name pattern>}")
            try:
                image = AwsImage(**self.image)
            except ValidationError as exc:
                raise _from_validation(exc, "gpufleet:image") from None
            if (image.id is None) == (image.name is None):
                raise ConfigError("gpufleet:image", self.image, "exactly one of id or name")
            object.__setattr__(self, "image", image)
        else:
            if not isinstance(self.image, str) or not _AZURE_IMAGE.match(self.image):
                raise ConfigError("gpufleet:image", self.image if self.image is not None else _MISSING,
                                  "a gallery image id (/subscriptions/.../galleries/.../images/...) "
                                  "or a marketplace URN publisher:offer:sku:version")

    # --- derived values -----------------------------------------------------------------------
    @property
    def primary(self) -> catalog.InstanceType:
        """The first partition's node shape."""
        return self.partitions[0].primary

    @property
    def controller_type(self) -> catalog.ControllerType:
        return catalog.CONTROLLER_TYPES[self.controller.instance_type]

    @property
    def currency(self) -> str:
        """The currency of the cloud's prices, of the cost estimate and of the budget."""
        return catalog.CURRENCY[self.cloud]

    @property
    def budget_monthly(self) -> float:
        """The monthly budget in ``currency``."""
        return self.budget_monthly_cny if self.currency == "CNY" else self.budget_monthly_usd

    @property
    def effective_allowed_regions(self) -> tuple[str, ...]:
        if self.allowed_regions:
            return self.allowed_regions
        if self.data_classification in ("personal", "phi"):
            return MAINLAND_CHINA_REGIONS if self.cloud == "tencent" else EU_REGIONS[self.cloud]
        return ()

    @property
    def all_tags(self) -> dict[str, str]:
        return {**self.tags, CLASSIFICATION_TAG: self.data_classification, "gpufleet-stack": self.stack}

    @property
    def alert_targets(self) -> tuple[Alert, ...]:
        """Every recipient of alarms and budget alerts: `alertEmails` first, then `alerts`, each once."""
        targets = [Alert(email=e) for e in self.alert_emails] + list(self.alerts)
        return tuple(dict.fromkeys(targets))

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the program tells the user (under `pulumi up` and in every preview format)."""
        if self.cloud == "tencent":  # Cloud Monitor notifies the stack's CAM alert group, whose members are set there
            return ()
        return () if self.alert_targets else (ALERTS_NOBODY,)

    @property
    def multi_node(self) -> bool:
        """Some partition's nodes talk to each other (EFA / InfiniBand, node-to-node traffic)."""
        return any(p.multi_node for p in self.partitions)

    @property
    def all_gang(self) -> bool:
        """Every partition is a gang partition: the stack needs one subnet (one AZ, one placement group)."""
        return all(p.gang for p in self.partitions)


# --- parsing -------------------------------------------------------------------------------------

_PYDANTIC_ALLOWED = {
    "literal_error": lambda e: "allowed: " + e["ctx"]["expected"].replace("'", ""),
    "int_type": lambda e: "an integer",
    "bool_type": lambda e: "true or false",
    "float_parsing": lambda e: "a number",
    "float_type": lambda e: "a number",
    "string_type": lambda e: "a string",
    "dict_type": lambda e: "an object (map)",
    "tuple_type": lambda e: "a list",
    "greater_than": lambda e: f"a number > {e['ctx']['gt']}",
    "greater_than_equal": lambda e: f"a number >= {e['ctx']['ge']}",
    "less_than_equal": lambda e: f"a number <= {e['ctx']['le']}",
    "too_short": lambda e: f"at least {e['ctx']['min_length']} item(s)",
    "string_too_short": lambda e: f"at least {e['ctx']['min_length']} character(s)",
    "string_too_long": lambda e: f"at most {e['ctx']['max_length']} characters",
    "string_pattern_mismatch": lambda e: f"a value matching {e['ctx']['pattern']}",
    "missing": lambda e: "this key is required",
    "extra_forbidden": lambda e: "unknown key",
}
_FIELD_TO_KEY = {}
_KEY_TO_FIELD = {}
MAX_NODES = 1000


def _from_validation(exc: ValidationError, prefix: str = NAMESPACE) -> ConfigError:
    err = exc.errors(include_url=False)[0]
    if isinstance(err.get("ctx", {}).get("error"), ConfigError):
        return err["ctx"]["error"]
    loc = [str(p) for p in err["loc"]]
    if prefix == NAMESPACE and loc:
        key = f"{NAMESPACE}:{_FIELD_TO_KEY.get(loc[0], loc[0])}" + "".join(f".{p}" for p in loc[1:])
    else:
        key = prefix + "".join(f".{p}" for p in loc)
    hint = _PYDANTIC_ALLOWED.get(err["type"], lambda e: e["msg"])(err)
    value = err.get("input", _MISSING) if err["type"] != "missing" else _MISSING
    return ConfigError(key, value, hint)


for _name, _field in StackConfig.model_fields.items():
    _FIELD_TO_KEY[_name] = _field.alias or _name
    _KEY_TO_FIELD[_field.alias or _name] = _name


def _decode(value: Any) -> Any:
    """Pulumi hands structured config as JSON text; plain strings stay strings."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def parse(raw: dict[str, Any], stack: str, secret_keys: frozenset[str] = frozenset()) -> StackConfig:
    """Validate a flat ``{"ns:key": value}`` config map; raise ConfigError (one line) on bad input."""
    values: dict[str, Any] = {"stack": stack}
    for full_key, value in raw.items():
        ns, _, key = full_key.partition(":")
        if ns != NAMESPACE:
            continue
        if key not in KEYS:
            raise ConfigError(full_key, _SECRET if full_key in secret_keys else value,
                              f"known keys: {', '.join(KEYS)}")
        values[key] = _decode(value)
    cloud = values.get("cloud")
    if cloud in REGION_KEY:
        region = raw.get(REGION_KEY[cloud])
        if not region:
            example = {"aws": "eu-west-1", "azure": "westeurope", "tencent": "ap-shanghai"}[cloud]
            raise ConfigError(REGION_KEY[cloud], _MISSING, f"set the provider region, e.g. {example}")
        values["region"] = _decode(region)
        problem = regions.check(cloud, values["region"]) if isinstance(values["region"], str) else None
        if problem:
            raise ConfigError(REGION_KEY[cloud], values["region"], problem)
    try:
        return StackConfig(**values)
    except (ConfigError, ValidationError) as exc:
        err = exc if isinstance(exc, ConfigError) else _from_validation(exc)
        if err.key.split(".")[0] in secret_keys:
            raise ConfigError(err.key, _SECRET, err.allowed) from None
        raise err from None


def read_stack_file(path: str | Path) -> tuple[dict[str, Any], frozenset[str]]:
    """Read a Pulumi stack file into (``{"ns:key": value}``, secret keys). Secure values stay opaque."""
    import yaml  # lazy: yaml (~15 ms) off gpufleet's start-up

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("--config-file", str(path), f"a readable Pulumi stack file ({exc.strerror})") from None
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError("--config-file", str(path), f"valid YAML (parse error{where})") from None
    config = doc.get("config", {}) if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f"{path.name}: config", config, "a map of namespace:key to values")
    secrets = frozenset(k for k, v in config.items() if isinstance(v, dict) and set(v) == {"secure"})
    return config, secrets


def to_engine_config(raw: dict[str, Any]) -> dict[str, str]:
    """The config map as the Pulumi engine passes it to a program: every value a string, objects as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}


def load() -> StackConfig:
    """Read and validate this stack's config from the Pulumi runtime (inside a Pulumi program)."""
    import pulumi  # lazy: pulumi (~0.3 s), only in the Pulumi program, off gpufleet's start-up
    from pulumi.runtime import config as runtime_config

    # The engine passes config in PULUMI_CONFIG; the mock runtime (offline preview) sets CONFIG.
    engine = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret_keys = frozenset(runtime_config.get_config_secret_keys_env()) | frozenset(
        k for k in engine if runtime_config.is_config_secret(k))
    raw = {k: v for k, v in engine.items() if k.startswith(NAMESPACE + ":")}
    for key in REGION_KEY.values():
        ns, _, name = key.partition(":")
        value = pulumi.Config(ns).get(name)
        if value is not None:
            raw[key] = value
    return parse(raw, pulumi.get_stack(), secret_keys)
