"""A job's own Azure identity (trainer.clouds.azure.TeamIdentityIssuer, served by trainer.node.jobcreds): a job's
process that has nothing but the TaskProlog's variables gets its team's identity's tokens from the node's loopback
endpoint through azure-identity's own App Service credential, and its team's Key Vault secrets through the node;
against the fakes of the metadata service's identity endpoint and Key Vault (tests/trainer/fake_azure_identity.py),
written from Azure's documentation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.trainer.fake_azure_identity import MANAGEMENT, VAULT, FakeAzureIdentity
from trainer.clouds import azure
from trainer.errors import UsageError
from trainer.node import jobcreds
from trainer.node.jobcreds import AZURE_PATH, Broker, write_grant

REPO = Path(__file__).resolve().parents[3]
STORAGE = "https://storage.azure.com"
MUNGE_URL = "https://kv.vault.azure.net/secrets/slurm-munge-key"
TEAMS = {"vision": "cid-team-vision", "nlp": "cid-team-nlp"}


@pytest.fixture
def node(tmp_path):
    """The node's metadata service and vault (one fake), its credentials daemon serving the teams' identities."""
    with FakeAzureIdentity(client_id="cid-nodes") as fake:
        fake.more_ids = set(TEAMS.values())
        fake.secrets = {"vision-db-password": "s3cret-v", "nlp-db-password": "s3cret-n", "slurm-munge-key": "MUNGE",
                        "db-password": "shared"}
        settings = {"cloud": "azure", "region": "westeurope", "slurm": {"munge": MUNGE_URL},
                    "azure": {"client_id": "cid-nodes", "key_vault": "kv", "team_client_ids": TEAMS}}
        platform = azure.NodePlatform(settings, base_url=fake.base_url, vault_url=fake.base_url)
        issuer = azure.TeamIdentityIssuer(TEAMS, settings, base_url=fake.base_url, platform=platform)
        broker = Broker(tmp_path / "credentials", issuer, path=AZURE_PATH)
        server = jobcreds.serve(broker, port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}{AZURE_PATH}", broker, fake
        server.shutdown()
        server.server_close()


def _job_env(url: str, token: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "IDENTITY_", "MSI_"))}
    return {**env, "IDENTITY_ENDPOINT": url, "IDENTITY_HEADER": token, "AWS_EC2_METADATA_DISABLED": "true"}


def _job_process(url: str, token: str, code: str, *argv: str) -> list[str]:
    """What a job's process (the TaskProlog's variables, no other Azure credential) prints running ``code``."""
    done = subprocess.run([sys.executable, "-c", code, *argv], env=_job_env(url, token), capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_jobs_process_gets_its_teams_token_through_azure_identity(node):
    url, broker, fake = node
    token = write_grant(broker.dir, "42", "vision", "run1", os.getuid(), os.getgid())
    code = ("from azure.identity import ManagedIdentityCredential\n"
            "print(ManagedIdentityCredential().get_token('https://storage.azure.com/.default').token)\n"
            "from trainer.clouds.azure import credential\n"
            "print(credential().get_token('https://storage.azure.com/.default').token)\n")
    # the team's, not the node's
    assert _job_process(url, token, code) == [fake.token(STORAGE, "cid-team-vision")] * 2
    other = write_grant(broker.dir, "43", "nlp", "run9", os.getuid(), os.getgid())
    assert broker.credentials(other, STORAGE + "/")["access_token"] == fake.token(STORAGE + "/", "cid-team-nlp")


def _get(url: str, header: str | None, **query) -> tuple[int, dict]:
    req = urllib.request.Request(f"{url}?{urllib.parse.urlencode(query)}",
                                 headers={"X-IDENTITY-HEADER": header} if header is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_a_forged_token_another_resource_or_protocol_gets_nothing(node):
    url, broker, _ = node
    token = write_grant(broker.dir, "42", "vision", "run1", os.getuid(), os.getgid())
    ok = {"api-version": "2019-08-01", "resource": STORAGE}
    assert _get(url, token, **ok)[0] == 200
    assert _get(url, None, **ok)[0] == 401 and _get(url, "43." + token.split(".", 1)[1], **ok)[0] == 403
    status, body = _get(url, token, **{**ok, "resource": VAULT})  # a Key Vault token would read the munge key
    assert status == 403 and "not https://vault.azure.net" in body["message"]
    assert _get(url, token, **{**ok, "resource": MANAGEMENT})[0] == 200  # a registry login (AcrPull)
    assert _get(url, token, **{**ok, "api-version": "2018-02-01"})[0] == 400
    assert _get(url.replace(AZURE_PATH, jobcreds.PATH), token)[0] == 404  # AWS's protocol is not served here
    unknown = write_grant(broker.dir, "44", "speech", "run1", os.getuid(), os.getgid())
    status, body = _get(url, unknown, **ok)
    assert status == 403 and "team speech has no identity on this node" in body["message"]


def test_a_job_reads_its_teams_secrets_and_no_other_through_the_node(node):
    url, broker, fake = node
    token = write_grant(broker.dir, "42", "vision", "run1", os.getuid(), os.getgid())
    code = ("import sys\nfrom trainer.clouds.azure import NodePlatform\nfrom trainer.errors import UsageError\n"
            "p = NodePlatform({'cloud': 'azure', 'azure': {'client_id': 'cid-nodes', 'key_vault': 'kv'}},\n"
            "                 base_url='http://127.0.0.1:9')\n"
            "for name in sys.argv[1:]:\n"
            "    try:\n"
            "        print(p.secret('keyvault', name))\n"
            "    except UsageError as e:\n"
            "        print('refused:', e)\n")
    names = ["vision-db-password", "nlp-db-password", "slurm-munge-key", "db-password", "vision-absent"]
    lines = _job_process(url, token, code, *names)
    assert lines[0] == "s3cret-v"
    for line, name in zip(lines[1:4], names[1:4]):
        assert line.startswith(f"refused: env: keyvault:{name}: the node refused it (HTTP 403: secret '{name}': a "
                               "job of team vision reads only its team's, named vision-...)"), line
    assert lines[4].startswith("refused: env: keyvault:vision-absent: the node refused it (HTTP 404")
    assert not [line for line in lines if "MUNGE" in line or "s3cret-n" in line]
    slurm = write_grant(broker.dir, "45", "slurm", "run1", os.getuid(), os.getgid())  # a team named like the key
    with pytest.raises(jobcreds.Denied, match="reads only its team's"):
        broker.secret(slurm, "slurm-munge-key")


def test_a_jobs_registry_login_uses_its_teams_identity(node):
    url, broker, fake = node
    token = write_grant(broker.dir, "42", "vision", "run1", os.getuid(), os.getgid())
    identity = azure.ManagedIdentity("cid-nodes", base_url="http://127.0.0.1:9", environ=_job_env(url, token))
    assert identity.token(MANAGEMENT)[0] == fake.token(MANAGEMENT, "cid-team-vision")
    far = azure.ManagedIdentity(None, environ={"IDENTITY_ENDPOINT": "http://10.0.0.5/msi/token",
                                               "IDENTITY_HEADER": token})
    assert far.job is None  # a job's token goes to loopback only (another host's endpoint is azure-identity's)


def test_a_node_without_team_identities_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="^credentials serve: no team identities: .*azure.team_client_ids$"):
        azure.job_issuer({"cloud": "azure", "azure": {"client_id": "cid-nodes"}})
    from trainer.node import node_schema

    with pytest.raises(ValueError, match="node.azure.team_client_ids: expected"):
        node_schema.check({"cloud": "azure", "azure": {"team_client_ids": {"Vision!": "x"}}})
