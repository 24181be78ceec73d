"""Fakes of the Azure services a node reaches with its managed identity, on 127.0.0.1 over real HTTP, written from
Azure's documentation (none has an emulator):

- the instance metadata service's identity endpoint `GET /metadata/identity/oauth2/token?api-version=2018-02-01
  &resource=R&client_id=C` (only with `Metadata: true`; 400 `Identity not found` for an unknown client id), which
  returns `{"access_token", "expires_on", "resource", "token_type"}`;
- a container registry's token exchange `POST /oauth2/exchange` (form `grant_type=access_token&service=<login
  server>&access_token=<Entra token for https://management.azure.com/>`) -> `{"refresh_token": <JWT>}`;
- Key Vault's `GET /secrets/<name>?api-version=7.4` with `Authorization: Bearer <token for https://vault.azure.net>`
  -> `{"value", "id"}`; 401 without a token, 403 when the identity holds no role on the vault, 404 for no secret.
"""
from __future__ import annotations

import base64
import json
import threading
import time
from urllib.parse import parse_qs, urlparse

from infra.demo.loopback_http import LoopbackServer, QuietHandler

MANAGEMENT, VAULT = "https://management.azure.com/", "https://vault.azure.net"


def jwt(claims: dict) -> str:
    def part(doc: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2ln"


class FakeAzureIdentity(LoopbackServer):
    def __init__(self, client_id: str = "cid-nodes", registry: str = "gpufleetazure0a1b2c3d.azurecr.io"):
        self.client_id, self.registry = client_id, registry
        self.more_ids: set[str] = set()     # other user-assigned identities the VM holds (the teams' jobs')
        self.secrets: dict[str, str] = {}
        self.vault_role = True             # the identity holds Key Vault Secrets User on the vault
        self.refresh_exp = time.time() + 3 * 3600
        self.requests: list[tuple[str, str]] = []  # (method, path) in order
        self.exchanges: list[dict] = []
        self._lock = threading.Lock()
        super().__init__(self._handler())

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token(self, resource: str, client_id: str | None = None) -> str:
        return f"entra-{client_id or self.client_id}-{resource}"

    def _handler(self):
        fake = self

        class Handler(QuietHandler):
            content_type = "application/json"

            def _note(self) -> tuple[str, dict]:
                url = urlparse(self.path)
                with fake._lock:
                    fake.requests.append((self.command, url.path))
                return url.path, parse_qs(url.query)

            def do_GET(self):
                path, query = self._note()
                if path == "/metadata/identity/oauth2/token":
                    if self.headers.get("Metadata") != "true" or query.get("api-version") != ["2018-02-01"]:
                        return self._reply(400, json.dumps({"error": "invalid_request"}))
                    client = (query.get("client_id") or [""])[0]
                    if client not in {fake.client_id, *fake.more_ids}:
                        return self._reply(400, json.dumps({"error": "invalid_request",
                                                            "error_description": "Identity not found"}))
                    resource = query["resource"][0]
                    return self._reply(200, json.dumps({
                        "access_token": fake.token(resource, client), "expires_on": str(int(time.time()) + 3600),
                        "resource": resource, "token_type": "Bearer"}))
                if path.startswith("/secrets/") and query.get("api-version") == ["7.4"]:
                    name = path[len("/secrets/"):]
                    if self.headers.get("Authorization") != f"Bearer {fake.token(VAULT)}":
                        return self._reply(401, json.dumps({"error": {"code": "Unauthorized"}}))
                    if not fake.vault_role:
                        return self._reply(403, json.dumps({"error": {"code": "Forbidden", "message": "Caller is "
                                                                      "not authorized to perform action"}}))
                    if name not in fake.secrets:
                        return self._reply(404, json.dumps({"error": {"code": "SecretNotFound"}}))
                    return self._reply(200, json.dumps({"value": fake.secrets[name],
                                                        "id": f"https://vault/secrets/{name}/v1"}))
                self._reply(404, json.dumps({"error": "not found"}))

            def do_POST(self):
                path, _ = self._note()
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0)))
                                                       .decode()).items()}
                if path != "/oauth2/exchange":
                    return self._reply(404, json.dumps({"errors": [{"code": "NOT_FOUND"}]}))
                with fake._lock:
                    fake.exchanges.append(form)
                if (self.headers.get("Content-Type") != "application/x-www-form-urlencoded"
                        or form.get("grant_type") != "access_token" or form.get("service") != fake.registry):
                    return self._reply(400, json.dumps({"errors": [{"code": "UNSUPPORTED"}]}))
                holders = {fake.client_id, *fake.more_ids}
                if form.get("access_token") not in {fake.token(MANAGEMENT, c) for c in holders}:
                    return self._reply(401, json.dumps({"errors": [{"code": "UNAUTHORIZED",
                                                                    "message": "invalid token"}]}))
                refresh = jwt({"aud": fake.registry, "exp": int(fake.refresh_exp), "grant_type": "refresh_token"})
                self._reply(200, json.dumps({"refresh_token": refresh}))

        return Handler
