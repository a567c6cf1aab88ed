"""Output caps and per-process resource limits, applied inside the sandbox.

:class:`OutputCap` keeps the head and the tail of a stream and counts what was cut in between, so a command that
prints 200 MB costs the server a few kilobytes of memory and the model still sees how the output started and ended.
:func:`apply_rlimits` is meant to run in a child between ``fork`` and ``exec`` (``preexec_fn``): it lowers only soft
limits the caller asked for.
"""
from __future__ import annotations

import resource

MB = 1 << 20


class OutputCap:
    """Accumulate a byte stream keeping at most ``limit`` bytes: the first half and the last half.

    ``cut`` counts the bytes dropped from the middle. ``text()`` renders the kept bytes with a marker saying how much
    was cut, so the reader never mistakes a truncated output for a complete one.
    """

    __slots__ = ("limit", "head_limit", "tail_limit", "head", "tail", "total")

    def __init__(self, limit: int):
        self.limit = limit
        self.total = 0
        # the buffers are made when output first arrives: most commands an agent runs print little or nothing, and
        # on the bash tool's hot path every object made counts (see benchmarks/tools_latency.py)
        self.head: bytearray | None = None

    def _open(self) -> None:
        self.limit = max(0, int(self.limit))
        self.head_limit = self.limit // 2
        self.tail_limit = self.limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()

    def feed(self, data: bytes) -> None:
        if self.head is None:
            if not data:
                return
            self._open()
        self.total += len(data)
        if not self.tail and len(self.head) + len(data) <= self.head_limit:  # the usual case: it all fits
            self.head += data
            return
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_limit + 65536:  # trim in batches: amortized O(1) per byte
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def cut(self) -> int:
        if self.head is None:
            return 0
        return max(0, self.total - len(self.head) - min(len(self.tail), self.tail_limit))

    def tail_bytes(self) -> bytes:
        if self.head is None or not self.tail_limit:
            return b""
        return bytes(self.tail[-self.tail_limit:])

    def text(self) -> str:
        if self.head is None:
            return ""
        if not self.tail:  # the usual case: everything fit in the head
            return self.head.decode("utf-8", errors="replace")
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail_bytes().decode("utf-8", errors="replace")
        if not self.cut:
            return head + tail
        return f"{head}\n[... {self.cut} bytes of output cut (kept the first {len(self.head)} and last " \
               f"{len(self.tail_bytes())} of {self.total}) ...]\n{tail}"


def clip(text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to at most ``limit`` bytes (UTF-8) by :class:`OutputCap`: ``(kept text with a marker, bytes cut)``.

    Used where output did not come through a cap already (the editor's views) and, on the host, on everything an
    action server answers: code in the sandbox can rewrite the server's own caps (the python tool runs in its
    process), so the host never trusts the server to have capped.
    """
    if len(text) * 4 <= limit:  # the usual case: short output, nothing to measure
        return text, 0
    cap = OutputCap(limit)
    cap.feed(text.encode("utf-8", errors="replace"))
    return (cap.text(), cap.cut) if cap.cut else (text, 0)


def apply_rlimits(memory_mb: float | None = None, cpu_s: float | None = None, max_file_mb: float | None = None,
                  max_procs: int | None = None, oom_score_adj: int | None = 1000) -> None:
    """Lower this process's soft limits (run in a child between fork and exec).

    ``memory_mb`` caps the address space (``RLIMIT_AS``), ``cpu_s`` the CPU time (``RLIMIT_CPU``: SIGXCPU, then
    SIGKILL), ``max_file_mb`` the size of any file written (``RLIMIT_FSIZE``: writes past it fail with EFBIG), and
    ``max_procs`` the process count (``RLIMIT_NPROC``; the kernel ignores it for uid 0 of the host, see
    ``Sandbox.capabilities()``). ``oom_score_adj`` marks the child as the first thing to kill when the sandbox's memory
    cgroup is full, so the action server survives a memory bomb.
    """
    def lower(kind: int, value: int) -> None:
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        if soft == resource.RLIM_INFINITY or value < soft:
            resource.setrlimit(kind, (value, hard))

    if memory_mb:
        lower(resource.RLIMIT_AS, int(memory_mb * MB))
    if cpu_s:
        lower(resource.RLIMIT_CPU, max(1, int(-(-cpu_s // 1))))
    if max_file_mb:
        lower(resource.RLIMIT_FSIZE, int(max_file_mb * MB))
    if max_procs:
        lower(resource.RLIMIT_NPROC, int(max_procs))
    if oom_score_adj is not None:
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(oom_score_adj))
        except OSError:  # no /proc, or not allowed: the cgroup still bounds the sandbox as a whole
            pass
