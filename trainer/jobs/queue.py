"""The job queue interface (submit sends, the bridge receives), its messages, and the registry of the clouds' queues
(trainer.clouds.<cloud>.open_queue: SQS, Azure Storage queues, TDMQ CMQ)."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from trainer.clouds import adapter
from trainer.errors import UsageError

# Queue URL host suffix -> the trainer.clouds module whose queue it is; any other http(s) URL is SQS's
# (or an SQS-compatible endpoint such as moto's).
QUEUE_HOSTS = {".queue.core.windows.net": "azure", ".mqadapter.cmq.tencentyun.com": "tencent",
               ".tencenttdmq.com": "tencent"}


@dataclass(frozen=True)
class Message:
    id: str
    body: str
    receipt: str
    receive_count: int


class JobQueue:
    """At-least-once delivery: a received message stays hidden until deleted or its visibility ends."""

    def receive(self, wait_s: int) -> Message | None:
        raise NotImplementedError

    def extend(self, msg: Message, visibility_s: int) -> None:
        raise NotImplementedError

    def release(self, msg: Message) -> None:
        """Make the message visible again at once (visibility 0)."""
        self.extend(msg, 0)

    def delete(self, msg: Message) -> None:
        raise NotImplementedError

    def dead_letter(self, msg: Message, reason: str) -> None:
        """Move the message to the queue's dead-letter queue now (an invalid job): SQS the
        RedrivePolicy's target, Azure ``<queue>-poison``, TDMQ CMQ ``<queue>-dead``."""
        raise NotImplementedError

    def send(self, body: str) -> str:
        raise NotImplementedError

    def dead_letters(self) -> "JobQueue | None":
        """The queue :meth:`dead_letter` moves messages to (where `retry` takes a job's copy back), or None."""
        return None


def open_queue(url: str, region: str | None = None) -> JobQueue:
    """SQS for SQS URLs; an Azure Storage queue for https://<account>.queue.core.windows.net/<queue>; TDMQ CMQ
    for http://<region code>.mqadapter.cmq.tencentyun.com/<queue> (or the tencenttdmq.com public endpoint)."""
    host = urlparse(url).hostname or ""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--queue-url: {url!r} is not a queue URL (an SQS or Azure Storage queue https URL)")
    cloud = next((c for suffix, c in QUEUE_HOSTS.items() if host.endswith(suffix)), "aws")
    return adapter(cloud).open_queue(url, region)
