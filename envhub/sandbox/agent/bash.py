"""A persistent bash on a pseudo-terminal, driven with a unique sentinel per command.

Why a pty and not ``subprocess`` per command: the agent expects a terminal (``cd`` and ``export`` persist, programs
see a tty) and a persistent shell answers a builtin in well under a millisecond (``benchmarks/tools_latency.py``).
Why not tmux: polling ``capture-pane`` costs tens of milliseconds per command; here we block on the pty fd and stop
reading the moment the sentinel arrives.

How one command runs: its text is written to a file and the shell is sent one short line::

    . /run/envhub/.cmd <&99; printf '__ENVHUB_%s_%d__\\n' <token> $?

(a short one-line command is typed as ``<command> <&99``, or ``eval '<command>' <&99`` unless it is a list of plain
words: :func:`inline_line`). Sourcing keeps ``cd``/``export``/functions
in the shell and lifts the 4 KiB line limit of the tty; ``<&99`` (a /dev/null the shell keeps open: a dup is
cheaper than opening /dev/null for every command) stops a command from swallowing the next line as its input. A
command that closes fd 99 is noticed (bash refuses the redirection before running anything) and typed again after
the shell reopens it. The printed sentinel carries the exit code; the literal sentinel never appears in what we
type, so echo cannot fake it. The shell runs interactively (``-i``, job control on) so each command is its own
foreground process group: on timeout we send Ctrl-C, then SIGKILL that group, and the shell itself survives. If the
shell stops answering or exits, a fresh one is started and the result says so.

:func:`roundtrip` works on any copy of the pty master: the host usually types short commands on its own copy
(:mod:`envhub.sandbox.attached`), so they never wake this server; :class:`BashSession` owns the shell.
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import select
import shutil
import signal
import time
from typing import Callable

from .limits import OutputCap

_SENTINEL_ANY = rb"__ENVHUB_[0-9a-f]{16}_-?\d+__\n?"  # compiled only on the (rare) timeout path
NULL_FD = "99"  # the shell's own /dev/null, commands' stdin: high enough that scripts do not pick it by hand
_OPEN_NULL_FD = f"exec {NULL_FD}</dev/null"
_NULL_FD_LOST = f"{NULL_FD}: Bad file descriptor\n".encode()  # bash's answer if a command closed it: reopen, retype
_INIT = (
    "PS1=''; PS2=''; PS0=''; PROMPT_COMMAND=''; unset HISTFILE; set +o history; set +H; "
    "export PAGER=cat GIT_PAGER=cat MANPAGER=cat SYSTEMD_PAGER='' TERM=dumb; "
    + _OPEN_NULL_FD
)


INLINE_MAX = 2000  # well under the tty's 4095-byte line limit, with room for the wrapper
SHELL_EXITED = "\n[the shell exited; a new shell will be started for the next command]"
# prints the sentinel. Typed in full each time rather than kept in a shell function: a command cannot break it by
# redefining the function, and calling a function measured no cheaper than typing the 17 extra bytes
DONE = "printf '__ENVHUB_%s_%d__\\n'"  # one line: a tty flushes printf at every newline, so one write, one wake-up
# sentinel tokens must differ from command to command and not turn up in output by chance; they need not be secret (a
# command can read the line being run from a DEBUG trap anyway), so a seeded PRNG saves a getrandom(2) per command
_tokens = random.Random(os.urandom(16))


# A command made only of these characters, none of whose words is a reserved word, is a list of plain words: bash
# can neither reject it nor wait for more of it, so it is typed as it is (eval, the guard for the rest, costs the
# shell a second parse, a visible share of a builtin's round trip: benchmarks/tools_latency.py times both forms).
# No quotes, $, backslash, #, braces, parentheses, ! or operators (; & | < >); globs, ~, = and the like are fine.
_PLAIN = re.compile(r"[A-Za-z0-9 _./:=,+@%^~*?\[\]-]+").fullmatch
_RESERVED = frozenset("if then else elif fi case esac for select while until do done in function time coproc "
                      "[[ ]] { } !".split())


def inline_line(command: str) -> str | None:
    """The line to type for ``command`` if it can travel on the tty line itself, else None (it then goes through a
    file the shell sources).

    Only one line of printable ASCII qualifies: a control character would be taken by the line discipline (^C
    interrupts, ^D ends input, DEL erases...). A list of plain words (``ls -la src``, ``cd /testbed``, ``pytest -x
    tests/test_a.py``: see ``_PLAIN``) is typed as it is; anything else is single-quoted for ``eval``, so a syntax
    error or an unfinished construct inside is eval's error and the sentinel after it still runs. Either way stdin
    comes from the shell's /dev/null (fd ``NULL_FD``), so the command cannot read the next line.

    One difference, on purpose: an alias the agent defined that expands to a broken or unfinished construct (or to a
    ``#`` comment) is eval's error under eval, but makes a plain command wait for its timeout (then it is interrupted
    as usual). Aliases that name commands (``alias python=python3``) work the same either way.
    """
    if len(command) <= INLINE_MAX and command.isascii():
        if _PLAIN(command) and _RESERVED.isdisjoint(command.split()):
            return command + " <&" + NULL_FD
        if command.isprintable() or command.replace("\t", " ").isprintable():  # tabs are fine, rare: test again
            return "eval '" + command.replace("'", "'\\''") + "' <&" + NULL_FD
    return None


def _null_fd_lost(out: bytes) -> bool:
    return re.fullmatch(rb"bash: (line \d+: )?" + re.escape(_NULL_FD_LOST), out) is not None


def strip_sentinels(text: str) -> str:
    """Remove sentinels from the output of an interrupted command (one may come out late: not the model's business)."""
    return re.sub(_SENTINEL_ANY, b"", text.encode()).decode()


def poller(fd: int) -> select.poll:
    """A poll object watching ``fd`` for output; keep one per pty (poll(2) on a prepared set is cheaper than
    select(2) on lists made for each wait)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return p


def roundtrip(fd: int, line: str, timeout: float, cap: OutputCap, status: str = "$?", heal: bool = True,
              waiter: select.poll | None = None):
    """Type ``line`` plus the sentinel on the pty master ``fd`` and read until the sentinel comes back.

    Returns ``(code, tail, state)``: ``state`` is ``"done"`` (``code`` is the exit status), ``"timeout"`` or ``"eof"``
    (the shell's side of the pty is gone; ``code`` is None for both). Output before the sentinel goes to ``cap``;
    ``tail`` is its last bytes, for error messages. Works on any copy of the master fd: the action server's own, or
    the host's (see :mod:`envhub.sandbox.attached`). ``waiter``: a :func:`poller` for ``fd``, if the caller keeps one.
    """
    token = "%016x" % _tokens.getrandbits(64)
    # one line: a second line would cost bash another read cycle
    os.write(fd, f"{line}; {DONE} {token} {status}\n".encode())
    # the rest of the setup runs while the shell works on the command (there are other cores)
    marker = b"__ENVHUB_" + token.encode() + b"_"
    keep = 64  # bytes held back so a sentinel split across reads is still found
    pending = b""
    fed = False  # whether some output was already passed on to cap
    deadline = time.monotonic() + timeout
    left = timeout
    wait = (waiter or poller(fd)).poll
    while True:
        if wait(left * 1000.0):
            try:
                data = os.read(fd, 1 << 16)
            except OSError:  # EIO: the pty's other side is gone
                data = b""
            if not data:
                cap.feed(pending)
                return None, cap.tail_bytes().decode("utf-8", "replace"), "eof"
            if not pending and data.startswith(marker):  # the sentinel alone: a quiet command, the usual case
                end = data.find(b"__\n", len(marker))
                if end >= 0:
                    return int(data[len(marker):end]), "", "done"
            pending += data
            at = pending.find(marker)
            end = pending.find(b"__\n", at + len(marker)) if at >= 0 else -1
            if end < 0 and at >= 0:  # a tty that still translates newlines
                end = pending.find(b"__\r\n", at + len(marker))
            if end >= 0:
                out = pending[:at]
                code = int(pending[at + len(marker): end])
                if code == 1 and not fed and out.endswith(_NULL_FD_LOST) and _null_fd_lost(out) and heal:
                    # a command closed (or moved) the shell's /dev/null, so this one never ran: reopen it, retype
                    return roundtrip(fd, _OPEN_NULL_FD + "; " + line, timeout, cap, status, False, waiter)
                cap.feed(out)
                return code, "", "done"
            if len(pending) > keep and at < 0:
                cap.feed(pending[:-keep])
                fed = True
                pending = pending[-keep:]
        left = deadline - time.monotonic()
        if left <= 0:
            cap.feed(pending)
            return None, cap.tail_bytes().decode("utf-8", "replace"), "timeout"


class BashSession:
    """One interactive bash on a pty. ``run(command, timeout)`` returns ``(exit_code, output, info)``.

    Args:
        cwd: the starting directory. env: the shell's environment. cmd_file: where command text is written (a path
        the shell can read). preexec_fn: runs in the child before exec (rlimits, oom_score_adj).
    """

    def __init__(self, cwd: str, env: dict[str, str], cmd_file: str, preexec_fn: Callable[[], None] | None = None,
                 bash: str | None = None):
        self.cwd, self.env, self.cmd_file, self.preexec_fn = cwd, dict(env), cmd_file, preexec_fn
        self.bash = bash or shutil.which("bash", path=env.get("PATH")) or "/bin/bash"
        self.proc = None

    # ---- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        from ptyprocess import PtyProcess  # the only non-stdlib import of the bash path

        self.proc = PtyProcess.spawn([self.bash, "--norc", "--noprofile", "--noediting", "-i"], cwd=self.cwd,
                                     env=self.env, echo=False, dimensions=(50, 200), preexec_fn=self._child_setup)
        self.waiter = poller(self.proc.fd)
        code, out, _ = self._roundtrip(_INIT, timeout=10.0)
        if code is None:
            self.close()
            raise RuntimeError(f"bash did not start: {out[-500:]!r}")

    def _child_setup(self) -> None:
        """In the child, before bash starts: raw newlines out (no \\r\\n translation) and no echo, set on the
        terminal itself (images need not have ``stty``). Before, not after: bash saves the terminal's modes when it
        starts and puts them back whenever a job dies of a signal, so modes set later come undone at the first
        timeout."""
        import termios

        attrs = termios.tcgetattr(0)
        attrs[1] &= ~termios.ONLCR
        attrs[3] &= ~termios.ECHO
        termios.tcsetattr(0, termios.TCSANOW, attrs)
        if self.preexec_fn is not None:
            self.preexec_fn()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.isalive()

    def close(self) -> None:
        """Hang up the terminal (an interactive bash exits on SIGHUP), then kill what is left of its group."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig in (signal.SIGHUP, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
            with contextlib.suppress(Exception):  # best-effort teardown of a shell being discarded
                if sig == signal.SIGHUP:
                    deadline = time.monotonic() + 0.2
                    while proc.isalive() and time.monotonic() < deadline:
                        time.sleep(0.005)
        with contextlib.suppress(Exception):
            proc.delayafterclose = 0  # ptyprocess sleeps 0.1 s after close by default; the group is already dead
            proc.close(force=True)

    def ensure_started(self) -> bool:
        """Start the shell if it is not running. Returns True when it replaces one that died (state was lost)."""
        if self.alive:
            return False
        restarted = self.proc is not None
        self.close()
        self.start()
        return restarted

    # ---- one command ----------------------------------------------------------------------------------------------
    def run(self, command: str, timeout: float, output_limit: int) -> tuple[int, str, dict]:
        """Run ``command`` in the persistent shell. ``info`` has ``timed_out``, ``cut`` and ``restarted``."""
        restarted = self.ensure_started()
        line = inline_line(command)  # short one-line commands travel on the tty line itself: no file I/O
        if line is None:
            self._write_cmd_file(command)
            line = ". '" + self.cmd_file.replace("'", "'\\''") + "' <&" + NULL_FD
        cap = OutputCap(output_limit)
        code, _, state = self._roundtrip(line, timeout, cap)
        return self.settle(code, state, cap, restarted)

    def settle(self, code: int | None, state: str, cap: OutputCap, restarted: bool = False) -> tuple[int, str, dict]:
        """Turn a round trip's outcome into ``run``'s result. On ``"timeout"``: Ctrl-C, kill the foreground group,
        and replace the shell if it still does not answer. On ``"eof"`` (the command ended the shell: ``exit``,
        ``exec``): say so; the next command starts a new shell."""
        info = {"timed_out": False, "cut": 0, "restarted": restarted}
        if state == "timeout":
            info["timed_out"] = True
            if self._interrupt(cap) is None:  # the shell did not come back: replace it (cwd and env are lost)
                self.close()
                self.start()
                info["restarted"] = True
            code = 124
        elif state == "eof":
            info["restarted"] = True
            self.close()
        info["cut"] = cap.cut
        text = cap.text()
        if info["timed_out"]:
            text = strip_sentinels(text)
        if state == "eof":
            text += SHELL_EXITED
        return (code if code is not None else -1), text, info

    def _write_cmd_file(self, command: str) -> None:
        data = (command if command.endswith("\n") else command + "\n").encode()
        # no O_TRUNC: truncating a non-empty file costs milliseconds on ext4; ftruncate after the write does not
        fd = os.open(self.cmd_file, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def _interrupt(self, cap: OutputCap) -> int | None:
        """Ctrl-C the foreground job; if it ignores that, SIGKILL its process group; then check the shell answers."""
        try:
            self.proc.write(b"\x03")
        except OSError:
            return None
        self._drain(cap, 0.2)
        try:
            fg = os.tcgetpgrp(self.proc.fd)
            if fg > 0 and fg != os.getpgid(self.proc.pid):
                os.killpg(fg, signal.SIGKILL)
        except OSError:
            pass
        code, _, state = self._roundtrip("true", 3.0, cap, status="130")
        return code if state == "done" else None

    def _drain(self, cap: OutputCap, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self.waiter.poll(left * 1000.0):
                return
            try:
                data = os.read(self.proc.fd, 1 << 16)
            except OSError:
                return
            if not data:
                return
            cap.feed(data)

    def _roundtrip(self, line: str, timeout: float, cap: OutputCap | None = None, status: str = "$?"):
        """Send ``line`` plus the sentinel and read until the sentinel. Returns ``(code, tail, state)``."""
        return roundtrip(self.proc.fd, line, timeout, cap if cap is not None else OutputCap(1 << 16), status,
                         waiter=self.waiter)
