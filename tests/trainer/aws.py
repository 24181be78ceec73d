"""AWS test helpers: a moto autoscaling group, job-queue messages and counts, and a client whose
lifecycle-action calls (which moto lacks) go to a botocore Stubber while every other call goes to
the moto server."""
from __future__ import annotations

import json

import boto3
from botocore.stub import Stubber

STUBBED = ("complete_lifecycle_action", "record_lifecycle_action_heartbeat")


class LifecycleStubbed:
    def __init__(self):
        self.real = boto3.client("autoscaling")
        self.stubbed = boto3.client("autoscaling")
        self.stub = Stubber(self.stubbed)
        self.stub.activate()

    def expect_complete(self, asg: str, hook: str, instance_id: str, result: str) -> None:
        self.stub.add_response("complete_lifecycle_action", {}, {
            "LifecycleHookName": hook, "AutoScalingGroupName": asg, "InstanceId": instance_id,
            "LifecycleActionResult": result})

    def __getattr__(self, name):
        return getattr(self.stubbed if name in STUBBED else self.real, name)


def make_group(name: str = "gpu", instance_type: str = "g5.xlarge", size: int = 1) -> list[str]:
    """A moto autoscaling group of ``size`` InService instances; returns their ids."""
    ec2 = boto3.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="eu-west-1a")["Subnet"]
    image = ec2.describe_images()["Images"][0]["ImageId"]
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={"ImageId": image,
                                                                            "InstanceType": instance_type})
    autoscaling = boto3.client("autoscaling")
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=size, DesiredCapacity=size,
        LaunchTemplate={"LaunchTemplateName": name}, VPCZoneIdentifier=subnet["SubnetId"])
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    return [i["InstanceId"] for i in group["Instances"]]


def send(sqs, url, job_id, args) -> None:
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"job_id": job_id, "args": args}))


def counts(sqs, url) -> tuple[int, int]:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])
