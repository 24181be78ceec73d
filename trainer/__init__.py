"""gpufleet trainer: `python -m trainer train|task|controller|nodes|setup|submit|...` (trainer.__main__)."""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAULT = 1  # a runtime fault, told in one line
EXIT_USAGE = 2
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped after a safe checkpoint; rerun with the same --checkpoint-uri resumes
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, what a shell reports
