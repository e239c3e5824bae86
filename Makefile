.PHONY: setup run test lint

setup:
	./scripts/setup.sh

# The main job: prepare the offline assets (first time only), train PPO and CORY, write the report.
run: setup
	.venv/bin/marllm main

test: setup
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check marllm tests examples benchmarks
