"""swe-gym: fix a real bug in a Python repository; graded by FAIL_TO_PASS / PASS_TO_PASS tests (SWE-Gym / SWE-bench).

An episode, as the rollout service runs it::

    INIT  the repository at the task's base_commit is copied into a fresh sandbox at /testbed (no network);
          the first user message is the issue (problem_statement)
    RUN   the model acts with bash, str_replace_editor and finish; on finish (or when the turn budget runs out)
          the env extracts ``git diff <base_commit>`` of /testbed, new files included: artifacts = {"patch": ...}
          the RUN sandbox is freed
    EVAL  :class:`~envhub_swe_gym.grader.SweGymVerifier` grades the patch in fresh sandboxes: clean checkout,
          agent diff (test infrastructure stripped), test files reset, test patch, random canaries, pytest run through the
          grader's launcher on a read-only tree, verdicts from authenticated records only; reward 1 when every
          FAIL_TO_PASS and PASS_TO_PASS test passes, else 0

Tasks: :func:`~envhub_swe_gym.loader.load_swe_gym` (``SWE-Gym/SWE-Gym`` through ``datasets`` when the hub is
reachable, else the shipped offline split of 18 instances from three small repositories, rebuilt by
``python -m envhub_swe_gym.generate``).
"""
from __future__ import annotations

import envhub
from envhub import EnvSpec, ToolEnv, finish_tool

from envhub_swe_gym.grader import SweGymVerifier, sandbox_run
from envhub_swe_gym.loader import load_swe_gym
from envhub_swe_gym.policies import BASH, EDITOR, HACK_PROBES, golden

__version__ = "0.1.0"
__all__ = ["SweGymEnv", "SweGymVerifier", "load_swe_gym", "golden", "HACK_PROBES"]

WORKDIR = "/testbed"
MAX_PATCH_BYTES = 2 << 20
PROMPT = """<uploaded_files>
{workdir}
</uploaded_files>
I've uploaded a Python code repository in the directory {workdir}. Consider the following issue:

<issue_description>
{problem_statement}
</issue_description>

Make the smallest changes to the non-test files in {workdir} so that the issue is resolved. Tests are not yours to \
change: changes to test files, test configuration or the test runner are discarded, and tests you cannot see decide \
the grade. Use `{bash}` to explore and run code (Python and pytest are installed: `cd {workdir} && python -m pytest \
-q`) and `{editor}` to view and edit files. When you are done, call `finish`: the `git diff` of {workdir} is what \
gets graded."""


class SweGymEnv(ToolEnv):
    """The repository at ``base_commit`` in a sandbox at ``/testbed``; tools: bash, str_replace_editor, finish.

    Args:
        tasks, max_turns, render_mode: as for :class:`envhub.TextEnv`.
        command_timeout_s: wall-clock limit of one bash command.
        memory_mb: memory cap of the sandbox.
    """

    max_parallel_tools = 1  # the calls of one turn act on one repository: run them in the order given

    def __init__(self, tasks=None, max_turns: int = 30, render_mode: str | None = None,
                 command_timeout_s: float = 120.0, memory_mb: int = 2048):
        self.command_timeout_s = command_timeout_s
        self.memory_mb = memory_mb
        super().__init__(tasks=tasks, max_turns=max_turns, render_mode=render_mode)

    def make_tools(self):
        from envhub.tools import bash_tool, editor_tool

        return [bash_tool(timeout=self.command_timeout_s), editor_tool(),
                finish_tool("Call when you are done. Your changes to /testbed (its git diff) are what gets graded.")]

    def sandbox_spec_for(self, task):
        from envhub.sandbox import SandboxSpec
        from envhub_swe_gym.repos import checkout

        return SandboxSpec(workspace_from=str(checkout(task["repo"], task["base_commit"])), workdir=WORKDIR,
                           network=False, memory_mb=self.memory_mb, timeout_s=self.command_timeout_s,
                           # the shipped repositories need no pytest plugin; without autoload the agent's own test
                           # runs start in a fraction of the time
                           env={"GIT_PAGER": "cat", "PAGER": "cat", "GIT_TERMINAL_PROMPT": "0",
                                "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})

    def start(self, task):
        return PROMPT.format(workdir=WORKDIR, problem_statement=task["problem_statement"].strip(), bash=BASH,
                             editor=EDITOR)

    def finish_artifacts(self, answer):
        return self.extract_patch()

    def timeout_artifacts(self):
        return self.extract_patch()  # out of turns: the work so far is graded, as SWE-bench harnesses do

    def extract_patch(self) -> dict:
        """``{"patch": git diff of /testbed against base_commit}`` (new files included, ignored files not).

        A private index (``GIT_INDEX_FILE``) is used so the agent's own index, staged or broken, does not matter;
        repository settings that could run programs or rewrite the output (hooks, fsmonitor, external diff,
        textconv) are overridden on the command line. Failures give ``{"patch": "", "error": ...}``.
        """
        sb = self.sandbox
        if sb is None or self.task is None:
            return {"patch": "", "error": "the episode has no sandbox to extract a diff from"}
        base = self.task["base_commit"]
        git = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c safe.directory='*'"
        script = (f"set -e; cd {WORKDIR}; export GIT_INDEX_FILE=/tmp/.envhub-index.$$; rm -f \"$GIT_INDEX_FILE\"; "
                  f"{git} read-tree {base}; {git} add -A; "
                  f"{git} diff --cached --binary --no-color --no-ext-diff --no-textconv {base} > /tmp/.envhub.patch; "
                  f"rm -f \"$GIT_INDEX_FILE\"; stat -c %s /tmp/.envhub.patch")
        try:
            r = sandbox_run(sb, ["bash", "-c", script], timeout=120,
                            env={"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"})
            if not r.ok:
                return {"patch": "", "error": f"could not extract the diff (exit {r.exit_code}): {r.output[-1000:]}"}
            size = int(r.stdout.strip().splitlines()[-1])
            if size > MAX_PATCH_BYTES:
                return {"patch": "", "error": f"the diff is {size} bytes, over the {MAX_PATCH_BYTES}-byte limit"}
            return {"patch": sb.read_file("/tmp/.envhub.patch").decode("utf-8", errors="replace")}
        except Exception as e:  # a dead sandbox still ends the episode with a marked, gradable artifact
            return {"patch": "", "error": f"could not extract the diff: {type(e).__name__}: {e}"}


def load_tasks(split: str):
    return load_swe_gym(split)


@envhub.hookimpl
def envhub_register(registry):
    from envhub.sandbox import SandboxSpec

    registry.register(EnvSpec(
        id="swe-gym", version=__version__, env=SweGymEnv, tasks=load_tasks, verifier=SweGymVerifier(),
        golden=golden, hack_probes=dict(HACK_PROBES), sandbox=SandboxSpec(workdir=WORKDIR, network=False),
        max_turns=30, default_split="train",
        summary="Fix real bugs in Python repositories; graded by FAIL_TO_PASS / PASS_TO_PASS tests.",
        tags=["swe", "tools", "sandbox"],
    ))
