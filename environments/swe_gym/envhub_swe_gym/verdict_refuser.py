"""The verdict runner's refuser hook (see :mod:`envhub_swe_gym.verdict_runner`). Standard library only; copied into
the sandbox beside the runner.

The refuser raises to refuse. Besides what the runner has always refused (tracing, ``gc`` walks, raw memory, other
threads' frames, replacing the grader's functions, frames during a comparison), it keeps the **compiled tests** out
of the tested code's reach (#29): their code objects hold every literal the tests compare with, so reading one
(``fn.__code__``, ``frame.f_code``, ``gen.gi_code``, a test function's defaults) or loading one from pytest's import
hook is refused while code of the repository under test — any code the recorder saw come from it: its modules,
and whatever they ``exec`` — is on the stack, or off the main thread. pytest, the standard library and the libraries
the tests use read the tests' code all the time (collecting, wrapping, formatting a failure): with no code of the
repository on the stack, that is allowed. Code is known by identity, never by file name.

What this cannot see: a callback composed of C functions and library functions only (``functools.partial``,
``map``, ``operator.attrgetter``) that a library frame later calls has no frame of the repository's;
docs/decisions.md ("#29") says what stays open.
"""
from __future__ import annotations

import os
import sys
import types

# What the code under test may not do in the test process: trace or profile code (a tracer can jump over assert
# lines), walk the garbage collector's object lists (the way to objects nothing else reaches), open another
# process's memory, or reach raw memory through ctypes.
BLOCKED_EVENTS = frozenset({"sys.settrace", "sys.setprofile", "sys.monitoring.register_callback", "gc.get_objects",
                            "gc.get_referrers", "gc.get_referents", "ctypes.dlopen", "ctypes.dlsym",
                            "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.string_at",
                            "ctypes.wstring_at", "ctypes.addressof"})
# refused even with the others off: a thread could watch the checker; a hook of the tested code's own would see the
# checker's verdict box after the checker, and rewrite it (CPython drops a hook whose addition a hook refuses)
ALWAYS_REFUSED = frozenset({"sys._current_frames", "sys.addaudithook"})
PROTECTED_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# the audited reads that hand out a code object, or a test function's defaults
CODE_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__", "f_code", "gi_code", "cr_code", "ag_code"})


def make_refuser(events: tuple, protected: frozenset, checker_tag: tuple, refuse: bool, tests: frozenset = frozenset(),
                 module_dicts: frozenset = frozenset(), sealed: frozenset = frozenset(), load_event: str = "",
                 query_event: str = "", readers: frozenset = frozenset()):
    """The refuser hook. It is one function with no closure, every value it uses an immutable default (its frames
    reach the code under test through tracebacks: they show nothing it could change), and it reports to the recorder.

    Refused: tracing and profiling, ``gc`` walks, other threads' frames, raw ctypes memory, ``/proc/*/mem`` by name
    (the runner's Landlock rule covers every other path), replacing the ``__code__``/``__defaults__`` of a
    ``protected`` function, reading the defaults of a ``sealed`` one (the import hook holding the compiled tests),
    any frame while the checker hook (its frames' ``repr``: ``checker_tag``) is on the stack — there the tested
    code's ``__eq__``/``__bool__`` run, and must not see which comparison is the real one — and reading the code of
    the tests (ids ``tests``) or loading it (``load_event``) off the main thread or while the recorder, asked with
    ``query_event``, finds code of the repository on the stack. ``module_dicts``: namespaces of modules loaded
    before the tests, whose functions and frames are not the tests' (a fast path); ``readers``: the ids of the
    grader's code that reads the tests' code and hands nothing of it on (the recorder, the checker's ``caller_lax``).
    """
    import _thread

    taint_event, main_thread = events[3], _thread.get_ident()
    namespaces = module_dicts | {id(globals())}  # (this module's too: its frames are never the tests')

    def refuser(event, args, _blocked=BLOCKED_EVENTS if refuse else frozenset(), _protected=protected,
                _attrs=PROTECTED_ATTRS, _frame_attrs=FRAME_ATTRS, _tag=checker_tag, _getframe=sys._getframe,
                _audit=sys.audit, _taint=taint_event, _id=id, _type=type, _str=str, _bytes=bytes, _repr=repr,
                _isinstance=isinstance, _getattr=getattr, _fsdecode=os.fsdecode, _error=RuntimeError,
                _refuse=refuse, _code_attrs=CODE_ATTRS if tests else frozenset(), _tests=tests,
                _dicts=namespaces,
                _sealed=sealed, _load=(load_event or None) if tests else None, _query=query_event,
                _frame_type=types.FrameType, _function_type=types.FunctionType, _ident=_thread.get_ident,
                _main=main_thread, _always=ALWAYS_REFUSED, *,
                _self=frozenset()):
        if event == "sys._getframe":
            frame = args[0]
            while frame is not None:  # (by repr, which reads no attribute: a frame that only looks like the
                r = _repr(frame)      # checker's refuses its own code, nothing else)
                if r.endswith(_tag[1]) and _tag[0] in r:
                    raise _error("frames are not available while the grader compares values")
                frame = frame.f_back
            return
        why = None
        asking = None
        if event == "object.__getattr__":
            name = args[1]
            if name in _frame_attrs:
                _getframe(0)  # raises (from the nested call above) inside a comparison
                return
            if name not in _code_attrs:
                return
            obj = args[0]
            if _id(obj) in _sealed:
                why = f"reading {name} of the grader's import hook"
            else:
                t = _type(obj)
                space = obj.f_globals if t is _frame_type else obj.__globals__ if t is _function_type else None
                if space is not None and _id(space) in _dicts:
                    return  # a frame or function of a module loaded before the tests
                if _id(_getframe(1).f_code) in _self:
                    return  # this hook reading a code object (just below, or walking the stack), or the recorder
                if _id(_getattr(obj, "f_code" if t is _frame_type else "__code__" if t is _function_type
                                else name)) not in _tests:
                    return
                asking = f"reading the compiled tests ({name})"
        elif event == _load:
            asking = "loading the compiled tests"
        elif event in _blocked or event in _always:
            why = event
        elif event == "object.__setattr__" and _id(args[0]) in _protected and args[1] in _attrs:
            why = f"setting {args[1]} of a grader function"
        elif _refuse and event == "open" and args and _isinstance(args[0], (_str, _bytes)):
            path = ("" if _isinstance(args[0], _str) else b"") + args[0]  # a subclass's data, none of its methods
            text = _fsdecode(path) if _type(path) is _bytes else path
            if text.startswith("/proc/") and text.endswith("/mem"):
                why = event + " /proc/*/mem"
        if asking is not None:
            if _ident() != _main:
                why = asking + " from another thread"
            else:
                box = [None]
                _audit(_query, _getframe(1), box)  # the recorder knows the repository's code
                if _type(box[0]) is _str:
                    why = f"{asking} with code of the repository under test on the stack ({box[0]})"
        if why is not None:
            _audit(_taint, "taint", why)
            raise _error(f"{why}: not allowed while the grader runs the tests")

    refuser.__kwdefaults__ = {"_self": frozenset({id(refuser.__code__)}) | readers}
    return refuser
