"""The DNS guard, for real on loopback: a fake upstream resolver (UDP and TCP) records every name it is asked and
answers each with one address; the guard forwards allowed names there and answers the rest itself."""
from __future__ import annotations

import errno
import json
import logging
import socket
import socketserver
import struct
import subprocess
import sys
import threading

import pytest

from trainer.node import dnsguard
from trainer.node.dnsguard import FORMERR, NXDOMAIN, SERVFAIL

ANSWER = bytes([10, 1, 2, 3])


def query(name: str, qtype: int = 1, qid: int = 0x1234, flags: int = 0x0100, extra: bytes = b"") -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p)
    return struct.pack("!HHHHHH", qid, flags, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, 1) + extra


def rcode(reply: bytes) -> int:
    return struct.unpack_from("!H", reply, 2)[0] & 0xF


class Upstream:
    """A resolver on 127.0.0.1 (UDP and TCP, one port) answering every query with A 10.1.2.3."""

    def __init__(self):
        self.names: list[str] = []
        outer = self

        def reply(packet: bytes) -> bytes:
            q = dnsguard.question(packet)
            outer.names.append(q.name)
            header = struct.pack("!HHHHHH", struct.unpack_from("!H", packet)[0], 0x8180, 1, 1, 0, 0)
            return header + packet[12:q.end] + b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + ANSWER

        class Udp(socketserver.BaseRequestHandler):
            def handle(self):
                data, sock = self.request
                sock.sendto(reply(data), self.client_address)

        class Tcp(socketserver.BaseRequestHandler):
            def handle(self):
                (size,) = struct.unpack("!H", dnsguard._read_exact(self.request, 2))
                out = reply(dnsguard._read_exact(self.request, size))
                self.request.sendall(struct.pack("!H", len(out)) + out)

        self.udp, self.tcp = dnsguard.bind_pair("127.0.0.1", 0, Udp, Tcp)
        self.port = self.udp.server_address[1]
        for s in (self.udp, self.tcp):
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def close(self):
        for s in (self.udp, self.tcp):
            s.shutdown()
            s.server_close()


@pytest.fixture
def upstream():
    up = Upstream()
    yield up
    up.close()


@pytest.fixture
def guard(upstream):
    servers = dnsguard.serve(dnsguard.Guard(dnsguard.DOMAINS["tencent"], ["127.0.0.1"], upstream.port,
                                            timeout_s=1.0), port=0)
    yield servers[0].server_address[1]
    for s in servers:
        s.shutdown()
        s.server_close()


def ask_udp(port: int, packet: bytes, timeout_s: float = 3.0) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout_s)
        s.sendto(packet, ("127.0.0.1", port))
        return s.recv(4096)


def ask_tcp(port: int, packet: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(struct.pack("!H", len(packet)) + packet)
        (size,) = struct.unpack("!H", dnsguard._read_exact(s, 2))
        return dnsguard._read_exact(s, size)


@pytest.mark.parametrize("ask", [ask_udp, ask_tcp])
def test_a_service_name_is_forwarded_and_answered_by_the_vpcs_resolver(guard, upstream, ask):
    for name in ("examplebucket-1250000000.cos.ap-shanghai.myqcloud.com", "sts.tencentcloudapi.com",
                 "metadata.TencentYun.com", "myqcloud.com"):
        reply = ask(guard, query(name))
        assert rcode(reply) == 0 and reply[:2] == b"\x12\x34" and reply.endswith(ANSWER), name
    assert upstream.names == ["examplebucket-1250000000.cos.ap-shanghai.myqcloud.com", "sts.tencentcloudapi.com",
                              "metadata.tencentyun.com", "myqcloud.com"]


@pytest.mark.parametrize("ask", [ask_udp, ask_tcp])
def test_any_other_name_is_nxdomain_and_never_leaves_the_node(guard, upstream, ask, caplog):
    """Issue 23, finding 5 (DNS is an open, unlogged channel): a job's exfiltration query gets NXDOMAIN from the
    guard itself; the VPC's resolver (and so the attacker's name server) never sees it; it is logged."""
    caplog.set_level(logging.INFO, logger="gpufleet.dns")
    for name in ("c2VjcmV0LXdlaWdodHM.attacker.example", "myqcloud.com.attacker.example", "evilmyqcloud.com",
                 "pypi.org", "com"):
        q = query(name, qtype=16, qid=0x4242)
        reply = ask(guard, q)
        assert rcode(reply) == NXDOMAIN and reply[:2] == b"\x42\x42", name
        assert reply[12:] == q[12:] and struct.unpack_from("!HHHH", reply, 4) == (1, 0, 0, 0)  # the question only
    assert upstream.names == []
    logged = [json.loads(r.getMessage()) for r in caplog.records]
    assert [(e["name"], e["type"], e["verdict"]) for e in logged][0] == (
        "c2vjcmv0lxdlawdodhm.attacker.example", 16, "blocked")
    assert {e["verdict"] for e in logged} == {"blocked"} and len(logged) == 5


@pytest.mark.parametrize("packet", [
    query("x.myqcloud.com")[:12] + b"\x01x\xc0\x0c" + struct.pack("!HH", 1, 1),          # a compression pointer
    query("a.b.myqcloud.com").replace(b"\x01a\x01b", b"\x03a.b"),                         # a label with a dot
    query("x\x00y.myqcloud.com"),                                                           # a byte outside a name
    query("x.myqcloud.com", flags=0x8180),                                                  # an answer, not a query
    query("x.myqcloud.com", flags=0x2800),                                                  # an UPDATE
    query("x.myqcloud.com")[:4] + b"\x00\x02" + query("x.myqcloud.com")[6:],              # two questions
    query("x.myqcloud.com")[:-3],                                                           # cut short
], ids=["pointer", "dotted-label", "odd-byte", "response", "update", "two-questions", "short"])
def test_what_is_not_one_plain_query_is_formerr_and_never_forwarded(guard, upstream, packet):
    reply = ask_udp(guard, packet)
    assert rcode(reply) == FORMERR and reply[:2] == packet[:2] and reply[4:6] == b"\0\0"
    assert upstream.names == []


def test_a_packet_without_a_header_gets_no_answer_and_the_guard_goes_on(guard, upstream):
    with pytest.raises(socket.timeout):
        ask_udp(guard, b"\x12\x34\x01", timeout_s=0.5)
    assert rcode(ask_udp(guard, query("sts.tencentcloudapi.com"))) == 0


def test_no_answer_from_the_resolvers_is_servfail(upstream):
    dead = Upstream()
    dead.close()
    servers = dnsguard.serve(dnsguard.Guard(["myqcloud.com"], ["127.0.0.1"], dead.port, timeout_s=0.3), port=0)
    try:
        assert rcode(ask_udp(servers[0].server_address[1], query("x.myqcloud.com"))) == SERVFAIL
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


@pytest.fixture
def tcp_taken():
    """A port on 127.0.0.1 that a TCP listener holds and no UDP socket does (CI saw port 0 land on one)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_port_0_moves_on_from_a_udp_port_whose_tcp_twin_is_taken(tcp_taken, monkeypatch):
    first = []

    class LandsOnTheTakenPort(dnsguard._UdpServer):
        def __init__(self, address, handler):
            first.append(address)
            super().__init__((address[0], tcp_taken) if len(first) == 1 else address, handler)

    monkeypatch.setattr(dnsguard, "_UdpServer", LandsOnTheTakenPort)
    udp, tcp = dnsguard.bind_pair("127.0.0.1", 0, socketserver.BaseRequestHandler, socketserver.BaseRequestHandler)
    try:
        assert len(first) == 2 and udp.server_address[1] == tcp.server_address[1] != tcp_taken
    finally:
        udp.server_close()
        tcp.server_close()


def test_a_named_port_taken_over_tcp_is_an_error_never_another_port(tcp_taken):
    with pytest.raises(OSError) as e:
        dnsguard.bind_pair("127.0.0.1", tcp_taken, socketserver.BaseRequestHandler, socketserver.BaseRequestHandler)
    assert e.value.errno == errno.EADDRINUSE
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", tcp_taken))  # the UDP half was let go


def test_the_resolvers_are_the_ones_resolved_was_given_never_a_loopback_stub():
    text = "# managed\nnameserver 127.0.0.53\nnameserver 183.60.83.19\nsearch x\nnameserver 183.60.82.98\n"
    assert dnsguard.resolvers(text) == ["183.60.83.19", "183.60.82.98"]
    assert dnsguard.resolvers("nameserver ::1\nnameserver 127.0.0.1\n") == []


def test_allowed_is_the_domain_and_every_name_below_it_only():
    domains = dnsguard.DOMAINS["tencent"]
    assert dnsguard.allowed("cos.ap-shanghai.myqcloud.com", domains) and dnsguard.allowed("myqcloud.com", domains)
    assert not dnsguard.allowed("xmyqcloud.com", domains) and not dnsguard.allowed("myqcloud.com.evil", domains)


@pytest.mark.parametrize("argv,message", [
    (["serve", "--cloud", "aws"], "error: dns serve: cloud aws: its network filters DNS itself; a guard is for "
                                  "tencent\n"),
    (["serve", "--cloud", "tencent", "--upstream-port", "x"], "error: argument --upstream-port: invalid int value: "
                                                              "'x'\n"),
])
def test_bad_arguments_are_one_line(argv, message, tmp_path):
    out = subprocess.run([sys.executable, "-m", "trainer", "dns", *argv], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert (out.returncode, out.stderr) == (2, message)
