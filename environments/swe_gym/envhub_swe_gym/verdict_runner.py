"""The grader's pytest launcher, run *inside* the grading sandbox (standard library and pytest only).

The grader copies this file and its three modules into a read-only directory of the sandbox (``/grader/<random>.py``,
``<random>_instrument.py``, ``<random>_checker.py``, ``<random>_refuser.py``) and runs ``python -I -B
/grader/<random>.py <pytest args>`` with a JSON secret on stdin. The code under test will share this process, so
everything that decides a verdict is put, before any of that code exists, where Python code cannot reach it:
**inside three audit hooks**. An audit hook cannot be removed, listed or inspected from Python, and nothing
references it; adding one is refused.

1. :func:`read_secret` reads the secret (HMAC key, run id, records path, the test files *and their text*: on disk
   they are empty, #29) to EOF and points fd 0 at ``/dev/null``. The test files are instrumented and compiled now
   (:mod:`~envhub_swe_gym.verdict_instrument`); pytest's import hook is handed these code objects, once each.
2. The **recorder** (:func:`make_recorder`) holds the key in its closure and writes the records
   (``json([run, seq, nodeid, when, outcome]) + " " + HMAC-SHA256(key, json)``) with C functions only. It never
   raises and never calls code the tested package could patch, so no frame of it ever reaches that code, below it
   or in a traceback. It writes ``body-end`` only when the frame raising ``END`` runs the code object compiled for
   the test pytest is running, accepts control events only from this file's plugin code, knows the repository's
   code (every module executed from the repository, and what that code executes), and records a test body that
   begins outside its own test run (a dry run of the tests).
3. The **checker** (:mod:`~envhub_swe_gym.verdict_checker`) decides every instrumented comparison and truth,
   with fresh-object and same-type twin probes in random order, and watches what tests rely on. Closure- and
   global-free functions with immutable defaults: a frame of it would show nothing a hack could change.
4. The **refuser** (:mod:`~envhub_swe_gym.verdict_refuser`) raises to refuse, and is one closure-free function with
   immutable defaults: tracing, ``gc`` walks, other threads' frames, raw ctypes memory, ``/proc/*/mem`` (and, by a
   Landlock kernel rule, everything under ``/proc``: :func:`confine_proc`), new audit hooks, replacing the code or
   defaults of the grader's functions, any frame while the checker runs the tested code's ``__eq__``/``__bool__``,
   and reading the compiled tests with the repository's code on the stack.

The threat model and what stays out of reach are in docs/decisions.md ("#13 swe-gym verdicts, sealed" and "#29").
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
REFUSER = load_sibling("refuser")


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
    seq, current, ended, begun, said = [0], [None], set(), set(), set()
    END, MODULE, CONTROL, TAINT, BEGIN, QUERY = events
    repository, kept = set(), []  # the code of the repository under test: its modules, and what they exec
    dry_runs_refused = secret.get("dry_run", True)
    is_test, code_type, frame_type, _list = INSTRUMENT.is_test_path, type(expected_qualname.__code__), type(getframe()), list

    def from_repository(path):
        return _type(path) is _str and path.startswith(root) and not is_test(path[_len(root):])

    def mark(code):
        todo = [code]
        while todo:
            c = todo.pop()
            if _id(c) not in repository:
                repository.add(_id(c))
                kept.append(c)  # (an id is an identity only while its object lives)
                todo.extend(k for k in c.co_consts if _type(k) is code_type)

    def on_stack(frame):
        """The first frame running the repository's code, described, or None."""
        while frame is not None:
            code = frame.f_code
            if _id(code) in repository:
                return "%s:%d %s" % (code.co_filename, code.co_firstlineno, code.co_name)
            frame = frame.f_back
        return None

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
        if event == "exec":  # a module of the repository, or code that code of the repository runs
            if _len(args) == 1 and _type(args[0]) is code_type and (
                    from_repository(args[0].co_filename) or on_stack(getframe(2)) is not None):
                mark(args[0])
            return
        if event == QUERY:  # the refuser asks: code of the repository on this stack? (anyone may ask)
            if _len(args) == 2 and _type(args[1]) is _list and _len(args[1]) == 1:
                args[1][0] = on_stack(args[0]) if _type(args[0]) is frame_type else None
            return
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
        if event == BEGIN:
            if not dry_runs_refused:
                return
            if cid not in tests:  # a forged event, or the refuser kept the body's code from this stack
                tamper("a test body began under code that is not pytest's or the tests' (a dry run of the tests)")
                return
            rel, qual, _ = tests[cid]
            cur = current[0]
            running = cur is not None and cur[1] == rel and cur[2] == qual
            if running and cur[0] not in begun:  # the test starting, through whatever wraps it (hypothesis, a
                begun.add(cur[0])                 # decorator of the repository's own)
                return
            try:
                helper = _id(getframe(3).f_code) in tests  # a test calling a test: an honest helper call
            except _BaseException:
                helper = False
            if (not running and not helper) or on_stack(getframe(2)) is not None:  # (hypothesis re-running an
                # example: running, nothing of the repository's on the stack)
                tamper(f"the body of {rel}::{qual} ran outside its own test run (a dry run of the tests)")
            return
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

    def recorder(event, args, _ours=frozenset(events) | {"exec"}):
        if event in _ours:
            try:
                handle(event, args)
            except _BaseException:  # (nothing of ours raises; an fd the tested code closed does: the records stop)
                pass

    return recorder


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


def use_precompiled(compiled: dict, load_event: str) -> tuple:
    """Make pytest's assertion-rewriting import hook load ``compiled`` (``{absolute path: code}``) for those files,
    each once (the map empties as pytest imports them); return the two functions that hold the map (the refuser seals
    their defaults). Each load raises ``load_event``: the refuser lets it through only from pytest's import (no
    tested code on the stack)."""
    from _pytest.assertion import rewrite

    def _rewrite_test(fn, config, _compiled=compiled, _original=rewrite._rewrite_test, _str=str, _audit=sys.audit,
                      _event=load_event):
        if _str(fn) not in _compiled:
            return _original(fn, config)
        _audit(_event, _str(fn))
        return b"", _compiled.pop(_str(fn))

    def _read_pyc(source, pyc, trace=lambda x: None, _compiled=compiled, _original=rewrite._read_pyc, _str=str):
        return None if _str(source) in _compiled else _original(source, pyc, trace)

    rewrite._rewrite_test, rewrite._read_pyc = _rewrite_test, _read_pyc
    return _rewrite_test, _read_pyc


def main() -> int:
    secret = read_secret()
    import pytest

    ins, checks = INSTRUMENT, CHECKER
    root = secret["rootdir"].rstrip("/") + "/"
    sources = secret.pop("sources", None) or {}
    files = {}
    for rel in secret["files"]:  # the test files' text came on stdin: on disk they are empty (#29)
        built = ins.precompile(root + rel, secret.get("truth", True), sources.get(rel))
        if built is not None:
            code, classes = built
            files[rel] = (code, classes, list(ins.codes_in(code)))
    del sources
    wrappers = checks.wrap_unittest(ins) if secret.get("unittest", True) else {}
    watched = checks.watched_objects(wrappers, ins.FROZEN_BUILTINS)
    confinement = confine_proc()  # (ctypes is refused once the hooks are in)
    plugin = make_plugin(ins.CONTROL)
    hooks = [type(plugin).pytest_runtest_call, type(plugin).pytest_runtest_makereport,
             type(plugin).pytest_sessionfinish]
    checker, checker_functions = checks.make_checker((ins.COMPARE, ins.TRUTH, ins.END, ins.CONTROL, ins.TAINT),
                                                     secret.get("truth", True), watched)
    sealed = use_precompiled({root + rel: code for rel, (code, _, _) in files.items()}, ins.LOAD)
    protected = frozenset(id(f) for f in [ins.cmp, ins.truth, note, expected_qualname, checks.caller_lax, *hooks,
                                          *wrappers.values(), *checker_functions, *sealed])
    events = (ins.END, ins.MODULE, ins.CONTROL, ins.TAINT, ins.BEGIN, ins.QUERY)
    recorder = make_recorder(secret, root, files, events, frozenset(id(f.__code__) for f in [note, *hooks]))
    tests = frozenset(id(c) for _, _, codes in files.values() for c in codes) if secret.get("memory", True) \
        else frozenset()
    readers = frozenset(id(c) for c in make_recorder.__code__.co_consts if hasattr(c, "co_code"))  # the recorder's
    tag = (f"file {checker.__code__.co_filename!r}, line", f", code {checker.__code__.co_name}>")
    refuser = REFUSER.make_refuser(events, protected, tag, secret.get("audit", True), tests,
                                   frozenset(id(vars(m)) for m in [*sys.modules.values(), ins, checks] if hasattr(m, "__dict__")),
                                   frozenset(id(f) for f in sealed), ins.LOAD, ins.QUERY,
                                   readers | {id(checks.caller_lax.__code__)})
    for hook in (recorder, checker, refuser):
        sys.addaudithook(hook)
    note("confine", confinement)
    argv = sys.argv[1:]
    del secret, files, watched, recorder, checker, refuser, checker_functions
    return int(pytest.main(argv, plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main())
