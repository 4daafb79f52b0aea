# Two entry points do all set-up on a fresh machine (see README):
#   make demo   - create .venv if needed, then score sample clips (demo weights unless MODEL=DIR)
#   make test   - create .venv if needed, then run the whole test suite
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.nvrm-installed

.PHONY: demo test fuzz docs test-trainers test-versions install system-deps bench clean

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

test: $(STAMP) system-deps
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

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

# The transformers version matrix alone: 5.8.1, 5.9.0, 5.10.4 and 5.24.0 on this environment's torch
# (overlays kept in .venv/matrix/), each held to the release profile's numbers (4.57.6).
test-versions: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m versions $(PYTEST_ARGS)

# Debian packages the tests need: chromium renders the HTML report in a real
# browser. (PyAV bundles its own FFmpeg, so no system ffmpeg is needed.)
system-deps:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the HTML report test"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache
