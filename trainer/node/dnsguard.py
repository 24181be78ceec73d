"""`python -m trainer dns serve`: a node's DNS firewall where its cloud offers none (Tencent Cloud).

A job could carry data out of the account in DNS queries (`<data>.attacker.example`, which the VPC's resolvers
recurse to the attacker's name server). On AWS and Azure the stack's network filters DNS (infra.aws.dns_firewall,
infra.azure.dns_firewall); a Tencent VPC has no such filter, so each Tencent node filters its own:

- this guard, an unprivileged user's process on 127.0.0.1:5353 (UDP and TCP), answers a query for a name under the
  cloud's service domains (``DOMAINS``: COS, the cloud APIs, the internal services) by forwarding it to the VPC's
  resolvers (the ones systemd-resolved was given), and any other name NXDOMAIN without sending it anywhere;
- a packet filter (ami/files/gpufleet-dns-guard-rules.sh) sends every DNS packet (port 53, UDP and TCP) of every
  user but root and the guard's own to the guard, whatever address it was for: the stub resolver's, the VPC
  resolvers', or any other server's. Jobs run as their teams' users (never root), so each of their queries, and
  those systemd-resolved sends for them, passes the guard.

Every query is logged, one JSON line each (client, protocol, name, type, verdict), to standard error: the node's
journal (`journalctl -u gpufleet-dns-guard`), which caps its own size. Nothing ships it off the node: the Tencent
image has no log agent. A question that is not one plain query (several questions, a compression pointer, a
label with a dot or a byte outside letters, digits, `-` and `_`) is refused (FORMERR) and never forwarded.
"""
from __future__ import annotations

import errno
import json
import logging
import socket
import socketserver
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import ArgumentParser, UsageError
from trainer.node import node_schema

log = logging.getLogger("gpufleet.dns")

# The names a node of each cloud resolves (each with every name below it): Tencent's internal service domains
# (metadata, CLS, the CMQ adapter), COS and the cloud APIs (STS, SSM, CVM).
DOMAINS = {"tencent": ("tencentyun.com", "myqcloud.com", "tencentcloudapi.com")}
HOST, PORT = "127.0.0.1", 5353
RESOLVERS = ("/run/systemd/resolve/resolv.conf", "/etc/resolv.conf")  # where the VPC's resolvers are named
FORMERR, SERVFAIL, NXDOMAIN = 1, 2, 3
FORWARD_TIMEOUT_S = 3.0
MAX_UDP = 4096
TCP_IDLE_S = 10.0
LABEL_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


@dataclass(frozen=True)
class Question:
    name: str      # lower case, no trailing dot ("" for the root)
    qtype: int
    end: int       # the offset just past the question in the packet


def question(packet: bytes) -> Question | None:
    """The one question of a plain query (QR 0, opcode QUERY, one question whose labels are host-name bytes, no
    compression pointer), or None."""
    if len(packet) < 12:
        return None
    flags, qdcount = struct.unpack_from("!HH", packet, 2)
    if flags & 0x8000 or (flags >> 11) & 0xF or qdcount != 1:
        return None
    labels, at = [], 12
    while True:
        if at >= len(packet):
            return None
        size = packet[at]
        if size == 0:
            break
        if size > 63 or at + 1 + size > len(packet):  # 0xC0 and above: a compression pointer
            return None
        label = packet[at + 1:at + 1 + size]
        if not LABEL_BYTES.issuperset(label):
            return None
        labels.append(label.decode("ascii").lower())
        at += 1 + size
    name = ".".join(labels)
    if len(name) > 253 or at + 5 > len(packet):
        return None
    (qtype,) = struct.unpack_from("!H", packet, at + 1)
    return Question(name, qtype, at + 5)


def allowed(name: str, domains) -> bool:
    return any(name == d or name.endswith("." + d) for d in domains)


def refusal(packet: bytes, q: Question | None, rcode: int) -> bytes:
    """The answer ``rcode`` to the query in ``packet``: its id, its recursion-desired bit, its question if read."""
    (qid, flags) = struct.unpack_from("!HH", packet, 0)
    header = struct.pack("!HHHHHH", qid, 0x8000 | (flags & 0x0100) | 0x0080 | rcode, 1 if q else 0, 0, 0, 0)
    return header + (packet[12:q.end] if q else b"")


def resolvers(text: str) -> list[str]:
    """The nameservers a resolv.conf names, but loopback ones (the stub resolver, or this guard)."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver" and not words[1].startswith("127.") and words[1] != "::1":
            out.append(words[1])
    return out


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class Guard:
    """Answers queries: forwards those for an allowed name to the upstream resolvers, refuses the rest."""

    def __init__(self, domains, upstreams: list[str], upstream_port: int = 53,
                 timeout_s: float = FORWARD_TIMEOUT_S):
        self.domains = tuple(d.lower().strip(".") for d in domains)
        self.upstreams = list(upstreams)
        self.upstream_port = upstream_port
        self.timeout_s = timeout_s

    def answer(self, packet: bytes, client: str, proto: str) -> bytes | None:
        q = question(packet)
        if q is None:
            self._log(client, proto, None, None, "malformed")
            return refusal(packet, None, FORMERR) if len(packet) >= 12 else None
        if not allowed(q.name, self.domains):
            self._log(client, proto, q.name, q.qtype, "blocked")
            return refusal(packet, q, NXDOMAIN)
        for upstream in self.upstreams:
            try:
                reply = self._udp(packet, upstream) if proto == "udp" else self._tcp(packet, upstream)
            except OSError:
                continue
            if reply[:2] == packet[:2]:  # the query's id: not another packet that reached the socket
                self._log(client, proto, q.name, q.qtype, "allowed")
                return reply
        self._log(client, proto, q.name, q.qtype, "unanswered")
        return refusal(packet, q, SERVFAIL)

    def _udp(self, packet: bytes, upstream: str) -> bytes:
        with socket.socket(socket.AF_INET6 if ":" in upstream else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(self.timeout_s)
            s.connect((upstream, self.upstream_port))
            s.send(packet)
            return s.recv(MAX_UDP)

    def _tcp(self, packet: bytes, upstream: str) -> bytes:
        with socket.create_connection((upstream, self.upstream_port), timeout=self.timeout_s) as s:
            s.sendall(struct.pack("!H", len(packet)) + packet)
            (size,) = struct.unpack("!H", _read_exact(s, 2))
            return _read_exact(s, size)

    @staticmethod
    def _log(client: str, proto: str, name: str | None, qtype: int | None, verdict: str) -> None:
        log.info("%s", json.dumps({"client": client, "proto": proto, "name": name, "type": qtype,
                                   "verdict": verdict}))


class _UdpServer(socketserver.ThreadingUDPServer):
    daemon_threads = True


class _TcpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True  # a restarted guard binds again while the last one's connections sit in TIME_WAIT


def bind_pair(host: str, port: int, udp_handler: type, tcp_handler: type,
              tries: int = 32) -> tuple[socketserver.BaseServer, socketserver.BaseServer]:
    """A UDP and a TCP server on one port of ``host``. Port 0 takes a free UDP port, and another where that
    number is taken over TCP (an ephemeral port is free for one protocol, not always for both)."""
    for _ in range(tries if port == 0 else 1):
        udp = _UdpServer((host, port), udp_handler)
        try:
            return udp, _TcpServer((host, udp.server_address[1]), tcp_handler)
        except OSError as e:
            udp.server_close()
            if port != 0 or e.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no port on {host} free over both UDP and TCP after {tries} tries")


def serve(guard: Guard, host: str = HOST, port: int = PORT) -> tuple[socketserver.BaseServer, ...]:
    """The guard on ``host:port``, UDP and TCP, each in a thread of its own (a query each in a thread)."""

    class Udp(socketserver.BaseRequestHandler):
        def handle(self):
            data, sock = self.request
            reply = guard.answer(data, self.client_address[0], "udp")
            if reply is not None:
                sock.sendto(reply, self.client_address)

    class Tcp(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.settimeout(TCP_IDLE_S)
            try:
                while True:
                    (size,) = struct.unpack("!H", _read_exact(self.request, 2))
                    reply = guard.answer(_read_exact(self.request, size), self.client_address[0], "tcp")
                    if reply is None:
                        return
                    self.request.sendall(struct.pack("!H", len(reply)) + reply)
            except OSError:  # ConnectionError too: the client went away
                return

    udp, tcp = bind_pair(host, port, Udp, Tcp)
    for server in (udp, tcp):
        threading.Thread(target=server.serve_forever, daemon=True, name=f"dns-{server.socket_type}").start()
    return udp, tcp


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m trainer dns", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["serve"])
    p.add_argument("--cloud", help="the cloud whose service domains are allowed (default node.json's)")
    p.add_argument("--domain", action="append", default=[], help="a domain to allow besides the cloud's (repeatable)")
    p.add_argument("--upstream", action="append", default=[],
                   help="a resolver to forward to (repeatable; default: those /run/systemd/resolve/resolv.conf names)")
    p.add_argument("--upstream-port", type=int, default=53, help="the resolvers' port")
    p.add_argument("--port", type=int, default=PORT, help=f"the port on 127.0.0.1 (default {PORT})")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    cloud = args.cloud or (node_schema.load(node_schema.PATH, required=False) or {}).get("cloud")
    if cloud and cloud not in DOMAINS:
        raise UsageError(f"dns serve: cloud {cloud}: its network filters DNS itself; a guard is for "
                         f"{', '.join(DOMAINS)}")
    domains = [*DOMAINS.get(cloud, ()), *args.domain]
    if not domains:
        raise UsageError("dns serve: no domain to allow: give --cloud or --domain, or run on a node whose node.json "
                         "names its cloud")
    upstreams = args.upstream or next((found for f in RESOLVERS
                                       if Path(f).is_file() and (found := resolvers(Path(f).read_text()))), [])
    if not upstreams:
        raise UsageError(f"dns serve: no resolver to forward to: give --upstream, or run where {RESOLVERS[0]} "
                         "names one")
    udp, _ = serve(Guard(domains, upstreams, args.upstream_port), port=args.port)
    log.info("DNS guard on %s:%d (udp, tcp): %s through %s", HOST, udp.server_address[1], ", ".join(domains),
             ", ".join(upstreams))
    threading.Event().wait()
    return 0
