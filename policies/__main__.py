"""Policy pack entry point, run by the Pulumi policy host (`python -m pulumi.policy <engine> .` in policies/).

It only builds the PolicyPack, which serves the Analyzer gRPC protocol and blocks; the policies live in
importable modules so tests and the offline preview can use them.
"""
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# The host runs this file with policies/ first on sys.path, where policies/<name>.py would shadow any
# top-level module of that name; import the pack as the `policies` package from the repository root.
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from policies import PACK_NAME, all_policies  # noqa: E402

PolicyPack(
    name=PACK_NAME,
    description="GPU-aware compliance guardrails for gpufleet stacks on AWS, Azure and Tencent Cloud (CIS, HIPAA, GDPR, PIPL, GPU).",
    enforcement_level=EnforcementLevel.ADVISORY,
    policies=all_policies(),
)
