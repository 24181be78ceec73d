"""IAM guardrails: no wildcard actions, no admin-grade managed policies, no unconditioned writes on '*',
bounded launch rights (the Slurm controller launches GPU nodes with EC2 CreateFleet), KMS grants only for AWS
resources, instance credentials that work only on their instance, and role credentials handed on (a job role
that a node role assumes for each job) that work only through the stack's VPC."""
from __future__ import annotations

import re
from fnmatch import fnmatchcase

from policies.common import UNKNOWN, Stack, as_list, flag, items, json_doc, resource_policy, stack_policy
from policies.tokens import IAM_ATTACHMENTS, IAM_POLICY_DOCS, IAM_ROLE

# Action verbs that only read; anything else counts as a write.
READ_VERBS = ("Get", "List", "Describe", "Head", "View", "Search", "Lookup", "Query", "Scan", "Select",
              "BatchGet", "Check", "Test", "Simulate")
# AWS managed policies that reach beyond a stack: administration, a service's every action, and
# AmazonSSMManagedInstanceCore (ssm:GetParameter(s) on every parameter of the account, which a job naming another
# team's secret would borrow).
BROAD_MANAGED = re.compile(r"^arn:aws[\w-]*:iam::aws:policy/(.*/)?"
                           r"(AdministratorAccess|PowerUserAccess|\w*FullAccess|AmazonSSMManagedInstanceCore)\Z")


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


# --- bounded launch rights --------------------------------------------------------------------------

LAUNCH_ACTIONS = ("ec2:RunInstances", "ec2:CreateFleet")
TERMINATE = "ec2:TerminateInstances"
PASS_ROLE = "iam:PassRole"
STACK_TAG = "gpufleet-stack"
# An instance ARN no real one equals, to test whether a Resource pattern reaches instances in general.
_ANY_INSTANCE = "instance/i-0a1b2c3d4e5f60718"
_EXACT = ("arnequals", "arnlike", "stringequals", "stringlike")   # with no wildcard in the values, all are exact


def allows(statement: dict, action: str) -> bool:
    """The Allow statement grants `action` (through Action patterns, or NotAction that leaves it out)."""
    if statement.get("NotAction") is not None:
        return not any(isinstance(a, str) and fnmatchcase(action.lower(), a.lower())
                       for a in as_list(statement.get("NotAction")))
    return any(isinstance(a, str) and fnmatchcase(action.lower(), a.lower()) for a in as_list(statement.get("Action")))


def _reaches_instances(pattern) -> bool:
    if not isinstance(pattern, str):
        return False
    if pattern == "*":
        return True
    parts = pattern.split(":", 5)
    if len(parts) < 6:
        return fnmatchcase(f"arn:aws:ec2:r:1:{_ANY_INSTANCE}", pattern)
    return fnmatchcase("ec2", parts[2]) and fnmatchcase(_ANY_INSTANCE, parts[5])


def on_instances(statement: dict) -> bool:
    """The statement's resources reach EC2 instances in general ('*', instance/*, NotResource leaving them in)."""
    if statement.get("NotResource") is not None:
        return not any(_reaches_instances(r) for r in as_list(statement.get("NotResource")))
    return any(_reaches_instances(r) for r in as_list(statement.get("Resource")))


def _wildcard(value) -> bool:
    return not isinstance(value, str) or not value or "*" in value or "?" in value


def exact_condition(statement: dict, key: str) -> list:
    """The values an exact (not IfExists, not negated) operator requires of condition `key`; [] if none does.
    Any value with a wildcard makes the whole answer [] (it does not name one thing)."""
    condition = statement.get("Condition")
    if not isinstance(condition, dict):
        return []
    for op, pairs in condition.items():
        if not isinstance(pairs, dict) or not isinstance(op, str) or op.lower() not in _EXACT:
            continue
        for k, values in pairs.items():
            if isinstance(k, str) and k.lower() == key.lower():
                values = as_list(values)
                return values if values and not any(_wildcard(v) for v in values) else []
    return []


def launch_gaps(statement: dict) -> list[str]:
    """How one Allow statement leaves launching, terminating or passing roles unbounded."""
    gaps = []
    launches = [a for a in LAUNCH_ACTIONS if allows(statement, a)]
    if launches and on_instances(statement):
        verbs = " and ".join(launches)
        templates = exact_condition(statement, "ec2:LaunchTemplate")
        if not templates or not all(":launch-template/" in t for t in templates):
            gaps.append(f"{verbs} on instances without an ArnEquals ec2:LaunchTemplate condition naming "
                        f"the stack's launch templates")
        if not (exact_condition(statement, f"aws:RequestTag/{STACK_TAG}")
                or exact_condition(statement, f"ec2:RequestTag/{STACK_TAG}")):
            gaps.append(f"{verbs} on instances without a StringEquals aws:RequestTag/{STACK_TAG} condition")
    if allows(statement, TERMINATE) and on_instances(statement):
        if not (exact_condition(statement, f"ec2:ResourceTag/{STACK_TAG}")
                or exact_condition(statement, f"aws:ResourceTag/{STACK_TAG}")):
            gaps.append(f"{TERMINATE} without a StringEquals ec2:ResourceTag/{STACK_TAG} condition")
    if allows(statement, PASS_ROLE):
        roles = as_list(statement.get("Resource"))
        if (statement.get("NotResource") is not None or not roles
                or any(_wildcard(r) or ":role/" not in r for r in roles)):
            gaps.append(f"{PASS_ROLE} on {', '.join(map(str, roles)) or 'NotResource'}, not named role ARNs")
        if not exact_condition(statement, "iam:PassedToService"):
            gaps.append(f"{PASS_ROLE} without a StringEquals iam:PassedToService condition")
    return gaps


def check_bounded_launch(props: dict, ctx):
    for label, doc in documents(ctx.resource_type, props):
        for i, s in enumerate(allow_statements(doc)):
            for gap in launch_gaps(s):
                yield f"{label}: statement {s.get('Sid') or i}: {gap}"


# --- KMS grants ---------------------------------------------------------------------------------------

CREATE_GRANT = "kms:CreateGrant"


def condition_value(statement: dict, operator: str, key: str):
    """The value `operator` (e.g. Bool, Null, StringNotEquals) requires of condition `key`, else None; operator
    and key are matched ignoring case."""
    condition = statement.get("Condition")
    for op, pairs in (condition.items() if isinstance(condition, dict) else ()):
        if isinstance(op, str) and op.lower() == operator.lower() and isinstance(pairs, dict):
            for k, value in pairs.items():
                if isinstance(k, str) and k.lower() == key.lower():
                    return value
    return None


def check_grants_for_aws_resources(props: dict, ctx):
    for label, doc in documents(ctx.resource_type, props):
        for i, s in enumerate(allow_statements(doc)):
            if allows(s, CREATE_GRANT) and flag(condition_value(s, "Bool", "kms:GrantIsForAWSResource")) is not True:
                yield (f"{label}: statement {s.get('Sid') or i} allows {CREATE_GRANT} without a Bool "
                       f"kms:GrantIsForAWSResource 'true' condition")


# --- instance credentials --------------------------------------------------------------------------------

EC2_SERVICE = "ec2.amazonaws.com"
# The data-perimeter Denies for EC2 role credentials: the credential's own VPC and address against the request's.
CREDENTIAL_DENIES = (("aws:ec2InstanceSourceVPC", "${aws:SourceVpc}"),
                     ("aws:ec2InstanceSourcePrivateIPv4", "${aws:VpcSourceIp}"))


def trusts_ec2(role: dict) -> bool:
    """The role's trust policy lets EC2 instances assume it: a node's or the controller's role."""
    doc = json_doc(role.get("assumeRolePolicy"))
    return isinstance(doc, dict) and any(
        s.get("Effect") == "Allow" and EC2_SERVICE in as_list((s.get("Principal") or {}).get("Service"))
        for s in as_list(doc.get("Statement")) if isinstance(s, dict) and isinstance(s.get("Principal"), dict))


def denies_off_instance(statement: dict, key: str, variable: str) -> bool:
    """A Deny of every action on every resource for instance credentials (ec2:SourceInstanceARN set) whose
    `key` differs from the request's `variable`."""
    return (statement.get("Effect") == "Deny" and "*" in as_list(statement.get("Action"))
            and "*" in as_list(statement.get("Resource")) and isinstance(statement.get("Condition"), dict)
            and as_list(condition_value(statement, "StringNotEquals", key)) == [variable]
            and flag(condition_value(statement, "Null", "ec2:SourceInstanceARN")) is False)


def role_documents(stack: Stack, role) -> list:
    """The policy documents a role holds: inline, aws.iam.RolePolicy and attached aws.iam.Policy resources."""
    docs = [json_doc(p.get("policy")) for p in items(role.props.get("inlinePolicies")) if isinstance(p, dict)]
    docs += [json_doc(p.props.get("policy")) for p in stack.referrers(role, IAM_POLICY_DOCS, "role")]
    for attachment in stack.referrers(role, IAM_ATTACHMENTS, "role"):
        docs += [json_doc(p.props.get("policy")) for p in stack.targets(attachment, IAM_POLICY_DOCS, "policyArn")]
    return docs


def role_statements(stack: Stack, role) -> list[dict] | None:
    """Every statement of the role's policies, or None while one of them is not known yet (a preview)."""
    docs = role_documents(stack, role)
    if UNKNOWN in docs:
        return None
    return [s for d in docs if isinstance(d, dict) for s in as_list(d.get("Statement")) if isinstance(s, dict)]


def check_credentials_stay_on_instance(stack: Stack, ctx):
    for role in stack.of(IAM_ROLE):
        if not trusts_ec2(role.props):
            continue
        statements = role_statements(stack, role)
        if statements is None:
            continue
        for key, variable in CREDENTIAL_DENIES:
            if not any(denies_off_instance(s, key, variable) for s in statements):
                yield (f"instance role '{role.name}' has no Deny of its credentials where {key} is not "
                       f"{variable}: stolen from an instance, they work anywhere"), role.urn


# --- roles other roles assume (the job role) ------------------------------------------------------------

_ROLE_ARN = re.compile(r"^arn:aws[\w-]*:iam::\d{12}:role/")
_NOT_IN_VPC = ("stringnotequals", "stringnotequalsifexists")


def trusted_roles(role: dict) -> list[str]:
    """The IAM roles (ARNs) the role's trust policy lets assume it; a service or an account is not a role."""
    doc = json_doc(role.get("assumeRolePolicy"))
    if not isinstance(doc, dict):
        return []
    return [p for s in as_list(doc.get("Statement")) if isinstance(s, dict) and s.get("Effect") == "Allow"
            and isinstance(s.get("Principal"), dict)
            for p in as_list(s["Principal"].get("AWS")) if isinstance(p, str) and _ROLE_ARN.match(p)]


def denies_outside_vpc(statement: dict) -> bool:
    """A Deny of every action on every resource unless the request comes through the named VPC (StringNotEquals or
    StringNotEqualsIfExists aws:SourceVpc, no wildcard), narrowed by nothing but the exemption of what an AWS
    service does for the role (Bool or BoolIfExists aws:ViaAWSService 'false'): any other condition would let
    some requests from outside through."""
    condition = statement.get("Condition")
    if not (statement.get("Effect") == "Deny" and "*" in as_list(statement.get("Action"))
            and "*" in as_list(statement.get("Resource")) and isinstance(condition, dict)):
        return False
    vpc = False
    for op, pairs in condition.items():
        if not (isinstance(op, str) and isinstance(pairs, dict)):
            return False
        for key, value in pairs.items():
            key = key.lower() if isinstance(key, str) else key
            if op.lower() in _NOT_IN_VPC and key == "aws:sourcevpc":
                values = as_list(value)
                vpc = bool(values) and not any(_wildcard(v) for v in values)
            elif not (op.lower() in ("bool", "boolifexists") and key == "aws:viaawsservice" and flag(value) is False):
                return False
    return vpc


def check_assumed_roles_stay_in_vpc(stack: Stack, ctx):
    for role in stack.of(IAM_ROLE):
        principals = trusted_roles(role.props)
        if not principals:
            continue
        statements = role_statements(stack, role)
        if statements is None:
            continue
        if not any(denies_outside_vpc(s) for s in statements):
            yield (f"role '{role.name}', which {', '.join(principals)} may assume, has no Deny of '*' where "
                   f"aws:SourceVpc is not the stack's VPC: its credentials, handed to a job, work from anywhere"), \
                role.urn


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
        remediation="Scope write actions to the stack's ARNs (bucket, queue, log group, secret, launch template); for "
                    "actions without resource-level permissions add a Condition such as "
                    "StringEquals cloudwatch:namespace or aws:ResourceTag/gpufleet-stack."),
    resource_policy(
        "aws-iam-attachment-no-admin-managed-policy",
        "No role, user or group gets AdministratorAccess, PowerUserAccess, an AWS *FullAccess policy or "
        "AmazonSSMManagedInstanceCore (it reads every SSM parameter of the account).",
        types=[*IAM_ATTACHMENTS, IAM_ROLE], severity="critical", frameworks=["CIS"], check=check_broad_managed,
        remediation="Replace the managed policy with a customer-managed policy listing the needed actions on "
                    "the stack's resources (Session Manager: ssm:UpdateInstanceInformation and the four "
                    "ssmmessages actions, conditioned on aws:ec2InstanceSourceVPC)."),
    resource_policy(
        "aws-iam-policy-bounded-launch",
        "IAM policies launch instances only from named launch templates with the stack tag, terminate only "
        "tagged instances and pass only named roles to a named service.",
        types=_DOC_TYPES, severity="critical", frameworks=["CIS"], check=check_bounded_launch,
        remediation="Condition ec2:RunInstances / ec2:CreateFleet on instance/* with ArnEquals ec2:LaunchTemplate "
                    "[the stack's launch template ARNs] and StringEquals aws:RequestTag/gpufleet-stack; "
                    "ec2:TerminateInstances with StringEquals ec2:ResourceTag/gpufleet-stack; iam:PassRole on the "
                    "node role's ARN with StringEquals iam:PassedToService ec2.amazonaws.com "
                    "(infra.aws.policies.controller_policy)."),
    resource_policy(
        "aws-iam-policy-kms-grant-for-aws-resource",
        "IAM policies allow kms:CreateGrant only for grants an AWS service asks for on an AWS resource.",
        types=_DOC_TYPES, severity="high", frameworks=["CIS"], check=check_grants_for_aws_resources,
        remediation="Add Condition {\"Bool\": {\"kms:GrantIsForAWSResource\": \"true\"}} to every Allow of "
                    "kms:CreateGrant (or a pattern such as kms:*Grant), in a statement of its own "
                    "(infra.aws.registry.template_role_policy)."),
    stack_policy(
        "aws-iam-instance-role-credentials-stay-on-instance",
        "Roles that EC2 instances assume deny their credentials outside the instance's VPC and address.",
        severity="high", frameworks=["CIS"], check=check_credentials_stay_on_instance,
        remediation="Add AWS's data-perimeter Denies to the role's policy (infra.aws.policies.stay_on_instance): "
                    "Deny '*' on '*' with StringNotEquals aws:ec2InstanceSourceVPC '${aws:SourceVpc}' (and "
                    "aws:ec2InstanceSourcePrivateIPv4 '${aws:VpcSourceIp}'), Null ec2:SourceInstanceARN 'false', "
                    "BoolIfExists aws:ViaAWSService 'false'; reach every service the role calls through a VPC "
                    "endpoint."),
    stack_policy(
        "aws-iam-job-role-stays-in-vpc",
        "Roles that another IAM role assumes (job roles) deny their credentials outside the stack's VPC.",
        severity="high", frameworks=["CIS"], check=check_assumed_roles_stay_in_vpc,
        remediation="Add to the role's policy (infra.aws.policies.job_role_policy) a Deny of '*' on '*' with "
                    "StringNotEqualsIfExists aws:SourceVpc '<the stack's VPC id>' and BoolIfExists "
                    "aws:ViaAWSService 'false', and nothing else in its Condition; reach every service the role "
                    "calls through a VPC endpoint."),
]
