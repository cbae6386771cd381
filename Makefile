# Entry points of posmlp-dense; README.md describes them.
#   make demo   set up the environment, then run the main job
#   make test   set up the environment, then run the test suite
#   make test-slow  the suite with the tests marked slow (inductor's code
#               generation for every training case; an hour more on 2 cores)
#   make env    only create or update the environment
#   make mutation  plant known bugs in a temporary copy, one at a time, and
#               check that the tests catch each (tools/mutation_check.py;
#               minutes, not part of `make test` or CI)
# VENV=/path/to/env points them at another environment (default: .venv).

VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
DEMO_ARGS ?=
MUTATION_ARGS ?=

.PHONY: help env test test-slow demo mutation

help:
	@echo "make demo   - set up the environment ($(VENV)), then run tools/demo.py"
	@echo "make test   - set up the environment ($(VENV)), then run the tests"
	@echo "make test-slow - the tests, with those marked slow"
	@echo "make env    - only create or update the environment"
	@echo "make mutation - check that the tests catch planted bugs (minutes)"

env:
	VENV="$(VENV)" bash tools/setup_env.sh

# the test files spread over the cores (pytest-xdist), each file on one
# worker so that its module fixtures are built once
PARALLEL := -n auto --maxprocesses 4 --dist loadfile

test: env
	$(PY) -m pytest $(PARALLEL) $(PYTEST_ARGS)

test-slow: env
	$(PY) -m pytest $(PARALLEL) --slow $(PYTEST_ARGS)

demo: env
	$(PY) tools/demo.py $(DEMO_ARGS)

mutation: env
	$(PY) tools/mutation_check.py $(MUTATION_ARGS)
