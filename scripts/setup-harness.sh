#!/usr/bin/env bash
# Pinned agent harnesses for the harness envs (envhub.harness: codex, claude-code, qwen-code, opencode, gemini-cli,
# mini-swe-agent), installed into project-local prefixes that the sandboxes bind read-only: npm CLIs under
# .harness/npm, Python agents in .harness/venv. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
CODEX=0.169.0
CLAUDE=2.1.197
QWEN=0.15.10      # 0.16+ needs Node.js >= 22; these machines have 20
OPENCODE=1.18.33
GEMINI=0.61.0     # runs on Node.js 20 (its engines: >=20)
MINI=2.4.6
PREFIX=.harness
mkdir -p "$PREFIX/npm"
want="@openai/codex@$CODEX @anthropic-ai/claude-code@$CLAUDE @qwen-code/qwen-code@$QWEN opencode-ai@$OPENCODE @google/gemini-cli@$GEMINI"
if [ ! -f "$PREFIX/npm/.installed" ] || [ "$(cat "$PREFIX/npm/.installed")" != "$want" ]; then
    npm install --silent --no-audit --no-fund --prefix "$PREFIX/npm" $want
    echo "$want" > "$PREFIX/npm/.installed"
fi
if [ ! -f "$PREFIX/venv/.installed" ] || [ "$(cat "$PREFIX/venv/.installed")" != "mini-swe-agent==$MINI" ]; then
    python3 -m venv "$PREFIX/venv"
    bash scripts/uvpip.sh "$PREFIX/venv" "mini-swe-agent==$MINI"  # pip install, by a pinned uv (scripts/uvpip.sh)
    echo "mini-swe-agent==$MINI" > "$PREFIX/venv/.installed"
fi
