"""AWS Lambda handler: post the alert topic's notifications to chat incoming webhooks.

SNS cannot deliver to a chat webhook itself (Slack, Teams or Google Chat never confirm an SNS HTTPS
subscription), so the stack subscribes this function to the alert topic. It turns a CloudWatch alarm
notification into one line (alarm, new state, description, reason) and any other message (AWS Budgets)
into its subject and text, and posts `{"text": ...}` to every URL in `GPUFLEET_CHAT_WEBHOOKS` (a JSON
list). A failed post raises, so Lambda retries the asynchronous invocation. Standard library only: the
stack ships this file as the function's code.
"""
from __future__ import annotations

import json
import os
import urllib.request

WEBHOOKS_ENV = "GPUFLEET_CHAT_WEBHOOKS"
TIMEOUT_S = 10
STATE_MARK = {"ALARM": "🔴", "OK": "🟢", "INSUFFICIENT_DATA": "⚪"}


def render(subject: str | None, message: str) -> str:
    """The chat text of one SNS notification."""
    try:
        alarm = json.loads(message)
    except ValueError:
        alarm = None
    if isinstance(alarm, dict) and "AlarmName" in alarm and "NewStateValue" in alarm:
        state = alarm["NewStateValue"]
        text = f"{STATE_MARK.get(state, '')} {alarm['AlarmName']} is {state}".strip()
        if alarm.get("AlarmDescription"):
            text += f": {alarm['AlarmDescription']}"
        if alarm.get("NewStateReason"):
            text += f" ({alarm['NewStateReason']})"
        return text
    return f"{subject}: {message}" if subject else message


def post(url: str, text: str) -> None:
    request = urllib.request.Request(url, data=json.dumps({"text": text}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # raises on HTTP errors
        response.read()


def handler(event: dict, context=None) -> dict:
    urls = json.loads(os.environ[WEBHOOKS_ENV])
    sent = 0
    for record in event.get("Records", []):
        sns = record.get("Sns", {})
        text = render(sns.get("Subject"), sns.get("Message", ""))
        for url in urls:
            post(url, text)
            sent += 1
    return {"posted": sent}
