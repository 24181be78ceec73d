"""How the Azure adapters reach a storage account, from the standard variables only.

- ``AZURE_STORAGE_CONNECTION_STRING`` (the SDKs' and CLI's own): when it names the same account as the
  URL (or the URL names none, as az:// does), its endpoints and key win. This points the adapters at
  Azurite, as ``AWS_ENDPOINT_URL`` points boto3 at moto.
- Otherwise ``DefaultAzureCredential``: on a node the user-assigned managed identity, selected by
  ``AZURE_CLIENT_ID`` (its client id, from node.json). The accounts refuse shared keys.
- ``AZURE_STORAGE_ACCOUNT`` (the CLI's own) names the account for az:// URIs.
"""
from __future__ import annotations

import logging
import os

# The SDKs log every HTTP request at INFO; the trainer logs at INFO.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT = "AZURE_STORAGE_ACCOUNT"


def connection_settings(conn: str) -> dict[str, str]:
    """`Key=Value;...` -> {Key: Value} (values may contain '=')."""
    pairs = (part.split("=", 1) for part in conn.split(";") if "=" in part)
    return {k.strip(): v.strip() for k, v in pairs}


def connection_string(account: str | None) -> str | None:
    """The connection string from the environment when it serves `account` (None: any account)."""
    conn = os.environ.get(CONNECTION_STRING)
    if not conn:
        return None
    if account is None or connection_settings(conn).get("AccountName") == account:
        return conn
    return None


def default_account() -> str | None:
    conn = os.environ.get(CONNECTION_STRING)
    if conn:
        return connection_settings(conn).get("AccountName")
    return os.environ.get(ACCOUNT) or None


def credential():
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(exclude_interactive_browser_credential=True)
