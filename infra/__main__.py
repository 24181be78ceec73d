"""Pulumi entry point. The Pulumi Python host puts infra/ on sys.path; the program imports the
`infra` package from the repository root so that `pulumi up` and the offline preview run the same code."""
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from infra import program  # noqa: E402

program.main()
