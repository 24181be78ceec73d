"""The job queue on Azure Storage queues, against Azurite over real HTTP on loopback."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.trainer.azurite import ACCOUNT, Azurite
from trainer.clouds.azure import AzureJobQueue, parse_url
from trainer.errors import UsageError
from trainer.jobs.queue import open_queue

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def azurite():
    with Azurite() as az:
        yield az


@pytest.fixture
def queue_url(azurite, monkeypatch):
    """A fresh queue and its poison queue; the standard URL, pointed at Azurite by the connection string."""
    from azure.storage.queue import QueueServiceClient

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    service = QueueServiceClient.from_connection_string(azurite.connection_string)
    service.create_queue(name)
    service.create_queue(f"{name}-poison")
    return f"https://{ACCOUNT}.queue.core.windows.net/{name}"


def test_open_queue_picks_azure_for_a_storage_queue_url(queue_url):
    assert isinstance(open_queue(queue_url), AzureJobQueue)


def test_send_receive_delete(queue_url):
    q = AzureJobQueue(queue_url, poll_s=0.1)
    body = json.dumps({"job_id": "j-1", "args": ["--steps", "10", "--note", "a&b<c>'\""]})
    q.send(body)
    msg = q.receive(wait_s=5)
    assert msg.body == body and msg.receive_count == 1
    assert q.client.get_queue_properties().approximate_message_count == 1  # a leased job still counts
    assert q.receive(wait_s=0) is None  # leased: hidden from other receivers
    q.delete(msg)
    assert q.client.peek_messages() == []


def test_jobs_do_not_expire_while_they_wait(queue_url):
    q = AzureJobQueue(queue_url)
    q.send("job")
    (peeked,) = q.client.peek_messages()
    assert peeked.expires_on.year == 9999  # time-to-live -1: no 7-day default expiry


def test_receive_waits_then_gives_up_on_an_empty_queue(queue_url):
    q = AzureJobQueue(queue_url, poll_s=0.1)
    assert q.receive(wait_s=0) is None
    assert q.receive(wait_s=1) is None


def test_extend_survives_the_changing_pop_receipt(queue_url):
    from azure.core.exceptions import HttpResponseError

    q = AzureJobQueue(queue_url)
    q.send("job")
    msg = q.receive(wait_s=5)
    q.extend(msg, 900)
    q.extend(msg, 900)  # the second update needs the receipt the first one returned
    with pytest.raises(HttpResponseError):  # the receipt handed out at receive is void now
        q.client.delete_message(msg.id, msg.receipt)
    q.delete(msg)  # the queue uses the current receipt
    assert q.client.peek_messages() == []


def test_release_hands_the_job_to_the_next_receive(queue_url):
    q = AzureJobQueue(queue_url)
    q.send("job")
    first = q.receive(wait_s=5)
    q.extend(first, 900)
    q.release(first)
    again = q.receive(wait_s=5)
    assert (again.id, again.body, again.receive_count) == (first.id, "job", 2)


def test_an_expired_lease_redelivers(queue_url):
    q = AzureJobQueue(queue_url, visibility_s=1, poll_s=0.2)
    q.send("job")
    first = q.receive(wait_s=5)
    time.sleep(1.2)  # the receiver died: no extend
    again = q.receive(wait_s=5)
    assert again.id == first.id and again.receive_count == 2


def test_too_many_deliveries_move_the_message_to_the_poison_queue(queue_url):
    q = AzureJobQueue(queue_url, max_deliveries=2, poll_s=0.1)
    q.send("crashes the trainer")
    for _ in range(2):  # delivered twice, released twice (e.g. the node died each time)
        msg = q.receive(wait_s=5)
        assert msg.body == "crashes the trainer"
        q.release(msg)
    q.send("fine")
    nxt = q.receive(wait_s=5)
    assert nxt.body == "fine"  # the bad one is never handed out a third time
    q.delete(nxt)
    assert q.receive(wait_s=0) is None
    assert [m.content for m in q.poison.peek_messages()] == ["crashes the trainer"]
    assert q.client.peek_messages() == []


def test_dead_letter_moves_the_message_to_the_poison_queue_at_once(queue_url):
    q = AzureJobQueue(queue_url, poll_s=0.1)
    q.send("out of retries")
    q.dead_letter(q.receive(wait_s=5), "2 failure(s), retries.on_error is 1")
    assert q.receive(wait_s=0) is None
    assert [m.content for m in q.poison.peek_messages()] == ["out of retries"]


def test_retry_finds_the_poison_queue_from_the_queue_url_and_removes_only_that_jobs_copy(queue_url):
    """`gpufleet jobs retry` without --dlq-url: the poison queue is <queue>-poison; reading it there (each read a
    delivery) never moves its messages on to a poison queue of its own."""
    from trainer.jobs.commands import remove_dead_letter

    q = AzureJobQueue(queue_url, poll_s=0.1)
    poison = q.dead_letters()
    assert poison.url == queue_url + "-poison" and poison.dead_letters() is None
    for job in ("a", "b"):
        q.send(json.dumps({"job_id": job}))
        q.dead_letter(q.receive(wait_s=5), "out of retries")
    poison.max_deliveries = 1
    for _ in range(3):  # every message read and put back, more often than max_deliveries
        assert remove_dead_letter(poison, "nope", wait_s=0) == 0
    assert remove_dead_letter(poison, "a", wait_s=0) == 1
    assert [json.loads(m.content)["job_id"] for m in poison.client.peek_messages()] == ["b"]


@pytest.mark.parametrize("url", [
    "https://acc.queue.core.windows.net/",
    "https://acc.queue.core.windows.net/a/b",
    "http://acc.queue.core.windows.net/jobs",
    "https://acc.blob.core.windows.net/jobs",
])
def test_bad_queue_url_is_one_usage_line(url):
    with pytest.raises(UsageError, match=r"^--queue-url: .* Azure Storage queue URL") as err:
        parse_url(url)
    assert "\n" not in str(err.value)
