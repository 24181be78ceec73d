"""Identity: the CAM role the nodes assume (the launch configuration's cam_role_name; nodes read its
temporary key from the metadata service), and its one policy, which names the bucket, the key, the two
queues, the scaling group and the log topic. The role exists before the launch configuration; the
policy is granted once the group exists (its id is in the policy)."""
from __future__ import annotations

import json

import pulumi
from tencentcloud_iac_pulumi import cam

from infra.tencent import derive

SESSION_S = 43200  # the longest temporary key CAM hands out; the trainer refreshes it before expiry


class Identity(pulumi.ComponentResource):
    role_name: pulumi.Output[str]

    def __init__(self, name: str, role_name: str, tags: dict, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:Identity", name, None, opts)
        self._name = name
        self.role = cam.Role(f"{name}-nodes", name=role_name, document=json.dumps(derive.assume_role("cvm.qcloud.com")),
                             description="gpufleet GPU nodes", console_login=False, session_duration=SESSION_S,
                             tags=tags, opts=pulumi.ResourceOptions(parent=self))
        self.role_name = self.role.name
        self.policy = None

    def grant(self, policy_name: str, document: pulumi.Input[dict]) -> None:
        """The nodes' policy (derive.node_policy, built from ids known once the resources exist)."""
        child = pulumi.ResourceOptions(parent=self)
        self.policy = cam.Policy(f"{self._name}-nodes-policy", name=policy_name,
                                 document=pulumi.Output.from_input(document).apply(json.dumps),
                                 description="gpufleet GPU nodes: this stack's bucket, key, queues, group, logs",
                                 opts=child)
        cam.RolePolicyAttachment(f"{self._name}-nodes-policy-attachment", role_id=self.role.id,
                                 policy_id=self.policy.id, opts=child)
        self.register_outputs({"roleName": self.role.name, "policyId": self.policy.id})
