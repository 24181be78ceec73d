"""Shared fixtures: a moto server on loopback (real HTTP), a clean AWS environment, and the loopback guard.

The guard (tests/loopback_only/sitecustomize.py) runs in this process and, through PYTHONPATH, in every
Python process a test starts: a connection to an address beyond loopback is refused before a packet
leaves and recorded; the session fails if anything was recorded.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GUARD_DIR = ROOT / "tests" / "loopback_only"
LOOPBACK_LOG = Path(tempfile.mkdtemp(prefix="gpufleet-guard-")) / "beyond-loopback.log"
os.environ["GPUFLEET_LOOPBACK_LOG"] = str(LOOPBACK_LOG)
os.environ["PYTHONPATH"] = os.pathsep.join([str(GUARD_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
_spec = importlib.util.spec_from_file_location("_loopback_guard", GUARD_DIR / "sitecustomize.py")
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))
# A child forked from this process (a DataLoader worker) neither runs gRPC's fork handlers nor collects what it
# inherited: gRPC objects the Pulumi tests left behind aborted a worker ("Fatal Python error: Aborted" while
# garbage-collecting, seen in CI). Production processes that fork workers never load gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.register_at_fork(after_in_child=gc.freeze)


def pytest_sessionfinish(session, exitstatus):
    refused = LOOPBACK_LOG.read_text().splitlines() if LOOPBACK_LOG.exists() else []
    if refused:
        print(f"\nerror: {len(refused)} connection(s) beyond loopback were attempted and refused:", file=sys.stderr)
        for line in refused[:20]:
            print(f"  {line}", file=sys.stderr)
        session.exitstatus = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _stop_signals():
    """Tests run `python -m trainer train` in this process (trainer.__main__.main), which at its end ignores
    SIGTERM and SIGINT for the rest of the process it takes to be its own; put them back, so that the processes
    later tests start do not inherit the ignoring (a Ctrl-C test would then wait in vain)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch):
    """No test may reach a real AWS account or a real instance metadata service."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="session")
def moto_server():
    """A moto server on 127.0.0.1; yields its endpoint URL. Tests reset state with `moto_reset`."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def moto_endpoint(moto_server, monkeypatch):
    """A freshly reset moto server, with AWS_ENDPOINT_URL pointing boto3 (and subprocesses) at it."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST")).read()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    return moto_server
