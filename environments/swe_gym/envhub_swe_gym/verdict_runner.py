"""The grader's pytest launcher, run *inside* the grading sandbox (standard library and pytest only).

The grader copies this file and its two modules into a read-only directory of the sandbox (``/grader/<random>.py``,
``<random>_instrument.py``, ``<random>_checker.py``) and runs ``python -I -B /grader/<random>.py <pytest args>`` with
a JSON secret on stdin. The code under test will share this process, so everything that decides a verdict is put,
before any of that code exists, where Python code cannot reach it: **inside three audit hooks**. An audit hook
cannot be removed, listed or inspected from Python, and nothing references it.

1. :func:`read_secret` reads the secret (HMAC key, run id, records path, test files) to EOF and points fd 0 at
   ``/dev/null``. The test files are instrumented and compiled now (:mod:`~envhub_swe_gym.verdict_instrument`);
   pytest's import hook is handed these code objects.
2. The **recorder** (:func:`make_recorder`) holds the key in its closure and writes the records
   (``json([run, seq, nodeid, when, outcome]) + " " + HMAC-SHA256(key, json)``) with C functions only. It never
   raises and never calls code the tested package could patch, so no frame of it ever reaches that code, below it
   or in a traceback. It writes ``body-end`` only when the frame raising ``END`` runs the code object compiled for
   the test pytest is running, and accepts control events only from this file's plugin code.
3. The **checker** (:mod:`~envhub_swe_gym.verdict_checker`) decides every instrumented comparison and truth,
   with fresh-object and same-type twin probes in random order, and watches what tests rely on. Closure- and
   global-free functions with immutable defaults: a frame of it would show nothing a hack could change.
4. The **refuser** (:func:`make_refuser`) raises to refuse, and is one closure-free function with immutable
   defaults: tracing, ``gc`` walks, other threads' frames, raw ctypes memory, ``/proc/*/mem`` (and, by a Landlock
   kernel rule, everything under ``/proc``: :func:`confine_proc`), replacing the code or defaults of the grader's
   functions, and any frame while the checker runs the tested code's ``__eq__``/``__bool__``.

The threat model and what stays out of reach are in docs/decisions.md ("#13 swe-gym verdicts, sealed").
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys


def read_secret() -> dict:
    chunks = []
    while True:
        b = os.read(0, 1 << 16)
        if not b:
            break
        chunks.append(b)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return json.loads(b"".join(chunks).decode())


def load_sibling(part: str):
    """The module beside this file (``<name>_<part>.py``; ``verdict_<part>.py`` when this file is the package's own),
    loaded by path and not registered in ``sys.modules``."""
    here = os.path.abspath(__file__)
    path = here[:-3] + f"_{part}.py"
    if not os.path.exists(path):  # imported as a package module (tests on the host)
        path = os.path.join(os.path.dirname(here), f"verdict_{part}.py")
    spec = importlib.util.spec_from_file_location(f"_envhub_verdict_{part}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


INSTRUMENT = load_sibling("instrument")
CHECKER = load_sibling("checker")


# What the code under test may not do in the test process: trace or profile code (a tracer can jump over assert
# lines), walk the garbage collector's object lists (the way to objects nothing else reaches), open another
# process's memory, or reach raw memory through ctypes.
# (Other threads' frames, ``sys._current_frames``, are refused even with these off: see make_refuser.)
BLOCKED_EVENTS = frozenset({"sys.settrace", "sys.setprofile", "sys.monitoring.register_callback", "gc.get_objects",
                            "gc.get_referrers", "gc.get_referents", "ctypes.dlopen", "ctypes.dlsym",
                            "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.string_at",
                            "ctypes.wstring_at", "ctypes.addressof"})
PROTECTED_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})


def expected_qualname(nodeid: str, classes: dict, _range=range, _next=next, _len=len, _set=set) -> str | None:
    """The ``co_qualname`` of the function a node id runs: ``f`` for ``path::f[1]``, ``K.f`` for ``path::K::f``,
    ``Base.f`` when ``K`` does not define ``f`` but a class ``Base`` of the same file it derives from does."""
    parts = nodeid.split("::")
    name = parts[-1].split("[", 1)[0]
    if _len(parts) == 2:
        return name
    klass = ".".join(parts[1:-1])
    for _ in _range(32):  # (builtins bound as defaults: the recorder hook calls this, see install_recorder)
        own, bases = classes.get(klass, (_set(), []))
        if name in own:
            return f"{klass}.{name}"
        klass = _next((b for b in bases if b in classes), None)
        if klass is None:
            return None
    return None


def make_recorder(secret: dict, root: str, files: dict, events: tuple, trusted: frozenset):
    """The recorder hook. ``files``: ``{relpath under root: (module code, classes, every code object in it)}``;
    ``trusted``: the ids of the code objects whose control events count (the plugin's).

    The key lives only in this closure. The hook never raises and never calls code the tested package could have
    patched (every builtin is bound here; it calls C functions, and :func:`expected_qualname`, which has no globals),
    so no frame of it ever reaches that code: not below it, not in a traceback."""
    import _hashlib
    import _thread
    import json.encoder

    key = bytes.fromhex(secret.pop("key"))
    run = secret["run"]
    fd = os.open(secret["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    digest, encode = _hashlib.hmac_digest, json.encoder.c_encode_basestring_ascii
    if encode is None:
        raise SystemExit("the verdict runner needs the C json encoder")
    write_fd, getframe = os.write, sys._getframe
    lock = _thread.RLock()  # C, and re-entrant: a signal handler's event in the middle of a write must not hang
    _id, _type, _str, _int, _len, _BaseException = id, type, str, int, len, BaseException
    modules = {_id(code): (rel, code) for rel, (code, _, _) in files.items()}
    tests = {_id(c): (rel, c.co_qualname, c) for rel, (_, _, codes) in files.items() for c in codes}
    classes = {rel: cls for rel, (_, cls, _) in files.items()}
    resolve = expected_qualname
    seq, current, ended, said = [0], [None], set(), set()
    END, MODULE, CONTROL, TAINT = events

    def write(nodeid, when, outcome):
        with lock:  # another thread's event could take the same number (the GIL is free during the write)
            body = '["%s", %d, %s, %s, %s]' % (run, seq[0], encode(nodeid), encode(when), encode(outcome))
            seq[0] += 1
            write_fd(fd, (body + " " + digest(key, body.encode(), "sha256").hex() + "\n").encode())

    def strs(args, n):
        if _len(args) != n:
            return False
        for a in args:
            if _type(a) is not _str:
                return False
        return True

    def tamper(message):
        if message not in said:
            said.add(message)
            write("", "tamper", message)

    def handle(event, args):
        if event == TAINT:  # anyone may report tampering (a forged report only harms the one who forges it)
            tamper(args[1] if _len(args) == 2 and _type(args[1]) is _str else "a malformed tampering report")
            return
        try:
            code = getframe(2).f_code  # 0: handle, 1: recorder, 2: the frame that called sys.audit
        except _BaseException:
            code = None
        cid = _id(code)
        if event == END and cid in tests:
            rel, qual, _ = tests[cid]
            cur = current[0]
            if cur is not None and cur[1] == rel and cur[2] == qual and cur[0] not in ended:
                ended.add(cur[0])
                write(cur[0], "body-end", "")
            return  # a test body another test called (an honest helper call): nothing to record
        if event == MODULE and cid in modules:
            write(root + modules[cid][0], "instrumented", "")
            return
        if cid not in trusted or not args or _type(args[0]) is not _str:
            tamper(f"{event} raised by code that is not the grader's")
        elif args[0] == "begin" and strs(args, 2):
            rel = args[1].split("::", 1)[0]
            current[0] = (args[1], rel, resolve(args[1], classes.get(rel, {})))
        elif args[0] == "done":
            current[0] = None
        elif args[0] == "outcome" and strs(args, 4):
            write(args[1], args[2], args[3])
        elif args[0] == "finish" and _len(args) == 2 and _type(args[1]) is _int:
            write("", "end", "%d" % args[1])
        elif args[0] == "note" and strs(args, 3) and args[1] == "confine":
            write("", "confine", args[2])

    def recorder(event, args, _ours=frozenset(events)):
        if event in _ours:
            try:
                handle(event, args)
            except _BaseException:  # (nothing of ours raises; an fd the tested code closed does: the records stop)
                pass

    return recorder


def make_refuser(events: tuple, protected: frozenset, checker_code: int, refuse: bool):
    """The refuser hook: it raises to refuse, so its frames can reach the code under test through tracebacks; it is
    one function with no closure, every value it uses an immutable default, and it reports to the recorder.

    Refused: tracing and profiling, ``gc`` walks, other threads' frames, raw ctypes memory, ``/proc/*/mem`` by name
    (the kernel rule in :func:`confine_proc` covers every other path), replacing the ``__code__``/``__defaults__``
    of a ``protected`` function, and any frame while the checker hook (code ``checker_code``) is on the stack —
    there the tested code's ``__eq__``/``__bool__`` run, and must not see which comparison is the real one."""
    taint_event = events[3]

    def refuser(event, args, _blocked=BLOCKED_EVENTS if refuse else frozenset(), _protected=protected,
                _attrs=PROTECTED_ATTRS, _frame_attrs=FRAME_ATTRS, _checker=checker_code, _getframe=sys._getframe,
                _audit=sys.audit, _taint=taint_event, _id=id, _type=type, _str=str, _bytes=bytes,
                _isinstance=isinstance, _fsdecode=os.fsdecode, _error=RuntimeError, _refuse=refuse):
        if event == "sys._getframe":
            frame = args[0]
            while frame is not None:
                if _id(frame.f_code) == _checker:
                    raise _error("frames are not available while the grader compares values")
                frame = frame.f_back
            return
        if event == "object.__getattr__":
            if args[1] in _frame_attrs:
                _getframe(0)  # raises (from the nested call above) inside a comparison
            return
        why = None
        if event in _blocked or event == "sys._current_frames":  # the latter always: a thread could watch the checker
            why = event
        elif event == "object.__setattr__" and _id(args[0]) in _protected and args[1] in _attrs:
            why = f"setting {args[1]} of a grader function"
        elif _refuse and event == "open" and args and _isinstance(args[0], (_str, _bytes)):
            path = ("" if _isinstance(args[0], _str) else b"") + args[0]  # a subclass's data, none of its methods
            text = _fsdecode(path) if _type(path) is _bytes else path
            if text.startswith("/proc/") and text.endswith("/mem"):
                why = event + " /proc/*/mem"
        if why is not None:
            _audit(_taint, "taint", why)
            raise _error(f"{why}: not allowed while the grader runs the tests")

    return refuser


def confine_proc() -> str:
    """Deny this process and its children every access under ``/proc`` (Landlock: everything else stays as it was).

    ``/proc/self/mem`` is this process's own memory, which the kernel lets it read whatever its path is (a symlink,
    ``/proc/thread-self``, a relative path): a kernel rule on the ``/proc`` tree, not a path check, keeps the key
    out of reach. Returns what was done, for the records ("landlock-abi-N", or "none: why")."""
    import ctypes
    import stat

    create, add, restrict = 444, 445, 446  # landlock_* syscall numbers (the same on every architecture)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        abi = libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    except (OSError, AttributeError) as e:
        return f"none: {e}"
    if abi < 1:
        return f"none: Landlock is not available here ({os.strerror(ctypes.get_errno())})"
    file_rights = 1 | 2 | 4 | ((1 << 14) if abi >= 3 else 0) | ((1 << 15) if abi >= 5 else 0)
    all_rights = ((1 << 13) - 1) | ((1 << 13) if abi >= 2 else 0) | file_rights

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(all_rights)
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"none: landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
    try:
        for name in sorted(os.listdir("/")):
            if name == "proc":
                continue
            try:
                fd = os.open("/" + name, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rights = all_rights if stat.S_ISDIR(os.fstat(fd).st_mode) else file_rights
                rule = PathBeneath(rights, fd)
                if libc.syscall(add, ruleset, 1, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    return f"none: landlock_add_rule /{name}: {os.strerror(ctypes.get_errno())}"
            finally:
                os.close(fd)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required to restrict oneself unprivileged
            return f"none: no_new_privs: {os.strerror(ctypes.get_errno())}"
        if libc.syscall(restrict, ruleset, ctypes.c_uint32(0)) != 0:
            return f"none: landlock_restrict_self: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(ruleset)
    return f"landlock-abi-{abi}"


def make_plugin(control: str):
    """The recorder plugin: pytest calls it; it raises the control events the recorder hook accepts from its code
    alone. It is passed to ``pytest.main`` (no ``-p`` name to find)."""
    import pytest

    def classify(item, call) -> str:
        exc = call.excinfo
        if exc is None:
            return "xfail" if item.get_closest_marker("xfail") else "passed"
        return "skipped" if isinstance(exc.value, pytest.skip.Exception) else "failed"

    class Recorder:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item, _audit=sys.audit, _event=control):
            _audit(_event, "begin", item.nodeid)
            try:
                yield
            finally:
                _audit(_event, "done")

        @pytest.hookimpl(hookwrapper=True)  # old-style: works with every pytest the package allows (>= 7)
        def pytest_runtest_makereport(self, item, call, _audit=sys.audit, _event=control, _classify=classify):
            yield
            _audit(_event, "outcome", item.nodeid, call.when, _classify(item, call))

        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(self, session, exitstatus, _audit=sys.audit, _event=control):
            _audit(_event, "finish", int(exitstatus))

    return Recorder()


def note(what: str, text: str, _audit=sys.audit, _event=INSTRUMENT.CONTROL) -> None:
    _audit(_event, "note", what, text)


def use_precompiled(compiled: dict) -> None:
    """Make pytest's assertion-rewriting import hook load ``compiled`` (``{absolute path: code}``) for those files."""
    from _pytest.assertion import rewrite

    def _rewrite_test(fn, config, _compiled=compiled, _original=rewrite._rewrite_test, _str=str):
        code = _compiled.get(_str(fn))
        return (b"", code) if code is not None else _original(fn, config)

    def _read_pyc(source, pyc, trace=lambda x: None, _compiled=compiled, _original=rewrite._read_pyc, _str=str):
        return None if _str(source) in _compiled else _original(source, pyc, trace)

    rewrite._rewrite_test, rewrite._read_pyc = _rewrite_test, _read_pyc


def main() -> int:
    secret = read_secret()
    import pytest

    ins, checks = INSTRUMENT, CHECKER
    root = secret["rootdir"].rstrip("/") + "/"
    files = {}
    for rel in secret["files"]:
        built = ins.precompile(root + rel, secret.get("truth", True))
        if built is not None:
            code, classes = built
            files[rel] = (code, classes, list(ins.codes_in(code)))
    wrappers = checks.wrap_unittest(ins) if secret.get("unittest", True) else {}
    watched = checks.watched_objects(wrappers, ins.FROZEN_BUILTINS)
    confinement = confine_proc()  # (ctypes is refused once the hooks are in)
    plugin = make_plugin(ins.CONTROL)
    hooks = [type(plugin).pytest_runtest_call, type(plugin).pytest_runtest_makereport,
             type(plugin).pytest_sessionfinish]
    checker, checker_functions = checks.make_checker((ins.COMPARE, ins.TRUTH, ins.END, ins.CONTROL, ins.TAINT),
                                                     secret.get("truth", True), watched)
    protected = frozenset(id(f) for f in [ins.cmp, ins.truth, note, expected_qualname, checks.caller_lax, *hooks,
                                          *wrappers.values(), *checker_functions])
    events = (ins.END, ins.MODULE, ins.CONTROL, ins.TAINT)
    recorder = make_recorder(secret, root, files, events, frozenset(id(f.__code__) for f in [note, *hooks]))
    refuser = make_refuser(events, protected, id(checker.__code__), refuse=secret.get("audit", True))
    for hook in (recorder, checker, refuser):
        sys.addaudithook(hook)
    note("confine", confinement)
    use_precompiled({root + rel: code for rel, (code, _, _) in files.items()})
    argv = sys.argv[1:]
    del secret, files, watched, recorder, checker, refuser, checker_functions
    return int(pytest.main(argv, plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main())
