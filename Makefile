# The two commands of the README, on a fresh machine with only python3, make and apt:
#   make test   — set up .venv and run the whole test suite (what .ci/run calls)
#   make demo   — set up .venv and run the main job on the embedded default
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: test demo bench clean bubblewrap

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }

# The local compute frame runs each job in a bubblewrap sandbox.
bubblewrap:
	@command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap; }

$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(PIP) install -e ".[$*]"
	touch $@

test: $(VENV)/.installed-test bubblewrap
	$(BIN)/python -m pytest

demo: $(VENV)/.installed-test bubblewrap
	$(BIN)/python -m deployments.demo

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/transfer.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info .demo
