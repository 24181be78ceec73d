"""Identity: the CAM roles of the GPU nodes (the launch templates' cam_role_name) and of the controller, each
assumable by CVM only (the machines read the role's temporary key from the metadata service, which on a node answers
only root), the nodes' policy, the jobs' role (the nodes assume it for each job, narrowed to the job:
trainer.clouds.tencent_credentials) and the cluster's munge key secret. The controller's policy names the stack's
launch resources and is attached where the controller is made (infra.tencent.controller).

The munge key authenticates every Slurm message of the cluster. Its SSM secret is made here, encrypted with the
stack key, holding no key: the provider's secret resource writes a first version of its own ("default"), and a
version "init" holds the placeholder "unset". The controller generates the key at its first boot and stores it as
version "munge-1" (trainer.clouds.tencent_nodes.munge_key), so it is never in the Pulumi state, user-data, a preview
or an output; the nodes read it with their role.
"""
from __future__ import annotations

import json

import pulumi
from tencentcloud_iac_pulumi import cam, ssm

from infra.tencent import derive

SESSION_S = 43200  # the longest temporary key CAM hands out; the trainer refreshes it before expiry
MUNGE_RECOVERY_DAYS = 7     # a deleted secret can be restored for a week
MUNGE_INIT_VERSION, MUNGE_PLACEHOLDER = "init", "unset"


class Identity(pulumi.ComponentResource):
    role_name: pulumi.Output[str]

    def __init__(self, name: str, names: derive.Names, key_id: pulumi.Input[str], tags: dict,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpufleet:tencent:Identity", name, None, opts)
        self._name = name
        child = pulumi.ResourceOptions(parent=self)
        trust = json.dumps(derive.assume_role("cvm.qcloud.com"))
        self.role = cam.Role(f"{name}-nodes", name=names.role, document=trust, description="gpufleet GPU nodes",
                             console_login=False, session_duration=SESSION_S, tags=tags, opts=child)
        self.controller_role = cam.Role(
            f"{name}-controller", name=names.controller_role, document=trust,
            description="gpufleet Slurm controller", console_login=False, session_duration=SESSION_S, tags=tags,
            opts=child)
        self.munge_secret = ssm.Secret(
            f"{names.prefix}-munge", secret_name=names.munge, kms_key_id=key_id, is_enabled=True,
            description=f"{names.prefix}: the Slurm cluster's munge key (version munge-1, made by the controller)",
            recovery_window_in_days=MUNGE_RECOVERY_DAYS, tags=tags, opts=child)
        self.munge_init = ssm.SecretVersion(
            f"{names.prefix}-munge-init", secret_name=self.munge_secret.secret_name, version_id=MUNGE_INIT_VERSION,
            secret_string=MUNGE_PLACEHOLDER, opts=child)
        self.role_name = self.role.name
        self.policy = None

    def grant(self, policy_name: str, document: pulumi.Input[dict]) -> None:
        """The nodes' policy (derive.node_policy, built from ids known once the resources exist)."""
        child = pulumi.ResourceOptions(parent=self)
        self.policy = cam.Policy(f"{self._name}-nodes-policy", name=policy_name,
                                 document=pulumi.Output.from_input(document).apply(json.dumps),
                                 description="gpufleet GPU nodes: this stack's bucket, key, logs, munge key",
                                 opts=child)
        self.attachment = cam.RolePolicyAttachment(f"{self._name}-nodes-policy-attachment", role_id=self.role.id,
                                                   policy_id=self.policy.id, opts=child)

    def jobs(self, names: derive.Names, uin: pulumi.Input[str], document: pulumi.Input[dict], tags: dict) -> None:
        """The jobs' role (derive.job_role_trust, derive.job_role_policy); call after ``grant``."""
        child = pulumi.ResourceOptions(parent=self)
        self.job_role = cam.Role(
            f"{self._name}-jobs", name=names.job_role,
            document=pulumi.Output.from_input(uin).apply(lambda u: json.dumps(derive.job_role_trust(u))),
            description="gpufleet jobs: each job's own key, narrowed to the job by its node", console_login=False,
            session_duration=SESSION_S, tags=tags, opts=child)
        self.job_policy = cam.Policy(f"{self._name}-jobs-policy", name=names.job_role,
                                     document=pulumi.Output.from_input(document).apply(json.dumps),
                                     description="gpufleet jobs: the ceiling of a job's rights (teams' prefixes)",
                                     opts=child)
        self.job_attachment = cam.RolePolicyAttachment(f"{self._name}-jobs-policy-attachment",
                                                       role_id=self.job_role.id, policy_id=self.job_policy.id,
                                                       opts=child)
        self.register_outputs({"roleName": self.role.name, "controllerRoleName": self.controller_role.name,
                               "jobRoleName": self.job_role.name, "policyId": self.policy.id,
                               "mungeSecret": self.munge_secret.secret_name})
