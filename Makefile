.PHONY: setup run test lint

setup:
	./scripts/setup.sh

# The main job: prepare the offline assets (first time only), train PPO and CORY, write the report to runs/main.
run: setup
	.venv/bin/marllm main --out runs/main

# Tests never need the hub: offline mode makes an accidental hub access fail at once instead of hanging.
test: setup
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check .
