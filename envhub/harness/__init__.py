"""Harness environments: unmodified agent CLIs (Codex CLI, Claude Code, mini-swe-agent) in envhub sandboxes, their
model calls through the gateway, their workspaces graded by the task set's verifier. See :mod:`envhub.harness.episode`
and :mod:`envhub.harness.presets`."""
