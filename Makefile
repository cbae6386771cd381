# Entry points of posmlp-dense; README.md describes them.
#   make demo   set up the environment, then run the main job
#   make test   set up the environment, then run the test suite
#   make env    only create or update the environment
# VENV=/path/to/env points them at another environment (default: .venv).

VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: help env test demo

help:
	@echo "make demo   - set up the environment ($(VENV)), then run tools/demo.py"
	@echo "make test   - set up the environment ($(VENV)), then run the tests"
	@echo "make env    - only create or update the environment"

env:
	VENV="$(VENV)" bash tools/setup_env.sh

test: env
	$(PY) -m pytest $(PYTEST_ARGS)

demo: env
	$(PY) tools/demo.py $(DEMO_ARGS)
