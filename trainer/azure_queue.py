"""The agent's job queue on Azure Storage queues: ``https://<account>.queue.core.windows.net/<queue>``.

Differences from SQS, handled here:
- No long polling: ``receive`` polls until ``wait_s`` has passed.
- Every update of a message (extend, release) returns a new pop receipt and voids the old one; the
  queue keeps the current receipt per message id, so callers can go on using the Message they got.
- No dead-letter queue: a message delivered more than ``max_deliveries`` times is moved to
  ``<queue>-poison`` (as Azure Functions does) instead of being handed out again.
- No cap on time in flight (each update may hide a message for up to 7 days), and messages are sent
  without expiry (the default time-to-live would drop a job that waits 7 days).
Message bodies are base64-encoded text, the encoding Azure Functions and the portal use.
"""
from __future__ import annotations

import logging
import threading
import time
from urllib.parse import urlparse

from trainer.azure_auth import connection_string, credential
from trainer.errors import UsageError
from trainer.jobqueue import JobQueue, Message

log = logging.getLogger("gpufleet.azure_queue")

QUEUE_HOST = ".queue.core.windows.net"
MAX_DELIVERIES = 5       # Azure Functions' default maxDequeueCount
VISIBILITY_S = 600       # lease given on receive; the agent extends it while the job runs
POLL_S = 2.0


def parse_url(url: str) -> tuple[str, str]:
    """(account, queue) from https://<account>.queue.core.windows.net/<queue>."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    queue = parsed.path.strip("/")
    if parsed.scheme != "https" or not host.endswith(QUEUE_HOST) or not queue or "/" in queue:
        raise UsageError(f"--queue-url: {url!r} is not an Azure Storage queue URL "
                         f"(https://<account>{QUEUE_HOST}/<queue>)")
    return host[: -len(QUEUE_HOST)], queue


def _client(account: str, queue: str):
    from azure.storage.queue import QueueClient, TextBase64DecodePolicy, TextBase64EncodePolicy

    policies = {"message_encode_policy": TextBase64EncodePolicy(),
                "message_decode_policy": TextBase64DecodePolicy()}
    conn = connection_string(account)
    if conn:
        return QueueClient.from_connection_string(conn, queue, **policies)
    return QueueClient(f"https://{account}{QUEUE_HOST}", queue, credential=credential(), **policies)


class AzureJobQueue(JobQueue):
    max_in_flight_s = 10 * 365 * 86400.0  # no limit; finite for the agent's arithmetic

    def __init__(self, url: str, *, visibility_s: int = VISIBILITY_S, max_deliveries: int = MAX_DELIVERIES,
                 poll_s: float = POLL_S):
        account, name = parse_url(url)
        self.url = url
        self.client = _client(account, name)
        self.poison = _client(account, f"{name}-poison")
        self.visibility_s = visibility_s
        self.max_deliveries = max_deliveries
        self.poll_s = poll_s
        self._receipts: dict[str, str] = {}  # message id -> current pop receipt
        self._lock = threading.Lock()

    def receive(self, wait_s: int) -> Message | None:
        deadline = time.monotonic() + wait_s
        while True:
            m = self.client.receive_message(visibility_timeout=self.visibility_s)
            if m is not None and m.dequeue_count > self.max_deliveries:
                self._to_poison(m)
                continue
            if m is not None:
                with self._lock:
                    self._receipts[m.id] = m.pop_receipt
                return Message(m.id, m.content, m.pop_receipt, m.dequeue_count)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(self.poll_s, left))

    def _to_poison(self, m) -> None:
        log.warning("message %s delivered %d times (max %d): moved to the poison queue",
                    m.id, m.dequeue_count, self.max_deliveries)
        self.poison.send_message(m.content)
        self.client.delete_message(m.id, m.pop_receipt)

    def extend(self, msg: Message, visibility_s: int) -> None:
        with self._lock:
            receipt = self._receipts.get(msg.id, msg.receipt)
            updated = self.client.update_message(msg.id, pop_receipt=receipt, visibility_timeout=int(visibility_s))
            self._receipts[msg.id] = updated.pop_receipt

    def release(self, msg: Message) -> None:
        self.extend(msg, 0)
        with self._lock:
            self._receipts.pop(msg.id, None)  # visible again: the next receive gets a new receipt

    def delete(self, msg: Message) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        with self._lock:
            receipt = self._receipts.pop(msg.id, msg.receipt)
            try:
                self.client.delete_message(msg.id, receipt)
            except ResourceNotFoundError:
                pass  # already deleted

    def send(self, body: str) -> str:
        return self.client.send_message(body, time_to_live=-1).id
