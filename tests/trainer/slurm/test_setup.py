"""`python -m trainer setup node|controller` (trainer.slurm.setup) under a temporary root: the files it writes, with
their modes, owners and contents; links planted where root writes are never followed; the units started, in order;
bad settings and a missing munge user are one line.

The cloud (node_name, munge_key) is a fake adapter; systemctl and chown are recorders (chown also really chowns
when the tests run as root, as they do here and in CI); users are looked up through an injected table, so no
munge or slurm user needs to exist on the test machine.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import trainer.__main__ as trainer_main
from trainer.errors import Fault, UsageError
from trainer.slurm import setup, users

ROOT = Path(__file__).resolve().parents[3]
KEY = bytes(range(256)) * 4  # 1024 bytes, as the controller generates
MUNGE, SLURM, JOBS = (4242, 4243), (4250, 4251), (4260, 4261)
TEAMS_GID = 4270
SLURM_OBJECT = {"controller_addr": "10.0.0.10", "controller_port": 6817,
                "munge": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:gpufleet-dev-munge-AbCdEf"}
NODE = {"cloud": "aws", "stack": "dev", "region": "eu-west-1", "slurm": SLURM_OBJECT}
CONTROLLER = {"cloud": "aws", "stack": "dev", "region": "eu-west-1", "bucket": "gpufleet-dev-data",
              "queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/gpufleet-dev-jobs",
              "slurm": SLURM_OBJECT, "partition": "gpu", "gpus": 8, "instance_type": "p5.48xlarge",
              "state_dir": "/shared/slurm/state", "shared": {"home": "/home", "fs": "fs-0123456789abcdef0"},
              "teams": [{"name": "vision", "fair_share": 2, "gpu_limit": None},
                        {"name": "nlp", "fair_share": 1, "gpu_limit": 8}]}


class FakeCloud:
    """adapter(cloud) as setup sees it: node_name and munge_key, recording what they were asked."""

    def __init__(self, name: str = "gpu-3", key: bytes = KEY):
        self.name, self.key, self.asked = name, key, []

    def node_name(self, settings: dict) -> str:
        self.asked.append(("node_name", settings))
        return self.name

    def munge_key(self, settings: dict, create: bool = False) -> bytes:
        self.asked.append(("munge_key", settings, create))
        return self.key


class Machine:
    """An injected System's recorders."""

    def __init__(self, root: Path, cloud: FakeCloud, users: dict | None = None):
        self.root, self.cloud = root, cloud
        self.users = {"munge": MUNGE, "slurm": SLURM, "gpufleet": JOBS} if users is None else users
        self.groups = {"gpufleet-teams": TEAMS_GID}
        self.systemctl_calls: list[list[str]] = []
        self.chowns: list[tuple[str, int, int]] = []
        self.key_at_first_start: bytes | None = None
        self.commands: list[tuple[list[str], str | None]] = []
        self.refusals: dict[str, int] = {}  # a command's first word -> how many times it fails before it answers

    def command(self, argv: list[str], input: str | None = None) -> str:
        self.commands.append((list(argv), input))
        if self.refusals.get(argv[0]):
            self.refusals[argv[0]] -= 1
            raise Fault(f"{argv[0]}: not answering yet")
        return ""  # MariaDB's client prints nothing; sacctmgr shows no cluster and no association yet

    def systemctl(self, args: list[str]) -> None:
        if not self.systemctl_calls:
            key = self.root / "etc/munge/munge.key"
            self.key_at_first_start = key.read_bytes() if key.exists() else None
        self.systemctl_calls.append(list(args))

    def chown(self, fd: int, uid: int, gid: int) -> None:
        self.chowns.append((os.readlink(f"/proc/self/fd/{fd}"), uid, gid))
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)

    def user(self, name: str) -> tuple[int, int]:
        if name not in self.users:
            return setup._user("gpufleet-no-such-user-" + name)  # the real lookup's one-line Fault
        return self.users[name]

    def group(self, name: str) -> int:
        return self.groups[name]

    def accounts(self) -> tuple[dict, dict]:
        """The machine's users and groups as trainer.slurm.users.plan reads them: none of the teams' yet."""
        return {n: (*ids, frozenset()) for n, ids in self.users.items()}, dict(self.groups)

    def ran(self, *programs: str) -> list[list[str]]:
        return [argv for argv, _ in self.commands if argv[0] in programs]

    def system(self) -> setup.System:
        return setup.System(root=self.root, systemctl=self.systemctl, chown=self.chown, user=self.user,
                            group=self.group, accounts=self.accounts, adapter=lambda cloud: self.cloud,
                            command=self.command, sleep=lambda s: None)


@pytest.fixture
def machine(tmp_path) -> Machine:
    root = tmp_path / "root"
    root.mkdir()
    return Machine(root, FakeCloud())


def write_json(root: Path, path: str, doc) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return target


def run(machine: Machine, role: str, *extra: str) -> int:
    return setup.main([role, "--root", str(machine.root), *extra], machine.system())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def owned(path: Path, owner: tuple[int, int]) -> bool:
    st = path.lstat()
    return os.geteuid() != 0 or (st.st_uid, st.st_gid) == owner


# --- node -------------------------------------------------------------------------------------------------------

def test_node_writes_the_key_and_slurmd_options_then_starts_munge_slurmd_and_its_watcher(machine):
    write_json(machine.root, "/etc/gpufleet/node.json", NODE)
    assert run(machine, "node") == 0

    key = machine.root / "etc/munge/munge.key"
    assert key.read_bytes() == KEY
    assert stat.S_ISREG(key.lstat().st_mode) and mode(key) == 0o400 and owned(key, MUNGE)
    assert mode(key.parent) == 0o700 and owned(key.parent, MUNGE)
    assert sorted(p.name for p in key.parent.iterdir()) == ["munge.key"]  # no temporary file left
    assert (str(key.parent.resolve()), *MUNGE) in machine.chowns
    assert (str(key.parent.resolve() / ".munge.key.tmp"), *MUNGE) in machine.chowns

    defaults = machine.root / "etc/default/slurmd"
    assert defaults.read_text().splitlines()[-1] == 'SLURMD_OPTIONS="-N gpu-3 --conf-server 10.0.0.10:6817"'
    assert all(line.startswith("#") for line in defaults.read_text().splitlines()[:-1])
    assert mode(defaults) == 0o644
    metrics = machine.root / "var/log/gpufleet/metrics.log"  # the teams' users append their metrics, none reads
    assert metrics.read_bytes() == b"" and mode(metrics) == 0o620 and owned(metrics, (0, TEAMS_GID))
    assert mode(metrics.parent) == 0o755 and owned(metrics.parent, (0, 0))
    # node.json names no team: the one team, default, its user made, and its own work and output directories
    uid = users.uid_of("default")
    assert machine.ran("groupadd", "useradd", "usermod") == [  # the image made gpufleet-teams
        ["groupadd", "--gid", str(uid), "gpufleet-default"],
        ["useradd", "--uid", str(uid), "--gid", str(uid), "--groups", "gpufleet-teams", "--no-create-home",
         "--home-dir", "/var/lib/gpufleet/teams/default", "--shell", "/usr/sbin/nologin", "gpufleet-default"]]
    for d in ("var/lib/gpufleet/teams/default", "var/log/gpufleet/jobs/default"):
        assert mode(machine.root / d) == 0o700 and owned(machine.root / d, (uid, uid))
        assert (str((machine.root / d).resolve()), uid, uid) in machine.chowns

    assert machine.systemctl_calls == [["restart", "munge.service"], ["restart", "slurmd.service"],
                                       ["start", "gpufleet-watch@gpu-3.service"]]
    assert machine.key_at_first_start == KEY  # the key is in place before munge starts
    assert machine.cloud.asked == [("node_name", NODE), ("munge_key", NODE, False)]  # a node only reads


def test_a_node_makes_each_team_of_node_json_a_user_and_leaves_one_it_has_alone(machine):
    write_json(machine.root, "/etc/gpufleet/node.json", {**NODE, "teams": ["vision", "nlp"]})
    vision = users.uid_of("vision")
    machine.users["gpufleet-vision"] = (vision, vision)  # a second boot: vision's user is there, not in the group
    machine.groups["gpufleet-vision"] = vision
    assert run(machine, "node") == 0
    nlp = users.uid_of("nlp")
    assert machine.ran("groupadd", "useradd", "usermod") == [
        ["usermod", "--append", "--groups", "gpufleet-teams", "gpufleet-vision"],
        ["groupadd", "--gid", str(nlp), "gpufleet-nlp"],
        ["useradd", "--uid", str(nlp), "--gid", str(nlp), "--groups", "gpufleet-teams", "--no-create-home",
         "--home-dir", "/var/lib/gpufleet/teams/nlp", "--shell", "/usr/sbin/nologin", "gpufleet-nlp"]]
    assert sorted(p.name for p in (machine.root / "var/lib/gpufleet/teams").iterdir()) == ["nlp", "vision"]
    assert sorted(p.name for p in (machine.root / "var/log/gpufleet/jobs").iterdir()) == ["nlp", "vision"]


def test_a_teams_user_held_with_another_uid_stops_the_node_before_slurmd_starts(machine):
    write_json(machine.root, "/etc/gpufleet/node.json", {**NODE, "teams": ["vision"]})
    machine.users["gpufleet-vision"] = (1001, 1001)
    with pytest.raises(Fault) as err:
        run(machine, "node")
    assert str(err.value) == f"users: user gpufleet-vision is uid 1001 gid 1001; expected {users.uid_of('vision')} " \
                             f"{users.uid_of('vision')}"
    assert ["restart", "slurmd.service"] not in machine.systemctl_calls


def test_node_json_elsewhere_and_an_ipv6_controller(machine, tmp_path):
    node = {**NODE, "slurm": {**SLURM_OBJECT, "controller_addr": "fd00:10::a", "controller_port": 7817}}
    path = write_json(tmp_path, "/elsewhere/node.json", node)
    assert run(machine, "node", "--node-json", str(path)) == 0
    assert (machine.root / "etc/default/slurmd").read_text().splitlines()[-1] == (
        'SLURMD_OPTIONS="-N gpu-3 --conf-server [fd00:10::a]:7817"')


def test_a_second_boot_replaces_the_files(machine):
    write_json(machine.root, "/etc/gpufleet/node.json", NODE)
    run(machine, "node")
    machine.cloud.key = bytes(reversed(KEY))
    machine.cloud.name = "gpu-12"
    run(machine, "node")
    assert (machine.root / "etc/munge/munge.key").read_bytes() == bytes(reversed(KEY))
    assert "-N gpu-12 " in (machine.root / "etc/default/slurmd").read_text()


@pytest.mark.parametrize("planted", ["munge.key", ".munge.key.tmp"])
def test_a_link_planted_at_the_key_or_its_temporary_name_is_not_followed(machine, tmp_path, planted):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    munge_dir = machine.root / "etc/munge"
    munge_dir.mkdir(parents=True)
    (munge_dir / planted).symlink_to(victim)
    write_json(machine.root, "/etc/gpufleet/node.json", NODE)

    assert run(machine, "node") == 0
    assert victim.read_text() == "precious\n" and mode(victim) == 0o644
    assert not victim.is_symlink() and (victim.lstat().st_uid, victim.lstat().st_gid) != MUNGE
    key = munge_dir / "munge.key"
    assert not key.is_symlink() and key.read_bytes() == KEY and mode(key) == 0o400
    assert sorted(p.name for p in munge_dir.iterdir()) == ["munge.key"]


def test_a_linked_key_directory_is_refused_in_one_line(machine, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (machine.root / "etc").mkdir()
    (machine.root / "etc/munge").symlink_to(elsewhere)
    write_json(machine.root, "/etc/gpufleet/node.json", NODE)
    with pytest.raises(Fault) as err:
        run(machine, "node")
    assert str(err.value) == ("setup: /etc/munge: munge is a symbolic link or not a directory; refusing to "
                              "follow it")
    assert list(elsewhere.iterdir()) == [] and machine.systemctl_calls == []


def test_a_name_that_is_not_a_slurm_node_name_is_refused(machine):
    machine.cloud.name = "gpu-3 --conf-server evil:1"
    write_json(machine.root, "/etc/gpufleet/node.json", NODE)
    with pytest.raises(Fault, match=r"^setup node: this machine's Slurm name 'gpu-3 --conf-server evil:1' is not "
                                    r"<partition>-<n>; check its gpufleet-slurm-node tag$"):
        run(machine, "node")
    assert not (machine.root / "etc/default/slurmd").exists() and machine.systemctl_calls == []


def test_a_short_key_is_refused(machine):
    machine.cloud.key = b"short"
    write_json(machine.root, "/etc/gpufleet/node.json", NODE)
    with pytest.raises(Fault) as err:
        run(machine, "node")
    assert str(err.value) == ("setup: the munge key from the stack's secret is 5 bytes; munged needs at least 32")
    assert not (machine.root / "etc/munge/munge.key").exists()


def test_a_missing_munge_user_is_one_line_before_the_cloud_is_asked(machine):
    machine.users = {}
    write_json(machine.root, "/etc/gpufleet/node.json", NODE)
    with pytest.raises(Fault) as err:
        run(machine, "node")
    assert str(err.value) == ("setup: no user 'gpufleet-no-such-user-munge' on this machine; the image creates "
                              "it (ami/scripts/45-slurm.sh)")
    assert machine.cloud.asked == [] and machine.systemctl_calls == []


def test_a_missing_munge_user_at_the_command_boundary(machine, monkeypatch, capsys):
    machine.users = {}
    write_json(machine.root, "/etc/gpufleet/node.json", NODE)
    injected = machine.system()
    monkeypatch.setattr(setup, "System", lambda: injected)
    assert trainer_main.main(["setup", "node", "--root", str(machine.root)]) == 1
    err = capsys.readouterr().err
    assert err == ("error: setup: no user 'gpufleet-no-such-user-munge' on this machine; the image creates it "
                   "(ami/scripts/45-slurm.sh)\n")


@pytest.mark.parametrize("doc, message", [
    (None, "--node-json: {path} does not exist (user-data writes it on cluster nodes)"),
    ("{not json", "--node-json: {path}: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ({**NODE, "slurm": {**SLURM_OBJECT, "controller_port": 0}},
     "--node-json: {path}: node.slurm.controller_port: 0 is not allowed; expected an integer 1-65535"),
    ({**NODE, "slurm": {**SLURM_OBJECT, "controller_port": "6817"}},
     "--node-json: {path}: node.slurm.controller_port: '6817' is not allowed; expected an integer 1-65535"),
    ({**NODE, "slurm": {**SLURM_OBJECT, "controller_addr": "10.0.0.10 -f /tmp/x"}},
     "--node-json: {path}: node.slurm.controller_addr: '10.0.0.10 -f /tmp/x' is not allowed; expected the "
     "controller's host name or IP address"),
    ({**NODE, "slurm": {**SLURM_OBJECT, "munge": ""}},
     "--node-json: {path}: node.slurm.munge: expected a non-empty string (the secret that holds the munge key), "
     "got an empty string"),
    ({**NODE, "slurm": {**SLURM_OBJECT, "munge": "A" * 1368}},
     "--node-json: {path}: node.slurm.munge: expected the reference of the secret that holds the munge key (an "
     "ARN, a Key Vault secret URL or a secret name), not the key itself"),
    ({**NODE, "slurm": {k: v for k, v in SLURM_OBJECT.items() if k != "munge"}},
     "--node-json: {path}: node.slurm: missing munge"),
    ({**NODE, "slurm": {**SLURM_OBJECT, "munge_secret": "x"}},
     "--node-json: {path}: node.slurm.munge_secret: secrets do not belong in user-data (use the node's identity)"),
    ({**NODE, "slurm": {**SLURM_OBJECT, "port": 1}},
     "--node-json: {path}: node.slurm.port: unknown key; expected controller_addr, controller_port, munge"),
    ({**NODE, "slurm": ["10.0.0.10"]},
     "--node-json: {path}: node.slurm: expected an object with controller_addr, controller_port, munge, got a list"),
    ({k: v for k, v in NODE.items() if k != "slurm"},
     "setup node: node.json has no \"slurm\" object (controller_addr, controller_port, munge); the stack's "
     "user-data writes it"),
])
def test_bad_node_json_is_one_line(machine, doc, message):
    path = machine.root / "etc/gpufleet/node.json"
    if doc is not None:
        write_json(machine.root, "/etc/gpufleet/node.json", doc)
    with pytest.raises(UsageError) as err:
        run(machine, "node")
    assert str(err.value) == message.format(path=path)
    assert machine.cloud.asked == [] and machine.systemctl_calls == []


def test_bad_node_json_exits_2_with_one_line(tmp_path):
    root = tmp_path / "root"
    write_json(root, "/etc/gpufleet/node.json", {**NODE, "slurm": {**SLURM_OBJECT, "controller_port": 70000}})
    done = subprocess.run([sys.executable, "-m", "trainer", "setup", "node", "--root", str(root)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == (f"error: --node-json: {root}/etc/gpufleet/node.json: node.slurm.controller_port: 70000 "
                           "is not allowed; expected an integer 1-65535\n")


def test_unknown_role_is_a_usage_error(machine):
    with pytest.raises(UsageError, match="argument role: invalid choice: 'login'"):
        run(machine, "login")


# --- controller -------------------------------------------------------------------------------------------------

def test_controller_makes_the_key_the_state_directory_and_the_bridge_settings_then_starts_them(machine):
    write_json(machine.root, "/etc/gpufleet/controller.json", CONTROLLER)
    assert run(machine, "controller") == 0

    key = machine.root / "etc/munge/munge.key"
    assert key.read_bytes() == KEY and mode(key) == 0o400 and owned(key, MUNGE)
    assert machine.cloud.asked == [("munge_key", CONTROLLER, True)]  # the controller creates it when none

    state = machine.root / "shared/slurm/state"
    assert state.is_dir() and mode(state) == 0o700 and owned(state, SLURM)
    assert (str(state.resolve()), *SLURM) in machine.chowns
    assert mode(state.parent) == 0o755  # parents made where missing, root's

    env = machine.root / "etc/gpufleet/bridge.env"
    assert mode(env) == 0o644
    assert [ln for ln in env.read_text().splitlines() if not ln.startswith("#")] == [
        'GPUFLEET_QUEUE_URL="https://sqs.eu-west-1.amazonaws.com/123456789012/gpufleet-dev-jobs"',
        'GPUFLEET_BUCKET="gpufleet-dev-data"', 'GPUFLEET_PARTITION="gpu"', 'GPUFLEET_GPUS="8"',
        'GPUFLEET_INSTANCE_TYPE="p5.48xlarge"', 'SLURM_CONF="/etc/slurm/slurm.conf"', 'GPUFLEET_ACCOUNT="vision"',
        'AWS_DEFAULT_REGION="eu-west-1"']

    assert machine.systemctl_calls == [["restart", "munge.service"], ["start", "mariadb.service"],
                                       ["restart", "slurmdbd.service"], ["restart", "slurmctld.service"],
                                       ["restart", "gpufleet-bridge.service"], ["restart", "gpufleet-heal.service"]]
    assert machine.key_at_first_start == KEY

    dbd = machine.root / "etc/slurm/slurmdbd.conf"
    conf = dict(ln.split("=", 1) for ln in dbd.read_text().splitlines() if not ln.startswith("#"))
    assert mode(dbd) == 0o600 and owned(dbd, SLURM)
    assert (conf["SlurmUser"], conf["StorageHost"], conf["DbdAddr"], conf["DbdPort"]) == (
        "slurm", "127.0.0.1", "127.0.0.1", "6819")
    vision, nlp = users.uid_of("vision"), users.uid_of("nlp")
    made = [[["groupadd", "--gid", str(uid), f"gpufleet-{team}"],
             ["useradd", "--uid", str(uid), "--gid", str(uid), "--groups", "gpufleet-teams", "--no-create-home",
              "--home-dir", f"/var/lib/gpufleet/teams/{team}", "--shell", "/usr/sbin/nologin", f"gpufleet-{team}"]]
            for team, uid in (("vision", vision), ("nlp", nlp))]
    # first: slurmctld maps the accounting's user names to uids
    assert [argv for argv, _ in machine.commands[:4]] == made[0] + made[1]
    (grant_argv, grants), *sacctmgr = machine.commands[4:]
    assert grant_argv == ["mariadb", "-u", "root"] and f"IDENTIFIED BY '{conf['StoragePass']}'" in grants
    assert len(conf["StoragePass"]) == 32
    assert [argv for argv, _ in sacctmgr] == [
        ["sacctmgr", "-n", "-P", "show", "clusters", "format=cluster"], ["sacctmgr", "-i", "add", "cluster", "dev"],
        ["sacctmgr", "-n", "-P", "show", "associations", "format=account,user,fairshare,grptres"],
        ["sacctmgr", "-i", "add", "account", "vision", "Description=gpufleet team vision", "Fairshare=2",
         "GrpTRES=gres/gpu=-1"],
        ["sacctmgr", "-i", "add", "user", "gpufleet-vision", "account=vision"],
        ["sacctmgr", "-i", "add", "account", "nlp", "Description=gpufleet team nlp", "Fairshare=1",
         "GrpTRES=gres/gpu=8"],
        ["sacctmgr", "-i", "add", "user", "gpufleet-nlp", "account=nlp"]]  # the bridge's user in none


def test_controller_waits_for_mariadb_and_slurmdbd_and_names_the_one_that_never_answers(machine, monkeypatch):
    write_json(machine.root, "/etc/gpufleet/controller.json", CONTROLLER)
    machine.refusals = {"mariadb": 2, "sacctmgr": 3}  # each daemon just started: refused a few times, then answers
    assert run(machine, "controller") == 0
    assert [argv[0] for argv in machine.ran("mariadb")] == ["mariadb"] * 3
    assert machine.systemctl_calls[-1] == ["restart", "gpufleet-heal.service"]

    machine.commands.clear()
    machine.systemctl_calls.clear()
    monkeypatch.setattr(setup, "READY_S", 0.0)
    machine.refusals = {"sacctmgr": 1000}
    with pytest.raises(Fault) as err:
        run(machine, "controller")
    assert str(err.value) == "setup: slurmdbd did not answer in 0 s (sacctmgr: not answering yet)"
    assert ["restart", "slurmctld.service"] not in machine.systemctl_calls  # never started without its accounting


def test_a_bad_team_on_the_controller_is_one_line_before_anything_is_done(machine):
    write_json(machine.root, "/etc/gpufleet/controller.json", {**CONTROLLER, "teams": [{"name": "ML"}]})
    with pytest.raises(UsageError) as err:
        run(machine, "controller")
    assert str(err.value) == "team 'ML': expected 1-15 lowercase letters and digits, starting with a letter"
    assert machine.cloud.asked == [] and machine.systemctl_calls == [] and machine.commands == []


def test_controller_on_azure_names_its_identity_for_the_bridge(machine):
    azure = {**CONTROLLER, "cloud": "azure", "bucket": "https://acct.blob.core.windows.net/data",
             "queue_url": "https://acct.queue.core.windows.net/jobs",
             "slurm": {**SLURM_OBJECT, "munge": "https://gfazure.vault.azure.net/secrets/munge"},
             "azure": {"client_id": "0f0e0d0c-0000-4000-8000-000000000001", "resource_group": "gpufleet-azure",
                       "subscription_id": "00000000-0000-4000-8000-000000000000"}}
    write_json(machine.root, "/etc/gpufleet/controller.json", azure)
    run(machine, "controller")
    env = (machine.root / "etc/gpufleet/bridge.env").read_text()
    assert 'AZURE_CLIENT_ID="0f0e0d0c-0000-4000-8000-000000000001"' in env.splitlines()
    assert "AWS_DEFAULT_REGION" not in env


def test_a_link_planted_at_the_state_directory_is_refused(machine, tmp_path):
    victim = tmp_path / "etc-of-someone"
    victim.mkdir(mode=0o755)
    shared = machine.root / "shared/slurm"
    shared.mkdir(parents=True)
    (shared / "state").symlink_to(victim)
    write_json(machine.root, "/etc/gpufleet/controller.json", CONTROLLER)
    with pytest.raises(Fault) as err:
        run(machine, "controller")
    assert str(err.value) == ("setup: /shared/slurm/state: state is a symbolic link or not a directory; refusing "
                              "to follow it")
    assert mode(victim) == 0o755 and victim.lstat().st_uid == os.geteuid()
    assert machine.systemctl_calls == [] and not any(path == str(victim) for path, *_ in machine.chowns)


def test_a_missing_slurm_user_on_the_controller_is_one_line(machine):
    machine.users = {"munge": MUNGE}
    write_json(machine.root, "/etc/gpufleet/controller.json", CONTROLLER)
    with pytest.raises(Fault, match=r"^setup: no user 'gpufleet-no-such-user-slurm' on this machine"):
        run(machine, "controller")
    assert machine.cloud.asked == []  # no key is generated on a machine that cannot run slurmctld


@pytest.mark.parametrize("change, message", [
    ({"state_dir": "shared/state"}, "controller.state_dir: 'shared/state' is not allowed; expected an absolute, "
                                    "normalised path other than /"),
    ({"state_dir": "/shared/../etc"}, "controller.state_dir: '/shared/../etc' is not allowed; expected an "
                                      "absolute, normalised path other than /"),
    ({"gpus": -1}, "controller.gpus: -1 is not allowed; expected an integer >= 0"),
    ({"partition": "GPU"}, "controller.partition: 'GPU' is not allowed; expected 1-15 lowercase letters and "
                           "digits, starting with a letter"),
    ({"instance_type": "p5 --python /tmp/x"}, "controller.instance_type: 'p5 --python /tmp/x' is not allowed; "
                                              "expected an instance type name"),
    ({"cloud": "gcp"}, "controller.cloud: 'gcp' is not one of aws, azure, tencent"),
    ({"slurm": {**SLURM_OBJECT, "controller_port": 65536}},
     "controller.slurm.controller_port: 65536 is not allowed; expected an integer 1-65535"),
])
def test_bad_controller_json_is_one_line(machine, change, message):
    path = write_json(machine.root, "/etc/gpufleet/controller.json", {**CONTROLLER, **change})
    with pytest.raises(UsageError) as err:
        run(machine, "controller")
    assert str(err.value) == f"--controller-json: {path}: {message}"
    assert machine.cloud.asked == [] and machine.systemctl_calls == []


def test_missing_controller_keys_are_named(machine):
    path = write_json(machine.root, "/etc/gpufleet/controller.json",
                      {k: v for k, v in CONTROLLER.items() if k not in ("state_dir", "gpus")})
    with pytest.raises(UsageError) as err:
        run(machine, "controller")
    assert str(err.value) == f"--controller-json: {path}: controller settings: missing gpus, state_dir"


def test_the_command_is_registered():
    assert trainer_main.COMMANDS["setup"] == "trainer.slurm.setup"


def test_with_a_queue_for_each_team_the_bridge_reads_each_under_its_teams_account(machine):
    base = "https://sqs.eu-west-1.amazonaws.com/123456789012/gpufleet-dev-jobs"
    teams = [{"name": "vision", "fair_share": 2, "gpu_limit": None, "queue_url": base},
             {"name": "nlp", "fair_share": 1, "gpu_limit": 1, "queue_url": f"{base}-nlp"}]
    write_json(machine.root, "/etc/gpufleet/controller.json", {**CONTROLLER, "teams": teams})
    run(machine, "controller")
    env = (machine.root / "etc/gpufleet/bridge.env").read_text().splitlines()
    assert f'GPUFLEET_TEAM_QUEUES="vision={base} nlp={base}-nlp"' in env
    # one team without a queue of its own: the one queue, under the first team's account (Azure, Tencent)
    write_json(machine.root, "/etc/gpufleet/controller.json", {**CONTROLLER, "teams": [teams[0], {"name": "nlp"}]})
    run(machine, "controller")
    env = (machine.root / "etc/gpufleet/bridge.env").read_text()
    assert "GPUFLEET_TEAM_QUEUES" not in env and 'GPUFLEET_ACCOUNT="vision"' in env.splitlines()
