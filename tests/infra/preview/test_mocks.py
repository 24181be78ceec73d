"""The offline provider answers: realistic formats, deterministic, explicit about what they lack."""
from __future__ import annotations

import json
import ipaddress
import re

import pytest
from pulumi.runtime import MockCallArgs, MockResourceArgs

from infra.preview.mocks import MissingMock, PreviewMocks

M = PreviewMocks("dev", "eu-west-1")


def new(typ, name, /, **inputs):
    return M.new_resource(MockResourceArgs(typ=typ, name=name, inputs=inputs, custom=True))


def call(token, **args):
    return M.call(MockCallArgs(token=token, args=args, provider=""))


def test_bucket_is_auto_named_lowercase_with_its_arn_and_domain():
    rid, state = new("aws:s3/bucket:Bucket", "Data", tags={"team": "ml"})
    assert re.fullmatch(r"data-[0-9a-f]{7}", rid)
    assert state["bucket"] == rid and state["arn"] == f"arn:aws:s3:::{rid}"
    assert state["bucketRegionalDomainName"] == f"{rid}.s3.eu-west-1.amazonaws.com"
    assert state["tagsAll"] == {"team": "ml"} and state["tags"] == {"team": "ml"}
    assert new("aws:s3/bucket:Bucket", "x", bucket="given-name")[0] == "given-name"
    assert new("aws:s3/bucketPolicy:BucketPolicy", "p", bucket=rid, policy="{}")[0] == rid


def test_ids_are_deterministic_and_differ_per_stack_and_name():
    assert new("aws:s3/bucket:Bucket", "data") == new("aws:s3/bucket:Bucket", "data")
    assert new("aws:s3/bucket:Bucket", "data")[0] != new("aws:s3/bucket:Bucket", "logs")[0]
    other = PreviewMocks("prod", "eu-west-1").new_resource(
        MockResourceArgs(typ="aws:s3/bucket:Bucket", name="data", inputs={}))
    assert other[0] != new("aws:s3/bucket:Bucket", "data")[0]


@pytest.mark.parametrize("typ, inputs, id_re, arn_re", [
    ("aws:sqs/queue:Queue", {}, r"https://sqs\.eu-west-1\.amazonaws\.com/123456789012/q-[0-9a-f]{7}",
     r"arn:aws:sqs:eu-west-1:123456789012:q-[0-9a-f]{7}"),
    ("aws:sqs/queue:Queue", {"name": "jobs.fifo", "fifoQueue": True},
     r"https://sqs\.eu-west-1\.amazonaws\.com/123456789012/jobs\.fifo", r"arn:aws:sqs:eu-west-1:123456789012:jobs\.fifo"),
    ("aws:kms/key:Key", {}, r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-8[0-9a-f]{3}-[0-9a-f]{12}",
     r"arn:aws:kms:eu-west-1:123456789012:key/[0-9a-f-]{36}"),
    ("aws:iam/role:Role", {}, r"q-[0-9a-f]{7}", r"arn:aws:iam::123456789012:role/q-[0-9a-f]{7}"),
    ("aws:iam/instanceProfile:InstanceProfile", {"name": "node"}, r"node",
     r"arn:aws:iam::123456789012:instance-profile/node"),
    ("aws:iam/policy:Policy", {"path": "/gpufleet/"}, r"arn:aws:iam::123456789012:policy/gpufleet/q-[0-9a-f]{7}",
     r"arn:aws:iam::123456789012:policy/gpufleet/q-[0-9a-f]{7}"),
    ("aws:ec2/vpc:Vpc", {}, r"vpc-[0-9a-f]{17}", r"arn:aws:ec2:eu-west-1:123456789012:vpc/vpc-[0-9a-f]{17}"),
    ("aws:ec2/subnet:Subnet", {}, r"subnet-[0-9a-f]{17}", r"arn:aws:ec2:eu-west-1:123456789012:subnet/subnet-.*"),
    ("aws:ec2/securityGroup:SecurityGroup", {}, r"sg-[0-9a-f]{17}", r"arn:aws:ec2:.*:security-group/sg-.*"),
    ("aws:ec2/launchTemplate:LaunchTemplate", {}, r"lt-[0-9a-f]{17}", r"arn:aws:ec2:.*:launch-template/lt-.*"),
    ("aws:ec2/placementGroup:PlacementGroup", {"strategy": "cluster"}, r"q-[0-9a-f]{7}",
     r"arn:aws:ec2:eu-west-1:123456789012:placement-group/q-[0-9a-f]{7}"),
    ("aws:ec2/instance:Instance", {}, r"i-[0-9a-f]{17}", r"arn:aws:ec2:eu-west-1:123456789012:instance/i-[0-9a-f]{17}"),
    ("aws:ec2/networkInterface:NetworkInterface", {}, r"eni-[0-9a-f]{17}",
     r"arn:aws:ec2:eu-west-1:123456789012:network-interface/eni-[0-9a-f]{17}"),
    ("aws:efs/fileSystem:FileSystem", {}, r"fs-[0-9a-f]{17}",
     r"arn:aws:elasticfilesystem:eu-west-1:123456789012:file-system/fs-[0-9a-f]{17}"),
    ("aws:efs/accessPoint:AccessPoint", {}, r"fsap-[0-9a-f]{17}",
     r"arn:aws:elasticfilesystem:eu-west-1:123456789012:access-point/fsap-[0-9a-f]{17}"),
    ("aws:secretsmanager/secret:Secret", {"namePrefix": "gpufleet-dev-munge-"},
     r"arn:aws:secretsmanager:eu-west-1:123456789012:secret:gpufleet-dev-munge-[0-9a-f]{8}-[0-9a-f]{6}",
     r"arn:aws:secretsmanager:eu-west-1:123456789012:secret:gpufleet-dev-munge-[0-9a-f]{8}-[0-9a-f]{6}"),
    ("aws:cloudwatch/logGroup:LogGroup", {"name": "/gpufleet/dev"}, r"/gpufleet/dev",
     r"arn:aws:logs:eu-west-1:123456789012:log-group:/gpufleet/dev"),
    ("aws:cloudwatch/metricAlarm:MetricAlarm", {}, r"q-[0-9a-f]{7}", r"arn:aws:cloudwatch:eu-west-1:123456789012:alarm:q-.*"),
    ("aws:budgets/budget:Budget", {"name": "gpu"}, r"123456789012:gpu", r"arn:aws:budgets::123456789012:budget/gpu"),
    ("aws:sns/topic:Topic", {}, r"arn:aws:sns:eu-west-1:123456789012:q-[0-9a-f]{7}", r"arn:aws:sns:.*:q-[0-9a-f]{7}"),
    ("aws:ssm/parameter:Parameter", {"name": "/x"}, r"/x", r"arn:aws:ssm:eu-west-1:123456789012:parameter/x"),
])
def test_aws_ids_and_arns_have_the_providers_shapes(typ, inputs, id_re, arn_re):
    rid, state = new(typ, "q", **inputs)
    assert re.fullmatch(id_re, rid), rid
    assert re.fullmatch(arn_re, state["arn"]), state["arn"]


def test_vpc_endpoint_and_subnet_details():
    _, gw = new("aws:ec2/vpcEndpoint:VpcEndpoint", "s3", serviceName="com.amazonaws.eu-west-1.s3",
                vpcEndpointType="Gateway")
    assert gw["prefixListId"].startswith("pl-")
    _, itf = new("aws:ec2/vpcEndpoint:VpcEndpoint", "sqs", serviceName="com.amazonaws.eu-west-1.sqs",
                 vpcEndpointType="Interface")
    assert itf["dnsEntries"][0]["dnsName"].endswith(".sqs.eu-west-1.vpce.amazonaws.com")
    _, subnet = new("aws:ec2/subnet:Subnet", "a", availabilityZone="eu-west-1b")
    assert subnet["availabilityZone"] == "eu-west-1b" and subnet["availabilityZoneId"] == "euw1-az2"


def test_azure_resource_ids():
    rg_id, rg = new("azure-native:resources:ResourceGroup", "gpu")
    assert re.fullmatch(r"/subscriptions/[0-9a-f-]{36}/resourceGroups/gpu[0-9a-f]{7}", rg_id)
    acct_id, acct = new("azure-native:storage:StorageAccount", "data-store", resourceGroupName=rg["name"])
    assert acct_id == f"{rg_id}/providers/Microsoft.Storage/storageAccounts/{acct['name']}"
    assert re.fullmatch(r"[a-z0-9]{3,24}", acct["name"])
    assert acct["primaryEndpoints"]["blob"] == f"https://{acct['name']}.blob.core.windows.net/"
    cid, _ = new("azure-native:storage:BlobContainer", "ckpt", resourceGroupName=rg["name"],
                 accountName=acct["name"], containerName="checkpoints")
    assert cid == f"{acct_id}/blobServices/default/containers/checkpoints"
    mid, ident = new("azure-native:managedidentity:UserAssignedIdentity", "node", resourceGroupName=rg["name"],
                     resourceName="node-id")
    assert mid.endswith("/providers/Microsoft.ManagedIdentity/userAssignedIdentities/node-id")
    assert re.fullmatch(r"[0-9a-f-]{36}", ident["clientId"]) and ident["clientId"] != ident["principalId"]
    sid, _ = new("azure-native:network:Subnet", "nodes", resourceGroupName=rg["name"],
                 virtualNetworkName="vnet", subnetName="nodes")
    assert sid.endswith("/providers/Microsoft.Network/virtualNetworks/vnet/subnets/nodes")


def test_invokes():
    ident = call("aws:index/getCallerIdentity:getCallerIdentity")
    assert ident["accountId"] == "123456789012" and ident["arn"].startswith("arn:aws:iam::123456789012:")
    assert call("aws:index/getRegion:getRegion")["name"] == "eu-west-1"
    assert call("aws:index/getAvailabilityZones:getAvailabilityZones", state="available")["names"] == [
        "eu-west-1a", "eu-west-1b", "eu-west-1c"]
    ami = call("aws:ec2/getAmi:getAmi", owners=["self"], mostRecent=True,
               filters=[{"name": "name", "values": ["gpufleet-gpu-*"]}])
    assert re.fullmatch(r"ami-[0-9a-f]{17}", ami["id"]) and ami["name"].startswith("gpufleet-gpu-")
    assert ami["ownerId"] == "123456789012"
    client = call("azure-native:authorization:getClientConfig")
    assert set(client) == {"clientId", "objectId", "subscriptionId", "tenantId"}


def test_policy_document_renders_like_the_provider():
    out = call("aws:iam/getPolicyDocument:getPolicyDocument", statements=[
        {"sid": "Tls", "effect": "Deny", "actions": ["s3:*"], "resources": ["arn:aws:s3:::b", "arn:aws:s3:::b/*"],
         "principals": [{"type": "*", "identifiers": ["*"]}],
         "conditions": [{"test": "NumericLessThan", "variable": "s3:TlsVersion", "values": ["1.2"]},
                        {"test": "Bool", "variable": "aws:SecureTransport", "values": ["false"]}]},
        {"actions": ["sqs:SendMessage"], "resources": ["arn:aws:sqs:eu-west-1:1:q"]}])
    doc = json.loads(out["json"])
    assert doc == {"Version": "2012-10-17", "Statement": [
        {"Sid": "Tls", "Effect": "Deny", "Action": "s3:*", "Resource": ["arn:aws:s3:::b", "arn:aws:s3:::b/*"],
         "Principal": {"*": "*"},
         "Condition": {"NumericLessThan": {"s3:TlsVersion": "1.2"}, "Bool": {"aws:SecureTransport": "false"}}},
        {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:eu-west-1:1:q"}]}
    assert json.loads(out["minifiedJson"]) == doc


def test_unknown_invoke_is_an_error_not_an_empty_result():
    with pytest.raises(MissingMock, match="aws:ec2/getInstanceType:getInstanceType"):
        call("aws:ec2/getInstanceType:getInstanceType", instanceType="p5.48xlarge")


def test_a_network_interface_and_an_instance_have_a_private_address_in_the_stack_vpc():
    _, eni = new("aws:ec2/networkInterface:NetworkInterface", "controller")
    _, instance = new("aws:ec2/instance:Instance", "controller")
    for ip in (eni["privateIp"], instance["privateIp"]):
        assert ipaddress.ip_address(ip) in ipaddress.ip_network("10.42.0.0/19")
    assert eni == new("aws:ec2/networkInterface:NetworkInterface", "controller")[1]
    assert new("aws:efs/fileSystem:FileSystem", "shared")[1]["dnsName"].endswith(".efs.eu-west-1.amazonaws.com")


def test_registry_answers_like_ecr_and_acr():
    rid, repo = new("aws:ecr/repository:Repository", "images", name="gpufleet-dev")
    assert rid == repo["name"] == "gpufleet-dev" and repo["registryId"] == "123456789012"
    assert repo["repositoryUrl"] == "123456789012.dkr.ecr.eu-west-1.amazonaws.com/gpufleet-dev"
    assert repo["arn"] == "arn:aws:ecr:eu-west-1:123456789012:repository/gpufleet-dev"
    assert new("aws:ecr/pullThroughCacheRule:PullThroughCacheRule", "r", ecrRepositoryPrefix="ecr-public",
               upstreamRegistryUrl="public.ecr.aws")[0] == "ecr-public"
    assert new("aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate", "t", prefix="k8s")[0] == "k8s"
    assert new("aws:ecr/lifecyclePolicy:LifecyclePolicy", "l", repository="gpufleet-dev")[0] == "gpufleet-dev"
    secret = call("aws:secretsmanager/getSecret:getSecret", name="ecr-pullthroughcache/hub")
    assert re.fullmatch(r"arn:aws:secretsmanager:eu-west-1:123456789012:secret:ecr-pullthroughcache/hub-[0-9a-f]{6}",
                        secret["arn"]) and "secretString" not in secret
    rg = "/subscriptions/00000000-0000-4000-8000-000000000001/resourceGroups/gpu"
    acr_id, acr = new("azure-native:containerregistry:Registry", "r", registryName="gpufleetdev0a1b2c3d",
                      resourceGroupName="gpu")
    assert acr_id == f"{rg}/providers/Microsoft.ContainerRegistry/registries/gpufleetdev0a1b2c3d"
    assert acr["loginServer"] == "gpufleetdev0a1b2c3d.azurecr.io"
    zone_id, _ = new("azure-native:privatedns:PrivateZone", "z", privateZoneName="privatelink.azurecr.io",
                     resourceGroupName="gpu")
    assert zone_id == f"{rg}/providers/Microsoft.Network/privateDnsZones/privatelink.azurecr.io"
    link_id, _ = new("azure-native:privatedns:VirtualNetworkLink", "l", virtualNetworkLinkName="vnet",
                     privateZoneName="privatelink.azurecr.io", resourceGroupName="gpu")
    assert link_id == f"{zone_id}/virtualNetworkLinks/vnet"
    pe_id, _ = new("azure-native:network:PrivateEndpoint", "pe", privateEndpointName="acr", resourceGroupName="gpu")
    assert pe_id == f"{rg}/providers/Microsoft.Network/privateEndpoints/acr"
    group_id, _ = new("azure-native:network:PrivateDnsZoneGroup", "g", privateDnsZoneGroupName="registry",
                      privateEndpointName="acr", resourceGroupName="gpu")
    assert group_id == f"{pe_id}/privateDnsZoneGroups/registry"
T = PreviewMocks("tencent", "ap-shanghai")


@pytest.mark.parametrize("typ, inputs, id_re", [
    ("tencentcloud:Vpc/instance:Instance", {}, r"vpc-[0-9a-z]{8}"),
    ("tencentcloud:Subnet/instance:Instance", {}, r"subnet-[0-9a-z]{8}"),
    ("tencentcloud:Security/group:Group", {}, r"sg-[0-9a-z]{8}"),
    ("tencentcloud:Cvm/launchTemplate:LaunchTemplate", {}, r"lt-[0-9a-z]{8}"),
    ("tencentcloud:Cfs/accessGroup:AccessGroup", {}, r"pgroup-[0-9a-z]{8}"),
    ("tencentcloud:Tcmq/queue:Queue", {"queueName": "jobs"}, r"queue-[0-9a-z]{8}"),
    ("tencentcloud:Cam/role:Role", {"name": "nodes"}, r"4611686\d{12}"),
    ("tencentcloud:Cam/policy:Policy", {}, r"\d{9}"),
    ("tencentcloud:Kms/key:Key", {}, r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-8[0-9a-f]{3}-[0-9a-f]{12}"),
    ("tencentcloud:Cos/bucket:Bucket", {"bucket": "data-1250000000"}, r"data-1250000000"),
    ("tencentcloud:Cos/bucket:Bucket", {}, r"q-[0-9a-f]{7}-1250000000"),
    ("tencentcloud:Monitor/alarmNotice:AlarmNotice", {}, r"notice-[0-9a-f-]{36}"),
    ("tencentcloud:Cvm/hpcCluster:HpcCluster", {}, r"cvm-[0-9a-z]{8}"),  # any other type: its module's prefix
])
def test_tencent_resources_get_tencent_id_shapes(typ, inputs, id_re):
    rid, state = T.new_resource(MockResourceArgs(typ=typ, name="q", inputs=inputs, custom=True))
    assert re.fullmatch(id_re, rid), rid
    assert T.new_resource(MockResourceArgs(typ=typ, name="q", inputs=inputs, custom=True))[0] == rid


def test_tencent_invokes_answer_the_account_zones_and_images():
    def tcall(token, **args):
        return T.call(MockCallArgs(token=token, args=args, provider=""))

    me = tcall("tencentcloud:User/getInfo:getInfo")
    assert (me["appId"], me["ownerUin"]) == ("1250000000", "100000000001")
    types = tcall("tencentcloud:Instance/getTypes:getTypes",
                  filters=[{"name": "instance-family", "values": ["GN10Xp"]}])["instanceTypes"]
    assert {t["instanceType"] for t in types} == {"GN10Xp.2XLARGE40", "GN10Xp.5XLARGE80", "GN10Xp.10XLARGE160",
                                                  "GN10Xp.20XLARGE320"}
    assert {t["availabilityZone"] for t in types} == {"ap-shanghai-2", "ap-shanghai-3", "ap-shanghai-4"}
    (image,) = tcall("tencentcloud:Images/getInstance:getInstance", imageNameRegex="^gpufleet-gpu-")["images"]
    assert re.fullmatch(r"img-[0-9a-z]{8}", image["imageId"]) and image["imageName"].startswith("gpufleet-gpu-")
