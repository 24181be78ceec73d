"""IAM guardrails: no wildcard actions, no admin-grade managed policies, no unconditioned writes on '*'."""
from __future__ import annotations

import re

from policies.common import as_list, items, json_doc, resource_policy
from policies.tokens import IAM_ATTACHMENTS, IAM_POLICY_DOCS, IAM_ROLE

# Action verbs that only read; anything else counts as a write.
READ_VERBS = ("Get", "List", "Describe", "Head", "View", "Search", "Lookup", "Query", "Scan", "Select",
              "BatchGet", "Check", "Test", "Simulate")
BROAD_MANAGED = re.compile(r"^arn:aws[\w-]*:iam::aws:policy/(.*/)?(AdministratorAccess|PowerUserAccess|\w*FullAccess)$")


def documents(resource_type: str, props: dict) -> list:
    """(label, document) for every policy document in a policy, inline policy or role."""
    if resource_type == IAM_ROLE:
        return [(f"inline policy '{p.get('name')}'", json_doc(p.get("policy")))
                for p in items(props.get("inlinePolicies")) if isinstance(p, dict)]
    return [(key, json_doc(props.get(key))) for key in IAM_POLICY_DOCS.get(resource_type, ())]


def allow_statements(doc) -> list[dict]:
    if not isinstance(doc, dict):
        return []
    return [s for s in as_list(doc.get("Statement")) if isinstance(s, dict) and s.get("Effect") == "Allow"]


def is_write(action: str) -> bool:
    if not isinstance(action, str) or ":" not in action:
        return action == "*"
    verb = action.split(":", 1)[1]
    return not verb.startswith(READ_VERBS)


def check_wildcard_actions(props: dict, ctx):
    for label, doc in documents(ctx.resource_type, props):
        for s in allow_statements(doc):
            if s.get("NotAction") is not None:
                yield f"{label}: Allow with NotAction grants every other action"
            for action in as_list(s.get("Action")):
                if action == "*" or (isinstance(action, str) and action.endswith(":*")):
                    yield f"{label}: Allow of '{action}'"


def check_unconditioned_write(props: dict, ctx):
    for label, doc in documents(ctx.resource_type, props):
        for s in allow_statements(doc):
            if "*" not in as_list(s.get("Resource")) or s.get("Condition"):
                continue
            writes = [a for a in as_list(s.get("Action")) if is_write(a)]
            if writes:
                yield f"{label}: {', '.join(map(str, writes))} on Resource '*' without a Condition"


def check_broad_managed(props: dict, ctx):
    arns = [props.get("policyArn")] + items(props.get("managedPolicyArns"))
    for arn in arns:
        if isinstance(arn, str) and BROAD_MANAGED.match(arn):
            yield f"attaches AWS managed policy {arn.rsplit('/', 1)[-1]}"


_DOC_TYPES = [*IAM_POLICY_DOCS, IAM_ROLE]
POLICIES = [
    resource_policy(
        "aws-iam-policy-no-wildcard-actions",
        "IAM policies allow no '*' or 'service:*' actions and no Allow with NotAction.",
        types=_DOC_TYPES, severity="high", frameworks=["CIS"], check=check_wildcard_actions,
        remediation="List the exact actions the node needs (e.g. s3:GetObject, s3:PutObject, sqs:ReceiveMessage) "
                    "instead of wildcards."),
    resource_policy(
        "aws-iam-policy-no-unconditioned-wildcard-write",
        "IAM policies allow no write action on Resource '*' unless a Condition narrows it.",
        types=_DOC_TYPES, severity="high", frameworks=["CIS"], check=check_unconditioned_write,
        remediation="Scope write actions to the stack's ARNs (bucket, queue, log group, auto scaling group); for "
                    "actions without resource-level permissions add a Condition such as "
                    "StringEquals cloudwatch:namespace or aws:ResourceTag/gpufleet-stack."),
    resource_policy(
        "aws-iam-attachment-no-admin-managed-policy",
        "No role, user or group gets AdministratorAccess, PowerUserAccess or an AWS *FullAccess policy.",
        types=[*IAM_ATTACHMENTS, IAM_ROLE], severity="critical", frameworks=["CIS"], check=check_broad_managed,
        remediation="Replace the managed policy with a customer-managed policy listing the needed actions on "
                    "the stack's resources."),
]
