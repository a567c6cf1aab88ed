#!/usr/bin/env bash
# `scripts/lazy-bytecode.sh VENV`: VENV's Python compiles a module at its first import and keeps the bytecode in
# VENV/.pycache, instead of every module being compiled at install (scripts/uvpip.sh then skips --compile-bytecode
# for VENV; the why and the figures are there).
#
# How: a .pth file in VENV's site-packages, run by `site` at every start of VENV's Python, turns bytecode writing
# back on (these machines set PYTHONDONTWRITEBYTECODE=1) with `sys.pycache_prefix` set to VENV/.pycache, so nothing
# is written into the checkout (an environment's tree is hashed by `envhub registry verify`, which runs meanwhile)
# or into the system's Python. A prefix the user set (PYTHONPYCACHEPREFIX) is kept. Processes run from VENV's
# site-packages without `site` (a sandbox binding it on PYTHONPATH) are unaffected: they read what is there.
set -euo pipefail
venv=${1:?usage: $0 VENV}
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cat >"$site/00-envhub-lazy-bytecode.pth" <<'PTH'
import os, sys; sys.dont_write_bytecode = False; sys.pycache_prefix = sys.pycache_prefix or os.path.join(sys.prefix, ".pycache")
PTH
touch "$venv/.lazy-bytecode"
