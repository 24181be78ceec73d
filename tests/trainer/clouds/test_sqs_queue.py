"""The bridge's SQS queue (trainer.clouds.aws.SqsJobQueue) against moto server."""
import time

import boto3

from trainer.clouds import aws


def test_a_message_received_by_a_bridge_that_died_is_visible_again_long_before_the_queues_timeout(moto_endpoint,
                                                                                                 monkeypatch):
    # the box's kill -9 test: a bridge killed inside its long poll never saw the message the poll took; with the
    # queue's 900 s visibility the job waited a quarter of an hour
    url = boto3.client("sqs").create_queue(QueueName="reappears", Attributes={"VisibilityTimeout": "900"})["QueueUrl"]
    monkeypatch.setattr(aws, "RECEIVE_VISIBILITY_S", 1)
    dead, alive = aws.SqsJobQueue(url), aws.SqsJobQueue(url)
    alive.client.send_message(QueueUrl=url, MessageBody='{"job_id": "j1"}')
    taken = dead.receive(1)
    assert taken is not None and alive.receive(0) is None  # hidden while the first holder may still submit it
    time.sleep(1.5)
    again = alive.receive(1)
    assert again is not None and again.id == taken.id and again.receive_count == 2
