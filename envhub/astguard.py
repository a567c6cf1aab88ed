"""One ``ast.parse`` at a time, process-wide: CPython before 3.13 corrupts the AST constructor's depth counter when
two threads build ASTs at once.

``ast.parse`` turns the parser's C tree into Python objects in ``PyAST_mod2obj``, which keeps its recursion depth in
per-*interpreter* state, not per thread. Building the objects allocates; an allocation can run the garbage collector,
a finalizer can run Python code, and the interpreter can switch threads there. If another thread then starts an
``ast.parse`` of its own, it resets the shared counter, and the first parse ends with ``SystemError: AST constructor
recursion depth mismatch (before=27, after=-1)`` (cpython gh-106905 and the threaded reports linked there). envhub
runs verifiers in worker threads (admission's graders, ``asyncio.to_thread``), and verifiers parse (countdown's
arithmetic, math answers): on a loaded host a golden answer's re-grade crashed this way once, and admission called
the verifier unfit for it. A lock around ``ast.parse`` makes the constructions take turns; it costs one uncontended
lock per parse. It is re-entrant: a finalizer that itself parses, in the thread holding it, must not deadlock.

:func:`install` is called when :mod:`envhub.verifier` is imported (every path that runs a verifier does); it replaces
``ast.parse`` once, for this process, on the CPython versions that need it. Code calling ``compile(...,
ast.PyCF_ONLY_AST)`` directly is not covered.
"""
from __future__ import annotations

import ast
import sys
import threading
from typing import Any

_LOCK = threading.RLock()
_ORIGINAL = ast.parse
NEEDED = sys.implementation.name == "cpython" and sys.version_info < (3, 13)


def guarded_parse(*args: Any, **kwargs: Any) -> Any:
    """``ast.parse``, one call at a time across threads."""
    with _LOCK:
        return _ORIGINAL(*args, **kwargs)


guarded_parse.__doc__ = f"{guarded_parse.__doc__}\n\n{_ORIGINAL.__doc__ or ''}"


def install() -> bool:
    """Put :func:`guarded_parse` in place of ``ast.parse`` where the interpreter needs it; returns whether it is in
    place. Idempotent."""
    if NEEDED and ast.parse is _ORIGINAL:
        ast.parse = guarded_parse  # type: ignore[assignment]
    return ast.parse is guarded_parse
