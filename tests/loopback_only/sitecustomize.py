"""Loaded by every Python process the tests start (its folder leads PYTHONPATH): refuse, and record, any socket
connection or datagram to an address beyond loopback, before a packet leaves.

The record goes to the file named by GPUFLEET_LOOPBACK_LOG (one line per refused address); tests/conftest.py
fails the session when that file is not empty. Names are resolved by the connect that follows, so an
address, not a name, is what is checked; AF_UNIX sockets are local by definition.
"""
import ipaddress
import os
import socket
import sys

_LOG = os.environ.get("GPUFLEET_LOOPBACK_LOG")
_SEEN = os.environ.get("GPUFLEET_LOOPBACK_SEEN")  # optional: every inet address connected to, loopback or not


def _host(address):
    if isinstance(address, tuple) and address and isinstance(address[0], str):
        return address[0]
    return None


def _beyond_loopback(host: str) -> bool:
    try:
        return not ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:  # a name: only localhost is accepted without resolving it here
        return host not in ("localhost", "")


def _write(path, line):
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _hook(event, args):
    if event not in ("socket.connect", "socket.sendto"):
        return
    sock, address = args[0], args[-1]
    if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return
    host = _host(address)
    if host is None:
        return
    if _SEEN:
        _write(_SEEN, f"{host}:{address[1]}")
    if _beyond_loopback(host):
        if _LOG:
            _write(_LOG, f"{os.getpid()} {' '.join(sys.argv)[:200]} -> {host}:{address[1]}")
        raise ConnectionRefusedError(f"test guard: {host}:{address[1]} is beyond loopback")


sys.addaudithook(_hook)
