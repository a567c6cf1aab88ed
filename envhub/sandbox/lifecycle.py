"""Keeping sandboxes from outliving their owner: the live registry, the spawner thread, and process scans.

* **Registry.** Every started sandbox is registered until ``stop()``; at interpreter exit (``atexit``) and on
  SIGTERM / SIGHUP / SIGINT (handlers installed on first use, chaining to the previous ones) every live sandbox is
  stopped, so its processes and its workspace go away with us.
* **Spawner thread.** ``bwrap --die-with-parent`` uses ``PR_SET_PDEATHSIG``, which fires when the *thread* that
  forked bwrap exits, not the process. Sandboxes are started from worker threads (``asyncio.to_thread``, thread pools,
  the prewarmed pool's refill thread), so every sandbox process is forked from one long-lived daemon thread instead:
  its children then die only when the interpreter does (even on SIGKILL, which no handler sees).
* **Scans.** :func:`pids_in_pidns` lists every process in a PID namespace, which is how ``stop()`` confirms that
  nothing of a sandbox is left.
"""
from __future__ import annotations

import atexit
import logging
import os
import queue
import signal
import subprocess
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)
_live: dict[str, Any] = {}
_live_lock = threading.Lock()
_changed = threading.Condition(_live_lock)  # notified when a sandbox stops or a start slot is given back
_reserved = 0  # start slots handed out by reserve() and not yet given back
_hooks_installed = False


def register(sandbox: Any) -> None:
    _install_hooks()
    with _live_lock:
        _live[sandbox.id] = sandbox


def unregister(sandbox: Any) -> None:
    with _changed:
        _live.pop(sandbox.id, None)
        _changed.notify_all()


def reserve(limit: int, cancelled: Callable[[], bool], timeout: float | None = None) -> bool:
    """Block until fewer than ``limit`` sandboxes are live or starting in this process, then take a start slot
    (give it back with :func:`release` once the sandbox is registered, or its start failed). False if
    ``cancelled()`` became true or ``timeout`` passed first. This is how a service queues sandbox starts at a node's
    limit instead of failing them."""
    global _reserved
    with _changed:
        ok = _changed.wait_for(lambda: cancelled() or len(_live) + _reserved < limit, timeout)
        if not ok or cancelled():
            return False
        _reserved += 1
        return True


def release() -> None:
    """Give back a slot taken by :func:`reserve`."""
    global _reserved
    with _changed:
        _reserved -= 1
        _changed.notify_all()


def wake() -> None:
    """Wake every :func:`reserve` waiter so it re-checks ``cancelled()`` (a provider closing)."""
    with _changed:
        _changed.notify_all()


def live() -> list[Any]:
    """Sandboxes started in this interpreter and not yet stopped."""
    with _live_lock:
        return list(_live.values())


def stop_all() -> None:
    """Stop every live sandbox (best effort: one failing stop never keeps the others alive)."""
    for sb in live():
        try:
            sb.stop(grace_s=0.1)
        except Exception:  # one failing stop never keeps the others alive, but a possible leak is reported
            log.warning("sandbox %s: stop() raised while stopping every live sandbox", sb.id, exc_info=True)


def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit and PDEATHSIG still cover us
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        try:
            previous = signal.getsignal(sig)
            signal.signal(sig, _make_handler(sig, previous))
        except (ValueError, OSError):
            pass


def _make_handler(sig: int, previous: Any) -> Callable:
    def handler(signum, frame):
        stop_all()
        if callable(previous):
            return previous(signum, frame)
        if previous == signal.SIG_IGN:
            return None
        signal.signal(signum, signal.SIG_DFL)  # default action (terminate) now that the sandboxes are gone
        os.kill(os.getpid(), signum)
    return handler


# ---- the spawner thread ----------------------------------------------------------------------------------------
_spawn_q: queue.Queue = queue.Queue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawn_loop() -> None:
    while True:
        fn, box, done = _spawn_q.get()
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # handed back to the caller's thread
            box.append(("err", e))
        done.set()


def spawn(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen_kwargs)`` run on the long-lived spawner thread (see module docstring)."""
    global _spawner
    if threading.current_thread() is _spawner:
        return subprocess.Popen(argv, **popen_kwargs)
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawn_loop, name="envhub-sandbox-spawner", daemon=True)
            _spawner.start()
    box: list = []
    done = threading.Event()
    _spawn_q.put((lambda: subprocess.Popen(argv, **popen_kwargs), box, done))
    done.wait()
    kind, value = box[0]
    if kind == "err":
        raise value
    return value


# ---- process scans ---------------------------------------------------------------------------------------------
def pid_ns(pid: int) -> int | None:
    """The inode of ``pid``'s PID namespace, or None if it is gone (or a zombie)."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    return int(link[link.index("[") + 1: -1])


def pids_in_pidns(ns: int) -> list[int]:
    """Host pids of every live (non-zombie) process whose PID namespace is ``ns``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and pid_ns(int(name)) == ns and not _is_zombie(int(name)):
            out.append(int(name))
    return out


def _environments():
    """``(pid, environment items)`` of every process whose environment this host lets us read."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        yield int(name), env.split(b"\0")


def pids_with_env(marker: bytes) -> list[int]:
    """Host pids of live processes whose environment contains ``marker`` (e.g. ``b"ENVHUB_SANDBOX_ID=ab12"``)."""
    return [pid for pid, items in _environments() if marker in items and not _is_zombie(pid)]


def sandbox_pids() -> dict[str, list[int]]:
    """``{sandbox id: [host pids]}`` of every live process tagged ``ENVHUB_SANDBOX_ID=<id>`` in its environment.

    Every process a runtime starts carries the tag (commands inherit it), so this finds what a sandbox left behind;
    only a process that scrubbed its own environment escapes it (PID namespaces and cgroups catch those).
    """
    out: dict[str, list[int]] = {}
    for pid, items in _environments():
        for item in items:
            if item.startswith(b"ENVHUB_SANDBOX_ID=") and not _is_zombie(pid):
                out.setdefault(item[18:].decode(errors="replace"), []).append(pid)
                break
    return out


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2: stat.rindex(b")") + 3] in (b"Z", b"X")


def kill_all(pids: list[int] | set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
