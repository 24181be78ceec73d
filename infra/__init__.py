"""gpufleet infrastructure: the Pulumi program, its configuration, catalog and offline preview."""
from pathlib import Path

# The project root (Pulumi.yaml, the stack files, policies/): the folder above this package, wherever the
# command runs from (`make venv` installs the project editable, so the package stays in the project).
ROOT = Path(__file__).resolve().parent.parent
