"""Which Azure identity the trainer's storage clients use: the machine's user-assigned managed identity on a node
(node.json) and on the Slurm controller (controller.json, no node.json), nothing of the kind elsewhere.

Against a fake of the instance metadata service's token endpoint on loopback, reached the way azure-identity
documents for a custom IMDS address (AZURE_POD_IDENTITY_AUTHORITY_HOST). Written from Azure's documentation
("How to use managed identities for Azure resources on an Azure VM to acquire an access token"):
`GET /metadata/identity/oauth2/token?api-version=2018-02-01&resource=R&client_id=C` with `Metadata: true` answers
{access_token, client_id, expires_in, expires_on, ext_expires_in, not_before, resource, token_type}; an unknown
client id is a 400 (identity not found)."""
from __future__ import annotations

import json
import threading
import time
from urllib.parse import parse_qs, urlparse

import pytest
from azure.core.exceptions import ClientAuthenticationError

from infra.demo.loopback_http import LoopbackServer, QuietHandler
from trainer.clouds import azure
from trainer.node import node_schema

STORAGE = "https://storage.azure.com/.default"
CREDENTIAL_VARIABLES = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH",
                        "AZURE_FEDERATED_TOKEN_FILE", "AZURE_USERNAME", "IDENTITY_ENDPOINT", "MSI_ENDPOINT",
                        "IMDS_ENDPOINT", "AZURE_POD_IDENTITY_AUTHORITY_HOST")


def controller_json(client_id: str) -> dict:
    return {"cloud": "azure", "stack": "azure", "region": "westeurope",
            "bucket": "https://acct.blob.core.windows.net/checkpoints",
            "queue_url": "https://acct.queue.core.windows.net/jobs",
            "slurm": {"controller_addr": "10.64.16.4", "controller_port": 6817,
                      "munge": "https://vault.vault.azure.net/secrets/slurm-munge-key"},
            "partition": "gpu", "gpus": 8, "instance_type": "Standard_ND96asr_v4", "state_dir": "/var/spool/slurmctld",
            "azure": {"client_id": client_id, "resource_group": "gpufleet-azure", "subscription_id": "sub"}}


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Where this machine's settings would be; none there yet, no credential variable set."""
    monkeypatch.setattr(node_schema, "PATH", str(tmp_path / "node.json"))
    monkeypatch.setattr(node_schema, "CONTROLLER_PATH", str(tmp_path / "controller.json"))
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


class FakeImds(LoopbackServer):
    """The token endpoint of a VM with one user-assigned identity, ``client_id``."""

    def __init__(self, client_id: str):
        self.client_id, self.requests, self._lock = client_id, [], threading.Lock()
        fake = self

        class Handler(QuietHandler):
            content_type = "application/json"

            def do_GET(self):
                url = urlparse(self.path)
                query = parse_qs(url.query)
                with fake._lock:
                    fake.requests.append(query)
                if (url.path != "/metadata/identity/oauth2/token" or self.headers.get("Metadata") != "true"
                        or query.get("api-version") != ["2018-02-01"]):
                    return self._reply(400, json.dumps({"error": "invalid_request"}))
                if query.get("client_id", [fake.client_id]) != [fake.client_id]:
                    return self._reply(400, json.dumps({"error": "invalid_request",
                                                        "error_description": "Identity not found"}))
                now, resource = int(time.time()), query["resource"][0]
                self._reply(200, json.dumps({
                    "access_token": fake.token(resource), "client_id": fake.client_id, "expires_in": "3599",
                    "expires_on": str(now + 3599), "ext_expires_in": "3599", "not_before": str(now),
                    "resource": resource, "token_type": "Bearer"}))

        super().__init__(Handler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token(self, resource: str) -> str:
        return f"token-of-{self.client_id}-for-{resource}"


@pytest.fixture
def imds(monkeypatch):
    started: list[FakeImds] = []

    def start(client_id: str) -> FakeImds:
        fake = FakeImds(client_id).__enter__()
        monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", fake.base_url)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.__exit__(None, None, None)


def test_on_the_controller_the_controller_identity_of_controller_json(machine, imds):
    (machine / "controller.json").write_text(json.dumps(controller_json("cid-controller")))
    fake = imds("cid-controller")  # any other client id: 400 Identity not found
    token = azure.credential().get_token(STORAGE)
    assert token.token == fake.token("https://storage.azure.com")
    assert fake.requests[-1]["client_id"] == ["cid-controller"]
    assert azure.machine_settings()["azure"]["client_id"] == "cid-controller"


def test_on_a_node_the_node_identity_of_node_json(machine, imds):
    (machine / "node.json").write_text(json.dumps({"cloud": "azure", "azure": {"client_id": "cid-nodes"}}))
    fake = imds("cid-nodes")
    assert azure.credential().get_token(STORAGE).token == fake.token("https://storage.azure.com")
    assert fake.requests[-1]["client_id"] == ["cid-nodes"]


def test_azure_client_id_names_the_identity_before_the_settings(machine, imds, monkeypatch):
    (machine / "controller.json").write_text(json.dumps(controller_json("cid-controller")))
    fake = imds("cid-other")
    monkeypatch.setenv("AZURE_CLIENT_ID", "cid-other")
    assert azure.credential().get_token(STORAGE).token == fake.token("https://storage.azure.com")


def test_off_azure_the_metadata_service_is_never_asked(machine, imds, monkeypatch):
    fake = imds("cid-nodes")
    monkeypatch.setenv("AZURE_CLIENT_ID", "cid-nodes")  # a client id alone does not make this an Azure machine
    monkeypatch.setenv("PATH", "/nonexistent")          # no az, azd or pwsh to sign in with
    monkeypatch.setenv("HOME", str(machine))            # no shared token cache
    assert azure.machine_settings() == {}
    with pytest.raises(ClientAuthenticationError):
        azure.credential().get_token(STORAGE)
    assert fake.requests == []
