"""Ctrl-C while ``envhub rollout`` starts up: never lost, always exit status 130.

Start-up (importing torch and transformers, loading weights and tokenizer, reading the tasks) runs code that is not
ours, and some of it catches ``BaseException`` or runs Python code at moments where an exception is dropped
(``__del__``, weakref and GC callbacks: "Exception ignored in ..."). A KeyboardInterrupt raised there vanishes and
the run goes on as if Ctrl-C had never been pressed. So the command runs inside :func:`counting`: it still raises
KeyboardInterrupt (start-up stops at once where the interrupt can propagate), and it *counts* the interrupt, so
the rollout loop (:meth:`envhub.cli.runner.Run.execute`) asks :func:`pending` once its own handler is in place and
stops before the first episode when one was lost. A second Ctrl-C during start-up exits at once with 130.

A KeyboardInterrupt that propagates ends the command with 130 (``envhub.cli.LazyGroup``), not click's "Aborted!"
and 1.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process that Ctrl-C ended
_count = 0


def _handler(signum, frame) -> None:
    global _count
    _count += 1
    if _count > 1:  # the first one was swallowed somewhere, or cleanup is slow: the user wants out
        sys.stderr.write("\ninterrupted again: exiting now\n")
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    raise KeyboardInterrupt


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """Count SIGINTs inside the block (see the module docstring); the previous handler is back after it. Only the
    main thread can set a handler: elsewhere (a command run from a worker thread) nothing changes."""
    global _count
    _count = 0
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def pending() -> bool:
    """Whether a Ctrl-C came inside :func:`counting` (also one whose KeyboardInterrupt something swallowed)."""
    return _count > 0
