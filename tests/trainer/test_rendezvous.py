"""Gang rendezvous from the autoscaling group (moto server: autoscaling + EC2 over real HTTP)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import boto3
import pytest

from infra.demo.imds import FakeImds
from tests.trainer.gated import ROOT
from trainer.node.rendezvous import Gang, RendezvousError, discover, form, order, wait_for_head


def test_order_is_numeric():
    assert order(["10.0.0.10", "10.0.0.9", "10.0.1.2", "10.0.0.9"]) == ("10.0.0.9", "10.0.0.10", "10.0.1.2")


def test_form_and_torchrun_args():
    gang = form(["10.0.0.10", "10.0.0.9", "10.0.0.11"], "10.0.0.10", 3)
    assert gang == Gang(("10.0.0.9", "10.0.0.10", "10.0.0.11"), 1)
    assert gang.torchrun_args("job-1") == ["--nnodes", "3", "--node-rank", "1", "--rdzv-backend", "c10d",
                                           "--rdzv-endpoint", "10.0.0.9:29400", "--rdzv-id", "job-1"]
    with pytest.raises(RendezvousError, match="2 of 3 nodes in service"):
        form(["10.0.0.1", "10.0.0.2"], "10.0.0.1", 3)
    with pytest.raises(RendezvousError, match="not among the first 2"):
        form(["10.0.0.1", "10.0.0.2", "10.0.0.3"], "10.0.0.3", 2)


@pytest.fixture
def group(moto_endpoint):
    """Four InService instances in two subnets. The addresses are on loopback (moto accepts the range)
    so that a connection to the head is answered here, and refused while nothing listens."""
    ec2 = boto3.client("ec2")
    autoscaling = boto3.client("autoscaling")
    vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"127.0.{i}.0/24", AvailabilityZone=f"eu-west-1{az}")
               ["Subnet"]["SubnetId"] for i, az in ((1, "a"), (2, "b"))]
    image = ec2.describe_images()["Images"][0]["ImageId"]
    ec2.create_launch_template(LaunchTemplateName="gang", LaunchTemplateData={"ImageId": image,
                                                                               "InstanceType": "p5.48xlarge"})
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="gang", MinSize=4, MaxSize=4, DesiredCapacity=4,
        LaunchTemplate={"LaunchTemplateName": "gang"}, VPCZoneIdentifier=",".join(subnets))
    return autoscaling, ec2


def test_every_node_chooses_the_same_head(group):
    autoscaling, ec2 = group
    instances = ec2.describe_instances()["Reservations"]
    ips = [i["PrivateIpAddress"] for r in instances for i in r["Instances"]]
    assert len(ips) == 4
    gangs = [discover("gang", ip, 4, autoscaling, ec2, timeout_s=0) for ip in ips]
    assert {g.head for g in gangs} == {order(ips)[0]}
    assert sorted(g.node_rank for g in gangs) == [0, 1, 2, 3]
    assert all(g.members == order(ips) for g in gangs)


def test_standby_instance_is_not_a_member(group):
    autoscaling, ec2 = group
    members = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gang"])["AutoScalingGroups"][0]
    first = members["Instances"][0]["InstanceId"]
    autoscaling.enter_standby(AutoScalingGroupName="gang", InstanceIds=[first],
                              ShouldDecrementDesiredCapacity=True)
    ip = ec2.describe_instances(InstanceIds=[first])["Reservations"][0]["Instances"][0]["PrivateIpAddress"]
    with pytest.raises(RendezvousError, match=r"3 of 4 nodes in service after 0s"):
        discover("gang", ip, 4, autoscaling, ec2, timeout_s=0)


def test_missing_group_is_one_line(moto_endpoint):
    with pytest.raises(RendezvousError, match="autoscaling group 'nope' not found"):
        discover("nope", "10.0.0.1", 2, boto3.client("autoscaling"), boto3.client("ec2"), timeout_s=0)


def test_unreachable_head_fails_clearly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RendezvousError, match=rf"cannot reach the rendezvous head 127.0.0.1:{port} within 0s"):
        wait_for_head("127.0.0.1", port, timeout_s=0.2, poll_s=0.05)


def test_reachable_head():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        wait_for_head("127.0.0.1", s.getsockname()[1], timeout_s=5)


def test_cli_prints_torchrun_flags_on_the_head_and_fails_clearly_elsewhere(group, tmp_path):
    autoscaling, ec2 = group
    ips = order([i["PrivateIpAddress"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]])
    node = tmp_path / "node.json"
    node.write_text(json.dumps({"asg_name": "gang", "node_count": 4, "region": "eu-west-1"}))
    for ip in (ips[0], ips[1]):
        with FakeImds(private_ip=ip) as imds:
            env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "false",
                   "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint}
            proc = subprocess.run([sys.executable, "-m", "trainer", "rendezvous", "--job-id", "llm-7",
                                   "--node-json", str(node), "--timeout", "0.5"],
                                  cwd=ROOT, env=env, capture_output=True, text=True)
        if ip == ips[0]:  # the head hosts the c10d store: nothing to wait for
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout.split() == ["--nnodes", "4", "--node-rank", "0", "--rdzv-backend", "c10d",
                                           "--rdzv-endpoint", f"{ips[0]}:29400", "--rdzv-id", "llm-7"]
        else:  # no torchrun on the head yet: the connection is refused until the timeout
            assert proc.returncode == 1
            assert proc.stderr.strip().splitlines()[-1].startswith(
                f"error: gang: cannot reach the rendezvous head {ips[0]}:29400 within 0s")
