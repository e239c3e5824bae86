.PHONY: setup run test test-benchmarks lint docs lock

setup:
	./scripts/setup.sh

# The main job: prepare the offline assets (first time only), train PPO and CORY, write the report to runs/main.
run: setup
	.venv/bin/marllm main --out runs/main

# Tests never need the hub: offline mode makes an accidental hub access fail at once instead of hanging.
# One worker per logical core (pytest-xdist); a test module stays on one worker, so its module fixtures are built
# once. The slowest tests are listed at the end, to keep the suite's time in view.
test: setup
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m pytest -q -n logical --dist loadscope --durations=15 \
		-m "not benchmarks"

# Each script of benchmarks/ and ../shared/bench/ run once at its smallest sizes (a smoke run, not a timing): a few
# minutes of fresh interpreters, kept out of `make test` so that the suite stays short; CI runs both.
test-benchmarks: setup
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m pytest -q -n logical --dist loadscope -m benchmarks \
		tests/test_benchmarks_run.py

lint: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on a broken link or a missing symbol.
docs: setup
	.venv/bin/mkdocs build --strict

# Refresh requirements.lock: the newest versions that pyproject.toml's ranges and constraints.in allow, with the dev,
# ray and games extras (the tests run the Ray engine). It resolves against the public index alone (no local wheel
# directories or pip config of this machine), so the lock names PyPI's torch and its CUDA packages; setup.sh still
# takes a local CPU build of the same version where no GPU is.
# Run `make test` afterwards: the lock is what the tests passed on.
PIP_TOOLS_VERSION = 7.6.2
lock:
	[ -x .venv-lock/bin/pip-compile ] || { python3 -m venv .venv-lock && \
		.venv-lock/bin/python -m pip install --quiet "pip-tools==$(PIP_TOOLS_VERSION)"; }
	env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null .venv-lock/bin/pip-compile --quiet \
		--upgrade --extra dev --extra ray --extra games --strip-extras --allow-unsafe --no-emit-find-links --no-emit-index-url \
		--constraint constraints.in --output-file requirements.lock pyproject.toml
