"""The queue-mode scaler: a Serverless Cloud Function that a timer runs every minute.

Tencent Auto Scaling's alarm policies see only CPU, memory and traffic of the group's own instances, and
Cloud Monitor can trigger a scaling policy but not set a size computed from another product's metric.
So this function does what the AWS stack's step policy does: nodes = waiting + running jobs (one job per
node), from nodes.min (0) to nodes.max. It reads the job queue's counts with TDMQ's
DescribeCmqQueueDetail (ActiveMsgNum: waiting; InactiveMsgNum: received, not yet deleted) and sets the
group with Auto Scaling's ModifyDesiredCapacity, both API 3.0 calls signed with the function role's
temporary key (SCF puts it in TENCENTCLOUD_SECRETID/SECRETKEY/SESSIONTOKEN). Scale-in removes unprotected
nodes only: a node protects itself while it runs a job.

Standard library only: SCF runs this file from a zip, with infra/scaling.py and the trainer's
Tencent wire protocols (trainer/clouds/tencent_api.py) beside it.
"""
from __future__ import annotations

import json
import os

try:
    from infra.scaling import desired_for_backlog
    from trainer.clouds.tencent_api import Api, StaticCredentials, env_credentials
except ImportError:  # in the function's zip
    from scaling import desired_for_backlog  # type: ignore[no-redef]
    from tencent_api import Api, StaticCredentials, env_credentials  # type: ignore[no-redef]

TDMQ = ("tdmq", "2020-02-17")
AS = ("as", "2018-04-19")


def scale(api: Api, queue: str, group_id: str, min_size: int, max_size: int) -> dict:
    """One pass: the wanted node count for the queue's backlog, set on the group."""
    detail = api.call(*TDMQ, "DescribeCmqQueueDetail", {"QueueName": queue})["QueueDescribe"]
    waiting, running = int(detail.get("ActiveMsgNum") or 0), int(detail.get("InactiveMsgNum") or 0)
    desired = desired_for_backlog(waiting, running, min_size, max_size)
    api.call(*AS, "ModifyDesiredCapacity", {"AutoScalingGroupId": group_id, "DesiredCapacity": desired})
    return {"waiting": waiting, "running": running, "desired": desired}


def main_handler(event, context, env=os.environ) -> dict:
    """SCF entry point (timer trigger)."""
    creds = env_credentials(env)
    if creds is None:
        raise RuntimeError("no key in the environment: give the function its CAM role")
    api = Api(StaticCredentials(creds), env["GPUFLEET_REGION"])
    result = scale(api, env["GPUFLEET_QUEUE"], env["GPUFLEET_GROUP_ID"], int(env["GPUFLEET_MIN"]),
                   int(env["GPUFLEET_MAX"]))
    print(json.dumps(result))
    return result
