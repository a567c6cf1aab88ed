"""An IPython shell living in the action server's process: state persists across calls, no kernel, no ZMQ.

IPython is imported on the first call only, so sandboxes that never use the python tool never pay for it. Output
(``print``, the ``Out`` of the last expression, tracebacks) is captured into an :class:`OutputCap`. A timeout raises
``TimeoutError`` inside the running cell from a ``SIGALRM`` handler (the server's main thread runs the cell), which
stops pure-Python loops; the server's watchdog covers code stuck inside C.
"""
from __future__ import annotations

import contextlib

import io
import signal
import sys

from .limits import OutputCap


class _CapStream(io.TextIOBase):
    """A text stream that feeds an OutputCap: printing 200 MB costs the server only the kept head and tail."""

    def __init__(self, cap: OutputCap):
        self.cap = cap

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.cap.feed(s.encode("utf-8", errors="replace"))
        return len(s)

    def isatty(self) -> bool:
        return False


class PythonSession:
    """A persistent IPython ``InteractiveShell``; ``run(code, timeout, output_limit) -> (ok, output, info)``."""

    def __init__(self, cwd: str):
        self.cwd = cwd
        self.shell = None

    def _ensure(self):
        if self.shell is None:
            from IPython.core.interactiveshell import InteractiveShell

            self.shell = InteractiveShell.instance(colors="nocolor", history_length=0, cache_size=0)
            with contextlib.suppress(Exception):  # older IPython: no history manager to switch off
                self.shell.history_manager.enabled = False
        return self.shell

    def run(self, code: str, timeout: float, output_limit: int) -> tuple[bool, str, dict]:
        shell = self._ensure()
        cap = OutputCap(output_limit)
        stream = _CapStream(cap)
        info = {"timed_out": False, "cut": 0}

        def on_alarm(signum, frame):
            info["timed_out"] = True
            raise TimeoutError(f"the cell ran longer than {timeout:g} s and was interrupted")

        old_out, old_err = sys.stdout, sys.stderr
        old_handler = signal.signal(signal.SIGALRM, on_alarm)
        sys.stdout = sys.stderr = stream
        try:
            signal.setitimer(signal.ITIMER_REAL, max(timeout, 0.001))
            try:
                result = shell.run_cell(code, store_history=False, silent=False)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except TimeoutError as e:  # raised between IPython's own handlers: still a clean, marked result
            result = None
            stream.write(f"TimeoutError: {e}\n")
        finally:
            sys.stdout, sys.stderr = old_out, old_err
            signal.signal(signal.SIGALRM, old_handler)
        ok = result is not None and result.success and not info["timed_out"]
        info["cut"] = cap.cut
        return ok, cap.text(), info
