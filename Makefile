# gpufleet: make venv | make test | make preview STACK=dev | make bench
PY      := .venv/bin/python
STACK   ?= dev
FORMAT  ?= table
PYTEST_ARGS ?=

.PHONY: venv test preview bench clean
venv: .venv/.installed

.venv/.installed: requirements.txt requirements.lock trainer/pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -c requirements.lock
	$(PY) -m pip install --quiet --no-deps -e trainer/
	touch $@

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

preview: venv
	$(PY) -m infra.preview --stack $(STACK) --format $(FORMAT)

bench: venv
	$(PY) -m bench.run

clean:
	rm -rf .venv .pytest_cache bench/results.json
