# gpufleet: make preview STACK=dev | make test | make demo | make bench   (make tools, make venv: what they need)
PY      := .venv/bin/python
# The venv's base: the system's Python where there is one, which every user can run (a box run by root runs jobs
# as the teams' users, trainer.slurm.users; a Python below root's home is out of their reach).
BASE_PY := $(firstword $(wildcard /usr/bin/python3) python3)
STACK   ?= dev
FORMAT  ?= table
PYTEST_ARGS ?=
# setuptools warns on every editable install of a flat layout; the warning is about the working directory
EDITABLE := PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet --no-deps

.PHONY: tools venv test preview demo bench clean
# The programs the tests and the demo run (Debian packages, Azurite from npm); skips what is present.
tools:
	bash tools/install.sh

venv: .venv/.installed

.venv/.installed: requirements.txt requirements.lock pyproject.toml trainer/pyproject.toml
	test -x $(PY) || $(BASE_PY) -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -c requirements.lock
	$(EDITABLE) -e trainer/
	$(EDITABLE) -e .
	touch $@

test: tools venv
	$(PY) -m pytest $(PYTEST_ARGS)

preview: venv
	$(PY) -m infra.preview --stack $(STACK) --format $(FORMAT)

demo: tools venv
	.venv/bin/gpufleet demo

bench: tools venv
	$(PY) -m bench.run
	$(PY) -m bench.table

clean:
	rm -rf .venv node_modules package-lock.json *.egg-info trainer/*.egg-info .pytest_cache bench/results.json
