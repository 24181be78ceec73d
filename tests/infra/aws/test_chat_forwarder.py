"""The chat forwarder's handler against webhook receivers on loopback, with SNS events as Lambda delivers them."""
from __future__ import annotations

import json
import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.aws import chat_forwarder


class Receiver:
    """A chat incoming webhook: records JSON bodies; answers `status`."""

    def __init__(self, status: int = 200):
        self.posts: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append({"type": self.headers["Content-Type"], "body": json.loads(body)})
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T0/B0/secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(status: int = 200) -> Receiver:
        made.append(Receiver(status))
        return made[-1]

    yield make
    for r in made:
        r.close()


def sns_event(message: str, subject: str | None = None) -> dict:
    # The shape of an SNS notification delivered to Lambda (Records[].Sns).
    return {"Records": [{"EventSource": "aws:sns", "Sns": {"Type": "Notification", "Subject": subject,
                                                             "Message": message}}]}


ALARM = {"AlarmName": "gpufleet-prod-old-jobs", "AlarmDescription": "A job has waited over 60 minutes for a node",
         "NewStateValue": "ALARM", "NewStateReason": "Threshold Crossed: 12 datapoints were greater than 0.0",
         "Region": "EU (Stockholm)"}


def test_an_alarm_becomes_one_line_in_every_channel(receivers, monkeypatch):
    a, b = receivers(), receivers()
    monkeypatch.setenv(chat_forwarder.WEBHOOKS_ENV, json.dumps([a.url, b.url]))
    result = chat_forwarder.handler(sns_event(json.dumps(ALARM), "ALARM: gpufleet-prod-old-jobs"))
    assert result == {"posted": 2}
    text = ("🔴 gpufleet-prod-old-jobs is ALARM: A job has waited over 60 minutes for a node "
            "(Threshold Crossed: 12 datapoints were greater than 0.0)")
    assert a.posts == b.posts == [{"type": "application/json", "body": {"text": text}}]


def test_other_notifications_pass_with_their_subject(receivers, monkeypatch):
    a = receivers()
    monkeypatch.setenv(chat_forwarder.WEBHOOKS_ENV, json.dumps([a.url]))
    chat_forwarder.handler(sns_event("You have exceeded 80% of your budget gpufleet-prod-monthly.",
                                     "AWS Budgets: gpufleet-prod-monthly has exceeded your alert threshold"))
    assert a.posts[0]["body"]["text"] == ("AWS Budgets: gpufleet-prod-monthly has exceeded your alert threshold: "
                                          "You have exceeded 80% of your budget gpufleet-prod-monthly.")
    assert chat_forwarder.render(None, json.dumps({"AlarmName": "x", "NewStateValue": "OK"})) == "🟢 x is OK"


def test_a_failed_post_raises_so_lambda_retries(receivers, monkeypatch):
    down = receivers(status=500)
    monkeypatch.setenv(chat_forwarder.WEBHOOKS_ENV, json.dumps([down.url]))
    with pytest.raises(urllib.error.HTTPError):
        chat_forwarder.handler(sns_event(json.dumps(ALARM)))
    assert len(down.posts) == 1
