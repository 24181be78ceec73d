"""gpufleet-imds-root-only, run for real: the metadata service answers root and no one else.

Everything happens in a network namespace of the test's own (`unshare --net`, held open by a sleeping process and
entered with nsenter): its loopback up, a dummy interface (or, where the kernel has no dummy driver, its loopback)
carrying the metadata service's addresses, which in that namespace are local (nothing leaves the machine), a
`python -m http.server` on each standing in for the service, and the script's iptables rules, which live in that
namespace's tables: the host's are never touched. Requests go through curl, run as root or, through setpriv, as
nobody (65534), as a job's process (or its container's, on host network) would.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.ami.conftest import AMI, require

SCRIPT = AMI / "files" / "gpufleet-imds-root-only.sh"
IPV4, IPV6 = "169.254.169.254", "fd00:ec2::254"  # the service's own addresses, private to the namespace
TENCENT = "169.254.0.23"  # metadata.tencentyun.com
NOBODY, WATCHER = 65534, 65533


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kwargs)


class Namespace:
    """A network namespace held by a sleeping process; `run(argv)` runs a command in it (as root)."""

    def __init__(self):
        self.holder = subprocess.Popen(
            [require("unshare"), "--net", "--", "sh", "-c", "echo ready; exec sleep 600"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = self.holder.stdout.readline().strip()  # printed after unshare: the namespace is the new one
        if ready != "ready":
            self.holder.wait(timeout=30)
            self.reason = f"`unshare --net` failed: {self.holder.stderr.read().strip()}"
            return
        self.reason = ""
        self.net = f"/proc/{self.holder.pid}/ns/net"
        assert os.readlink(self.net) != os.readlink("/proc/self/ns/net")  # never the host's own
        self.servers: list[subprocess.Popen] = []

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return _run([require("nsenter"), f"--net={self.net}", "--", *argv], **kwargs)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen([require("nsenter"), f"--net={self.net}", "--", *argv], **kwargs)

    def close(self) -> None:
        for server in getattr(self, "servers", []):
            server.kill()
            server.wait(timeout=30)
        if self.holder.poll() is None:
            self.holder.kill()
        self.holder.wait(timeout=30)
        self.holder.stdout.close()
        self.holder.stderr.close()


def _ip6tables_works(ns: Namespace) -> bool:
    return ns.run([require("ip6tables"), "-w", "-S", "OUTPUT"]).returncode == 0


@pytest.fixture
def metadata_service():
    """A namespace whose 169.254.169.254:80 (and [fd00:ec2::254]:80 where IPv6 works) answers HTTP 200."""
    with serving(IPV4, IPV6) as served:
        yield served


@contextlib.contextmanager
def serving(ipv4: str, ipv6: str | None):
    """A namespace whose IPV4:80 (and [IPV6]:80, given and where IPv6 works) answers HTTP 200."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a network namespace of its own, iptables in it, and requests as another user")
    for tool in ("ip", "iptables", "curl", "setpriv", "python3"):
        require(tool)
    ns = Namespace()
    if ns.reason:
        ns.close()
        pytest.skip(f"no network namespace can be made here: {ns.reason}")
    docroot = Path(tempfile.mkdtemp(prefix="gpufleet-imds-"))
    try:
        docroot.chmod(0o755)
        (docroot / "latest").write_text("meta-data\n")
        (docroot / "latest").chmod(0o644)
        ip = require("ip")
        assert ns.run([ip, "link", "set", "lo", "up"]).returncode == 0
        device = "lo"
        if ns.run([ip, "link", "add", "imds0", "type", "dummy"]).returncode == 0:
            device = "imds0"
            assert ns.run([ip, "link", "set", "imds0", "up"]).returncode == 0
        added = ns.run([ip, "addr", "add", f"{ipv4}/32", "dev", device])
        assert added.returncode == 0, added.stderr
        addresses = [ipv4]
        if ipv6 and _ip6tables_works(ns) and ns.run([ip, "-6", "addr", "add", f"{ipv6}/128", "dev", device,
                                                     "nodad"]).returncode == 0:
            addresses.append(ipv6)
        for address in addresses:
            ns.servers.append(ns.popen(
                [require("python3"), "-m", "http.server", "80", "--bind", address, "--directory", str(docroot)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for address in addresses:  # the server is up once root is answered (before any rule)
            for _ in range(600):
                if get(ns, address) == "200":
                    break
                assert all(s.poll() is None for s in ns.servers), "the stand-in metadata server exited"
                time.sleep(0.05)
            else:
                pytest.fail(f"the stand-in metadata server on {address} never answered")
        yield ns, addresses
    finally:
        ns.close()
        shutil.rmtree(docroot)


def url(address: str) -> str:
    return f"http://[{address}]/latest" if ":" in address else f"http://{address}/latest"


def get(ns: Namespace, address: str, uid: int | None = None) -> str:
    """The HTTP status curl got from ADDRESS in the namespace, as root or as UID; 'refused' when no connection."""
    as_user = [] if uid is None else [require("setpriv"), "--reuid", str(uid), "--regid", str(uid), "--clear-groups"]
    done = ns.run([*as_user, require("curl"), "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20",
                   url(address)], cwd="/")
    if done.returncode == 7:  # curl: failed to connect (refused, or reset by the REJECT)
        return "refused"
    assert done.returncode == 0, done.stderr
    return done.stdout


def apply(ns: Namespace, *args: str) -> subprocess.CompletedProcess:
    done = ns.run(["bash", str(SCRIPT), *args, IPV4, IPV6])
    assert done.returncode == 0, done.stderr
    return done


def rules(ns: Namespace, tool: str, address: str) -> list[str]:
    listing = ns.run([require(tool), "-w", "-S", "OUTPUT"])
    assert listing.returncode == 0, listing.stderr
    return [line for line in listing.stdout.splitlines() if address in line]


def pair(address: str, bits: int) -> list[str]:
    match = f"-A OUTPUT -d {address}/{bits} -p tcp -m tcp --dport 80"
    return [f"{match} -m owner --uid-owner 0 -j ACCEPT", f"{match} -j REJECT --reject-with tcp-reset"]


def test_the_metadata_service_answers_root_and_refuses_everyone_else(metadata_service):
    ns, addresses = metadata_service
    for address in addresses:
        assert get(ns, address, NOBODY) == "200"  # before the filter: anyone
    apply(ns)
    for address in addresses:
        assert get(ns, address) == "200"
        assert get(ns, address, NOBODY) == "refused"
        assert get(ns, address, WATCHER) == "refused"
    assert rules(ns, "iptables", IPV4) == pair(IPV4, 32)
    if IPV6 in addresses:
        assert rules(ns, "ip6tables", IPV6) == pair(IPV6, 128)


def test_a_second_run_adds_nothing(metadata_service):
    ns, addresses = metadata_service
    apply(ns)
    second = apply(ns)
    assert f"iptables: {IPV4} already answers only 0" in second.stdout
    assert rules(ns, "iptables", IPV4) == pair(IPV4, 32)  # exactly one pair
    if IPV6 in addresses:
        assert rules(ns, "ip6tables", IPV6) == pair(IPV6, 128)
    assert get(ns, IPV4) == "200" and get(ns, IPV4, NOBODY) == "refused"


def test_a_partial_set_is_replaced_by_the_whole_in_order(metadata_service):
    """An interrupted run left the REJECT alone (root refused too): the next run puts root's ACCEPT above it."""
    ns, _ = metadata_service
    reject = ["-d", IPV4, "-p", "tcp", "--dport", "80", "-j", "REJECT", "--reject-with", "tcp-reset"]
    assert ns.run([require("iptables"), "-w", "-I", "OUTPUT", "1", *reject]).returncode == 0
    assert get(ns, IPV4) == "refused"
    apply(ns)
    assert rules(ns, "iptables", IPV4) == pair(IPV4, 32)
    assert get(ns, IPV4) == "200" and get(ns, IPV4, NOBODY) == "refused"


def test_an_allowed_user_gets_through_and_only_it(metadata_service):
    """The node's unit allows the notice watcher's user (slurm) too: here a uid of the test's."""
    ns, addresses = metadata_service
    apply(ns, "--allow", str(WATCHER))
    apply(ns, "--allow", str(WATCHER))
    for address in addresses:
        assert get(ns, address) == "200" and get(ns, address, WATCHER) == "200"
        assert get(ns, address, NOBODY) == "refused"
    root, reject = pair(IPV4, 32)
    assert rules(ns, "iptables", IPV4) == [root, root.replace("--uid-owner 0", f"--uid-owner {WATCHER}"), reject]


def test_on_tencent_its_own_service_answers_root_only():
    """`--cloud-of` a Tencent node's node.json (what the unit passes): 169.254.0.23, which has no IPv6 address."""
    node_json = Path(tempfile.mkdtemp(prefix="gpufleet-imds-")) / "node.json"
    node_json.write_text('{"cloud": "tencent", "region": "ap-shanghai"}')
    with serving(TENCENT, None) as (ns, _):
        assert get(ns, TENCENT, NOBODY) == "200"
        done = ns.run(["bash", str(SCRIPT), "--allow", str(WATCHER), "--cloud-of", str(node_json)])
        assert done.returncode == 0, done.stderr
        assert "the tencent metadata service has no IPv6 address" in done.stdout
        assert get(ns, TENCENT) == "200" and get(ns, TENCENT, WATCHER) == "200"
        assert get(ns, TENCENT, NOBODY) == "refused"
        root, reject = pair(TENCENT, 32)
        assert rules(ns, "iptables", TENCENT) == [root, root.replace("--uid-owner 0", f"--uid-owner {WATCHER}"),
                                                  reject]
        assert rules(ns, "iptables", IPV4) == []
    shutil.rmtree(node_json.parent)


def test_on_azure_the_metadata_service_answers_root_and_the_watcher_only():
    """`--cloud azure`: 169.254.169.254 (the identity endpoint and Scheduled Events), no IPv6 address."""
    with serving(IPV4, None) as (ns, _):
        done = ns.run(["bash", str(SCRIPT), "--allow", str(WATCHER), "--cloud", "azure"])
        assert done.returncode == 0, done.stderr
        assert "the azure metadata service has no IPv6 address" in done.stdout
        assert get(ns, IPV4) == "200" and get(ns, IPV4, WATCHER) == "200" and get(ns, IPV4, NOBODY) == "refused"


def test_wrong_usage_is_refused_before_any_rule():
    # in a namespace of its own as root too: the host's rules are never the test's
    private = [require("unshare"), "--net", "--"] if os.geteuid() == 0 else []
    azure = Path(tempfile.mkdtemp(prefix="gpufleet-imds-")) / "node.json"
    azure.write_text('{"cloud": "gcp"}')
    for args, message in ((["--allow"], "--allow needs a value"), (["--deny", "x"], "unknown option --deny"),
                          (["--cloud", "gcp"], "cloud gcp: expected aws, azure or tencent"),
                          (["--cloud-of", str(azure)], "cloud gcp: expected aws, azure or tencent"),
                          (["--cloud-of", "/nonexistent/node.json"], "cloud unreadable /nonexistent/node.json")):
        done = _run([*private, "bash", str(SCRIPT), *args])
        assert done.returncode == 2 and message in done.stderr, done.stderr
    shutil.rmtree(azure.parent)
    text = SCRIPT.read_text()
    header = text[:text.index("set -euo pipefail")]
    assert "--network host" in header and "OUTPUT chain" in header  # why containers are covered too
    assert 'ipv4="${1:-169.254.169.254}" ipv6="${2:-fd00:ec2::254}"' in text
    assert re.search(r"--uid-owner \"\$user\" -j ACCEPT", text)
