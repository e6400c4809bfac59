# The two commands of the README, on a fresh machine with only python3, make and apt:
#   make test   — set up .venv and run the whole test suite (what .ci/run calls)
#   make demo   — set up .venv and run the main job through Prefect on the embedded stack
#                 (KEEP=1 leaves the stack running; make demo-stop ends it)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: test demo demo-stop bench clean bubblewrap docker slurm chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }

# The local compute frame runs each job in a bubblewrap sandbox, under a seccomp filter libseccomp builds.
bubblewrap:
	@command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap; }
	@ldconfig -p | grep -q 'libseccomp\.so\.2' || { apt-get update -qq && apt-get install -y -qq libseccomp2; }

# The Docker tests start a dockerd of their own (tests/docker_daemon.py) and import their image from a
# static busybox (nothing is pulled); a dynamic /bin/busybox (Debian's busybox) is replaced.
docker:
	@command -v dockerd >/dev/null || test -x /usr/sbin/dockerd || { apt-get update -qq && apt-get install -y -qq docker.io; }
	@{ test -x /bin/busybox && ! ldd /bin/busybox >/dev/null 2>&1; } || { apt-get update -qq && apt-get install -y -qq busybox-static; }

# The SLURM tests start a cluster of their own (tests/slurm_cluster.py): munged, slurmctld and a slurmd
# per emulated node, all on this host, under a directory of the session's.
slurm:
	@command -v slurmctld >/dev/null || test -x /usr/sbin/slurmctld || { apt-get update -qq && apt-get install -y -qq slurm-wlm munge; }
	@command -v munged >/dev/null || test -x /usr/sbin/munged || { apt-get update -qq && apt-get install -y -qq munge; }

# The browser suite (tests/browser/) drives Prefect's UI in Debian's chromium through Playwright
# (Playwright's own browser download is never used).
chromium:
	@test -x /usr/bin/chromium || { apt-get update -qq && apt-get install -y -qq chromium; }

# uv (installed by pip from PyPI) resolves the Prefect stack in seconds; pip's resolver spends
# minutes backtracking through boto3 releases for prefect-aws's aiobotocore pin. pip stays the
# fallback.
$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	{ $(PIP) install uv && $(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[$*]"; } || $(PIP) install -e ".[$*]"
	touch $@

# torch, for the tests only: they build torchrun's own argument parser from the rendezvous
# variables the backends render, and run a two-rank gloo all-reduce in the local frame. pip, not
# uv: pip takes the CPU wheel this machine's PIP_FIND_LINKS holds (2.13.0+cpu satisfies ==2.13.0),
# where uv would resolve PyPI's multi-GB CUDA build.
$(VENV)/.test-torch: $(VENV)/.installed-test
	$(PIP) install torch==2.13.0
	touch $@

# The gates first (tests/test_gates.py proves each fails on a planted error): ruff (pyflakes and
# pycodestyle's checks, [tool.ruff]) over every Python tree, mypy (strict, [tool.mypy]) over the core.
test: $(VENV)/.installed-test $(VENV)/.test-torch bubblewrap docker slurm chromium
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

demo: $(VENV)/.installed-demo bubblewrap
	$(BIN)/python -m deployments.demo $(if $(KEEP),--keep)

demo-stop:
	$(BIN)/python -m deployments.demo --stop

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/transfer.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info .demo
