"""The DNS guard of Tencent nodes (trainer.node.dnsguard), on loopback: what a job's DNS query costs through it.

A stand-in for the VPC's resolver on 127.0.0.1 answers every query at once; the guard forwards to it, logging each
query as on a node (a JSON line, here to /dev/null). Each figure is the mean of sequential UDP queries from one
client, as a job's resolver sends them:
- dns_direct_ms: a query straight to the stand-in (the floor: what the node costs without a guard);
- dns_guard_allowed_ms: a service name through the guard (forwarded, answered);
- dns_guard_blocked_ms: another name through the guard (answered NXDOMAIN by the guard itself);
- dns_guard_overhead_ms: allowed minus direct, what the guard adds to a lookup that leaves the node.
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time

ROUNDS = 2000


def _query(name: str, qid: int) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", 1, 1)


def _stand_in() -> tuple[socket.socket, int]:
    """A resolver on 127.0.0.1 that answers each query NOERROR with A 10.1.2.3."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                packet, peer = sock.recvfrom(4096)
            except OSError:
                return
            reply = (packet[:2] + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + packet[12:] + b"\xc0\x0c"
                     + struct.pack("!HHIH", 1, 1, 60, 4) + bytes([10, 1, 2, 3]))
            sock.sendto(reply, peer)

    threading.Thread(target=serve, daemon=True).start()
    return sock, sock.getsockname()[1]


def _mean_ms(port: int, name: str, expect_rcode: int) -> float:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.settimeout(5)
        client.connect(("127.0.0.1", port))
        started = time.perf_counter()
        for i in range(ROUNDS):
            client.send(_query(name, i))
            reply = client.recv(4096)
            assert struct.unpack_from("!H", reply, 0)[0] == i and reply[3] & 0xF == expect_rcode, reply
        return (time.perf_counter() - started) / ROUNDS * 1000


def run() -> dict[str, dict]:
    from trainer.node import dnsguard

    log = logging.getLogger("gpufleet.dns")
    sink = logging.StreamHandler(open(os.devnull, "w"))
    sink.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(sink)
    log.setLevel(logging.INFO)
    upstream, upstream_port = _stand_in()
    servers = dnsguard.serve(dnsguard.Guard(dnsguard.DOMAINS["tencent"], ["127.0.0.1"], upstream_port), port=0)
    try:
        guard_port = servers[0].server_address[1]
        service = "examplebucket-1250000000.cos.ap-shanghai.myqcloud.com"
        direct = _mean_ms(upstream_port, service, 0)
        allowed = _mean_ms(guard_port, service, 0)
        blocked = _mean_ms(guard_port, "c2VjcmV0.attacker.example", dnsguard.NXDOMAIN)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        upstream.close()
        log.removeHandler(sink)
        sink.stream.close()
    return {
        "dns_direct_ms": {"value": direct, "unit": "ms", "target": "info (no guard, loopback)"},
        "dns_guard_allowed_ms": {"value": allowed, "unit": "ms", "target": "<= 2 (a service name, forwarded)"},
        "dns_guard_blocked_ms": {"value": blocked, "unit": "ms", "target": "<= 2 (answered NXDOMAIN by the guard)"},
        "dns_guard_overhead_ms": {"value": allowed - direct, "unit": "ms", "target": "<= 1 (added to a lookup)"},
    }
