"""Registry logins and Key Vault secrets through the node's identity: the pure parts (which host an image is on,
the docker config a job gets, token expiry, the cache), ECR's GetAuthorizationToken on moto server, and the ACR
token exchange and Key Vault reads on the fakes of tests/trainer/fake_azure_identity.py (real HTTP on loopback)."""
from __future__ import annotations

import base64
import json
import stat

import pytest

from tests.trainer.fake_azure_identity import FakeAzureIdentity, jwt
from trainer.clouds import aws, azure
from trainer.errors import UsageError
from trainer.node.platform import Platform
from trainer.node.registry import (ACR_USER, LoginCache, RegistryLogin, docker_config, ecr_region, image_host,
                                   is_acr, jwt_expiry, write_config_dir)

ECR = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
ACR = "gpufleetazure0a1b2c3d.azurecr.io"


@pytest.mark.parametrize("ref, host", [
    (f"{ECR}/gpufleet-prod:train-1", ECR),
    (f"{ECR}/hub/library/python:3.11", ECR),            # a pull-through cache repository
    (f"{ACR}/train@sha256:" + "a" * 64, ACR),
    ("127.0.0.1:5000/img:1", "127.0.0.1:5000"),
    ("localhost/img", "localhost"),
    ("gpufleet-test/example:1", None),                  # a local image (or Docker Hub's namespace)
    ("python:3.11", None),
])
def test_the_registry_host_of_an_image(ref, host):
    assert image_host(ref) == host


def test_only_ecr_and_acr_hosts_are_matched():
    assert ecr_region(ECR) == "eu-west-1"
    assert ecr_region("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn") == "cn-north-1"
    assert ecr_region("public.ecr.aws") is None and ecr_region("12345.dkr.ecr.eu-west-1.amazonaws.com") is None
    assert ecr_region(f"{ECR}.evil.example") is None and ecr_region(None) is None
    assert is_acr(ACR) and not is_acr("gpufleet.azurecr.io.evil.example") and not is_acr(None)


def test_the_job_docker_config_holds_the_login_for_its_host_only(tmp_path):
    login = RegistryLogin(ECR, "AWS", "s3cr3t", 0)
    assert docker_config([login]) == {"auths": {ECR: {"auth": base64.b64encode(b"AWS:s3cr3t").decode()}}}
    assert "s3cr3t" not in repr(login)
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "stale.json").write_text("{}")
    path = write_config_dir(tmp_path / "docker", [login])
    assert sorted(p.name for p in path.iterdir()) == ["config.json"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((path / "config.json").stat().st_mode) == 0o600
    assert json.loads((path / "config.json").read_text()) == docker_config([login])


def test_logins_are_cached_until_near_expiry():
    now = [1000.0]
    cache = LoginCache(margin_s=900, clock=lambda: now[0])
    fetched = []

    def fetch():
        fetched.append(now[0])
        return RegistryLogin(ECR, "AWS", f"t{len(fetched)}", now[0] + 12 * 3600)

    assert cache.get(ECR, fetch).password == "t1"
    now[0] += 11 * 3600
    assert cache.get(ECR, fetch).password == "t1"        # 1 h left: still good
    now[0] += 3600 - 899
    assert cache.get(ECR, fetch).password == "t2"        # under 15 minutes left: fetched again
    assert fetched == [1000.0, 1000.0 + 12 * 3600 - 899]


def test_jwt_expiry():
    assert jwt_expiry(jwt({"exp": 1767225600})) == 1767225600
    assert jwt_expiry("not-a-jwt") is None and jwt_expiry(jwt({"aud": "x"})) is None


def test_no_login_off_a_cloud_node():
    assert Platform().registry_login(f"{ECR}/gpufleet-prod:1") is None


# --- AWS: ECR GetAuthorizationToken through the instance role (moto server) ------------------------------------

def test_ecr_login_through_get_authorization_token(moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    platform = aws.NodePlatform({"cloud": "aws", "region": "eu-west-1"})
    calls = []
    import boto3

    real = boto3.client

    def client(service, **kw):
        c = real(service, **kw)
        c.meta.events.register("after-call.ecr.GetAuthorizationToken", lambda **_: calls.append(kw["region_name"]))
        return c

    monkeypatch.setattr(boto3, "client", client)
    host = "123456789012.dkr.ecr.eu-central-1.amazonaws.com"
    login = platform.registry_login(f"{host}/gpufleet-prod:train-1")
    # moto's token is base64("AWS:<account>-auth-token") for the caller's account
    assert (login.host, login.username, login.password) == (host, "AWS", "123456789012-auth-token")
    assert calls == ["eu-central-1"]                      # the image's region
    assert platform.registry_login("gpufleet-test/example:1") is None
    assert platform.registry_login(f"{ACR}/train:1") is None
    assert calls == ["eu-central-1"]


# --- Azure: ACR token exchange and Key Vault with the managed identity (fakes) ----------------------------------

def azure_platform(fake: FakeAzureIdentity, key_vault: str | None = "gpufleet-kv", client_id: str = "cid-nodes"):
    node = {"cloud": "azure", "azure": {"client_id": client_id, "resource_group": "rg", "subscription_id": "s",
                                        **({"key_vault": key_vault} if key_vault else {})}}
    return azure.NodePlatform(node, base_url=fake.base_url, registry_url=fake.base_url, vault_url=fake.base_url)


def test_acr_login_exchanges_the_identity_token_for_a_refresh_token():
    with FakeAzureIdentity(registry=ACR) as fake:
        platform = azure_platform(fake)
        login = platform.registry_login(f"{ACR}/train:1")
        again = platform.registry_login(f"{ACR}/other:2")
        assert platform.registry_login(f"{ECR}/x:1") is None and platform.registry_login("local/x:1") is None
    assert (login.host, login.username) == (ACR, ACR_USER) and again == login
    assert login.expires_at == int(fake.refresh_exp)      # the refresh token's own expiry
    assert fake.exchanges == [{"grant_type": "access_token", "service": ACR,
                               "access_token": fake.token("https://management.azure.com/")}]  # cached
    assert fake.requests == [("GET", "/metadata/identity/oauth2/token"), ("POST", "/oauth2/exchange")]


def test_acr_login_without_the_identity_is_one_line():
    with FakeAzureIdentity(registry=ACR) as fake:
        with pytest.raises(UsageError) as err:
            azure_platform(fake, client_id="someone-else").registry_login(f"{ACR}/train:1")
    assert str(err.value) == (f"registry {ACR}: no token of the node's managed identity (HTTP 400 Identity not "
                              "found); check the scale set's user-assigned identity and node.json azure.client_id")
    assert fake.exchanges == []


def test_key_vault_secret_is_read_with_the_identity():
    with FakeAzureIdentity() as fake:
        fake.secrets["hf-token"] = "hf_abc"
        platform = azure_platform(fake)
        assert platform.secret("keyvault", "hf-token") == "hf_abc"
        assert platform.secret("keyvault", "hf-token") == "hf_abc"
    assert fake.requests.count(("GET", "/metadata/identity/oauth2/token")) == 1  # the vault token is cached


@pytest.mark.parametrize("setup, message", [
    (lambda f: setattr(f, "vault_role", False),
     "env: keyvault:hf-token: HTTP 403: the node's identity may not read secrets of Key Vault gpufleet-kv; it needs "
     "the role Key Vault Secrets User on the vault"),
    (lambda f: None,
     "env: keyvault:hf-token: HTTP 404: no secret 'hf-token' in Key Vault gpufleet-kv; create it there "
     "(az keyvault secret set)"),
])
def test_key_vault_errors_are_one_line(setup, message):
    with FakeAzureIdentity() as fake:
        setup(fake)
        with pytest.raises(UsageError) as err:
            azure_platform(fake).secret("keyvault", "hf-token")
    assert str(err.value) == message


def test_key_vault_without_a_vault_or_identity_is_one_line():
    with FakeAzureIdentity() as fake:
        with pytest.raises(UsageError, match=r"^env: keyvault:x: node.json names no Key Vault \(azure.key_vault\)"):
            azure_platform(fake, key_vault=None).secret("keyvault", "x")
        with pytest.raises(UsageError, match=r"^env: keyvault:x: no token of the node's managed identity "
                                             r"\(HTTP 400 Identity not found\)"):
            azure_platform(fake, client_id="nobody").secret("keyvault", "x")
        with pytest.raises(UsageError, match="cannot read ssm secrets"):
            azure_platform(fake).secret("ssm", "/x")
