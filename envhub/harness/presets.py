"""Harness presets, as data: how to run each unmodified agent CLI offline against an envhub gateway session.

A preset says where the pinned install lives (``make harness-tools`` puts npm CLIs under ``.harness/npm`` and
Python agents in ``.harness/venv``), which provider API the harness speaks, the files and environment that point it
at the gateway with telemetry, updates and onboarding off, its command line, and -- for the scripted golden and
no-op players -- the tool it runs shell commands with and how it ends. Settings follow offline probes of each pinned CLI
(docs/gateway.md) and Polar's presets.

===================  ==========================  =====================  =========================================
preset               pinned                      API                    shell tool / ending
===================  ==========================  =====================  =========================================
``codex``            ``@openai/codex`` 0.169.0   Responses, streaming   ``exec_command{cmd}`` / a final message
``claude-code``      ``@anthropic-ai/claude-code``  Messages, streaming  ``Bash{command, description}`` / end_turn
                     2.1.197
``mini-swe-agent``   ``mini-swe-agent`` 2.4.6    Chat, not streaming    ``bash{command}`` / the command
                                                                        ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
``qwen-code``        ``@qwen-code/qwen-code``    Chat, streaming        ``run_shell_command{command, description}``
                     0.15.10                                            / a final message
``opencode``         ``opencode-ai`` 1.18.33     Chat, streaming        ``bash{command, description}`` / a final
                                                                        message
``gemini-cli``       ``@google/gemini-cli``      Gemini                 ``run_shell_command{command,
                     0.61.0                      (``:streamGenerateContent``, SSE)  description}`` / a final message
===================  ==========================  =====================  =========================================

Qwen Code 0.16 and later need Node.js 22 (these machines have 20), hence 0.15.10. Qwen Code opens every
conversation with an exchange of its own (a context message and the assistant reply "Got it. Thanks for the
context!", which no model sampled): the gateway starts the chain there, so that reply is prompt context (mask 0),
and the scripted player counts only replies with tool calls as its steps. opencode runs with ``--title`` (no
title-generator side call) and ``small_model`` on the gateway too; its provider is ``@ai-sdk/openai-compatible``
(bundled: nothing is downloaded at start), which speaks chat completions. Gemini CLI reaches the gateway through
``GOOGLE_GEMINI_BASE_URL`` with the key in ``GEMINI_API_KEY``; its settings pin the auth type to ``gemini-api-key``
(0.61.0 derives a ``gateway`` auth type from that variable, which its non-interactive start then refuses as "Invalid
auth method selected", exit 41) and turn folder trust off (headless in an untrusted folder, it exits 55).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from envhub.env import Action, ToolCall

ROOT = Path(__file__).resolve().parents[2]
HARNESS_DIR = Path(ROOT / ".harness")  # make harness-tools (scripts/setup-harness.sh)
MODEL = "envhub"
HOME = "/tmp/home"


@dataclass(frozen=True)
class Preset:
    """How to run one agent CLI offline against a gateway session (the module docstring's table has each one).

    Attributes:
        name: the name :func:`get_preset` finds it by.
        dialect: the gateway dialect the harness speaks: ``"responses"``, ``"anthropic"``, ``"chat"`` or
            ``"gemini"``.
        package: the pinned package ``make harness-tools`` installs.
        executable: the installed program, relative to ``HARNESS_DIR``.
        argv: ``instructions -> arguments`` after the executable (run in the task's workdir).
        env: ``(base url, session key) -> environment variables`` set for the harness.
        files: ``(base url, session key) -> {sandbox path: text}``, written before the harness starts.
        shell: ``command -> the harness's own shell tool call`` (for the scripted players, :func:`scripted`).
        ending: the reply that ends the harness's episode (for the scripted players).
        notes: the harness's quirks, for people.
        tags: free-form labels (nothing in envhub reads them).
    """

    name: str
    dialect: str                       # the gateway dialect it speaks: "responses" | "anthropic" | "chat" | "gemini"
    package: str                       # what `make harness-tools` installs (pinned)
    executable: str                    # relative to HARNESS_DIR
    argv: Callable[[str], list[str]]   # instructions -> command line (run in the task's workdir)
    env: Callable[[str, str], dict[str, str]]          # (base url, session key) -> environment
    files: Callable[[str, str], dict[str, str]] = lambda url, key: {}  # (base url, key) -> {sandbox path: text}
    shell: Callable[[str], ToolCall] = lambda cmd: ToolCall("bash", {"command": cmd})
    ending: Callable[[], Action] = lambda: Action("Done.")
    notes: str = ""
    tags: list[str] = field(default_factory=list)

    def path(self) -> Path:
        """Where the installed executable lives: ``HARNESS_DIR / executable``."""
        return HARNESS_DIR / self.executable

    def installed(self) -> bool:
        """Whether the executable exists (``make harness-tools`` has installed it)."""
        return self.path().exists()

    def check_installed(self) -> None:
        """Refuse a harness that is not installed, naming ``make harness-tools``.

        Raises:
            HarnessNotInstalled: the executable is missing.
        """
        if not self.installed():
            raise HarnessNotInstalled(
                f"the {self.name} harness ({self.package}) is not installed at {self.path()}: run `make "
                "harness-tools` (installs the pinned agent CLIs into .harness/)")


class HarnessNotInstalled(RuntimeError):
    """A harness's pinned install is missing (the message names ``make harness-tools``)."""


def _codex_files(url: str, key: str) -> dict[str, str]:
    # top-level keys first: a key after a [table] header lands inside that table (Polar's preset notes), and a
    # provider named "openai" would ignore these overrides (openai/codex #11698)
    toml = (f'model = "{MODEL}"\nmodel_provider = "envhub"\napproval_policy = "never"\n'
            'sandbox_mode = "danger-full-access"\ncheck_for_update_on_startup = false\n\n'
            '[model_providers.envhub]\nname = "envhub"\n'
            f'base_url = "{url}/v1"\nenv_key = "ENVHUB_SESSION_KEY"\nwire_api = "responses"\n\n'
            '[analytics]\nenabled = false\n')
    return {f"{HOME}/.codex/config.toml": toml}


def _claude_files(url: str, key: str) -> dict[str, str]:
    state = {"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True, "autoUpdates": False}
    return {f"{HOME}/.claude/.claude.json": json.dumps(state), f"{HOME}/.claude.json": json.dumps(state)}


def _qwen_files(url: str, key: str) -> dict[str, str]:
    settings = {"telemetry": {"enabled": False}, "privacy": {"usageStatisticsEnabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                "security": {"auth": {"selectedType": "openai"}}}
    return {f"{HOME}/.qwen/settings.json": json.dumps(settings)}


def _opencode_files(url: str, key: str) -> dict[str, str]:
    # @ai-sdk/openai-compatible speaks chat completions (provider "openai" would speak Responses); small_model keeps
    # the title generator's side call on our model instead of a default hosted one
    config = {"$schema": "https://opencode.ai/config.json",
              "provider": {"envhub": {"npm": "@ai-sdk/openai-compatible", "name": "envhub",
                                      "models": {MODEL: {"name": MODEL, "tool_call": True}},
                                      "options": {"baseURL": f"{url}/v1", "apiKey": key}}},
              "model": f"envhub/{MODEL}", "small_model": f"envhub/{MODEL}", "autoupdate": False,
              "share": "disabled", "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"}}
    return {f"{HOME}/.config/opencode/opencode.json": json.dumps(config)}


def _gemini_files(url: str, key: str) -> dict[str, str]:
    settings = {"telemetry": {"enabled": False}, "privacy": {"usageStatisticsEnabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                # see the module docstring: the auth type the base URL implies is refused in --prompt mode, and
                # --prompt in an untrusted folder exits
                "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}}}
    return {f"{HOME}/.gemini/settings.json": json.dumps(settings)}


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset(
        "codex", "responses", "@openai/codex@0.169.0", "npm/node_modules/.bin/codex",
        argv=lambda task: ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", task],
        env=lambda url, key: {"CODEX_HOME": f"{HOME}/.codex", "ENVHUB_SESSION_KEY": key, "RUST_LOG": "error"},
        files=_codex_files,
        shell=lambda cmd: ToolCall("exec_command", {"cmd": cmd}),
        ending=lambda: Action("I applied the fix."),
    ),
    Preset(
        "claude-code", "anthropic", "@anthropic-ai/claude-code@2.1.197", "npm/node_modules/.bin/claude",
        argv=lambda task: ["-p", task, "--permission-mode", "bypassPermissions", "--output-format", "stream-json",
                           "--verbose"],
        env=lambda url, key: {
            "ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": key, "ANTHROPIC_MODEL": MODEL,
            "ANTHROPIC_SMALL_FAST_MODEL": MODEL, "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL, "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
            "CLAUDE_CODE_SUBAGENT_MODEL": MODEL, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1",
            "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", "CLAUDE_CONFIG_DIR": f"{HOME}/.claude"},
        files=_claude_files,
        shell=lambda cmd: ToolCall("Bash", {"command": cmd, "description": "Run a shell command"}),
        ending=lambda: Action("I applied the fix."),
    ),
    Preset(
        "mini-swe-agent", "chat", "mini-swe-agent==2.4.6", "venv/bin/mini-swe-agent",
        argv=lambda task: ["--yolo", "--model", f"openai/{MODEL}", "--task", task, "--cost-limit", "0",
                           "--exit-immediately"],
        env=lambda url, key: {"OPENAI_API_BASE": f"{url}/v1", "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": key,
                              "MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors",
                              "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        # every reply must carry a tool call; the episode ends with this command
        ending=lambda: Action("Submitting.", [ToolCall("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]),
    ),
    Preset(
        "qwen-code", "chat", "@qwen-code/qwen-code@0.15.10", "npm/node_modules/.bin/qwen",
        argv=lambda task: ["--yolo", "--auth-type", "openai", "--prompt", task],
        # the model through OPENAI_MODEL only (Polar: the variable and --model conflict on proxied backends)
        env=lambda url, key: {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_MODEL": MODEL},
        files=_qwen_files,
        shell=lambda cmd: ToolCall("run_shell_command", {"command": cmd, "description": "Run a shell command"}),
        ending=lambda: Action("I applied the fix."),
        notes="puts an assistant message of its own in the history (never sampled: prompt context, mask 0)",
    ),
    Preset(
        "opencode", "chat", "opencode-ai@1.18.33", "npm/node_modules/.bin/opencode",
        argv=lambda task: ["run", "--model", f"envhub/{MODEL}", "--format", "json", "--auto", "--title", "envhub", "--",
                           task],
        env=lambda url, key: {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                              "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_SHARE": "1"},
        files=_opencode_files,
        shell=lambda cmd: ToolCall("bash", {"command": cmd, "description": "Run a shell command"}),
        ending=lambda: Action("I applied the fix."),
        notes="a title-generator side call (no tools): an aux chain",
    ),
    Preset(
        "gemini-cli", "gemini", "@google/gemini-cli@0.61.0", "npm/node_modules/.bin/gemini",
        argv=lambda task: ["--model", MODEL, "--yolo", "--prompt", task],
        env=lambda url, key: {"GOOGLE_GEMINI_BASE_URL": url, "GEMINI_API_KEY": key, "GEMINI_SANDBOX": "false"},
        files=_gemini_files,
        shell=lambda cmd: ToolCall("run_shell_command", {"command": cmd, "description": "Run a shell command"}),
        ending=lambda: Action("I applied the fix."),
        notes="Gemini's own API; the function-call ids the gateway mints are echoed back",
    ),
]}


def get_preset(name: str) -> Preset:
    """The preset of a harness, by name.

    Args:
        name: ``"codex"``, ``"claude-code"``, ``"mini-swe-agent"``, ``"qwen-code"``, ``"opencode"`` or
            ``"gemini-cli"``.

    Returns:
        The :class:`Preset` (its install is not checked: :meth:`Preset.check_installed`).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown harness {name!r}; known: {', '.join(PRESETS)}") from None


def scripted(preset: Preset, commands: Callable[[dict], list[str]]) -> Callable:
    """A protocol-aware scripted player: ``commands(task)`` as the harness's own shell tool calls, one per model
    call, then the harness's ending.

    Args:
        preset: the harness whose shell tool (``preset.shell``) and ending (``preset.ending``) the player uses.
        commands: ``task -> shell commands``, e.g. :func:`golden_commands`.

    Returns:
        A policy ``(task, messages) -> Action`` for a scripted backend: the n-th command when ``messages`` hold
        n - 1 assistant messages with tool calls (a harness's own assistant message without any is no step), then
        the harness's ending.
    """
    def policy(task, messages):
        # steps taken = assistant messages with tool calls: a harness may put an assistant message of its own in
        # the history (Qwen Code's "Got it. Thanks for the context!"), which is no step of ours
        turn = sum(m.get("role") == "assistant" and bool(m.get("tool_calls")) for m in messages)
        cmds = commands(task)
        if turn < len(cmds):
            return Action(f"Step {turn + 1}.", [preset.shell(cmds[turn])])
        return preset.ending()
    return policy


def golden_commands(task: dict) -> list[str]:
    """The task's golden patch applied in the workspace with one shell command (swe-gym rows carry ``patch``).

    Args:
        task: the task row.

    Returns:
        One command: ``git apply`` of the patch in ``/testbed``, then ``git status --short``.

    Raises:
        KeyError: the task has no ``patch``.
    """
    patch = task["patch"]
    return [f"cd /testbed && git apply --whitespace=nowarn - <<'ENVHUB_GOLDEN_PATCH'\n{patch}ENVHUB_GOLDEN_PATCH\n"
            "git status --short"]


def noop_commands(task: dict) -> list[str]:
    """A player that changes nothing: one harmless command (``git status --short`` in ``/testbed``).

    Args:
        task: the task row (not read).

    Returns:
        The one command.
    """
    return ["cd /testbed && git status --short"]
