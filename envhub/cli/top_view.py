"""What ``envhub top`` draws: rows of figures (:mod:`envhub.rollout.live`) in, lines of text out. Pure (no I/O, no
clock), so a test renders exactly what a person sees.

Plain text with optional ANSI colour (SGR codes only: any terminal, any SSH session, no curses); every line is cut to
``width`` columns, colour codes not counted. The screen, top to bottom: a header; one line per replica and a TOTAL
line (rates, idle ratios, verdict, queue, sandboxes); the whole's verdict with its figures; per-backend tokens/s and
queue; stage latency quantiles; staleness and outcomes; gateways. A replica that did not answer is one line saying
so, with the error.
"""
from __future__ import annotations

import re
import time
from typing import Any

BOLD, DIM, RED, GREEN, YELLOW, CYAN, RESET = "\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m", \
    "\x1b[0m"
_SGR = re.compile(r"\x1b\[[0-9;]*m")
# the verdict last: a backend's name (``backend:<name>``) may be long, and nothing after it gets pushed off the screen
COLS = (("replica", 20), ("prod/s", 7), ("eff/s", 7), ("cons/s", 7), ("accept", 6), ("trn idle", 11),
        ("gen idle", 11), ("queue", 5), ("sandboxes", 9), ("lat", 6), ("bound", 24))


def num(x: Any, unit: str = "") -> str:
    """A figure in at most ~5 characters: ``-`` when unknown."""
    if x is None or isinstance(x, bool):
        return "-"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e6):
        return f"{int(x)}{unit}" if abs(x) < 100000 else f"{x / 1000:.0f}k{unit}"
    x = float(x)
    if x != x:  # NaN
        return "-"
    if abs(x) >= 1000:
        return f"{x / 1000:.1f}k{unit}"
    if abs(x) >= 100:
        return f"{x:.0f}{unit}"
    if abs(x) >= 10:
        return f"{x:.1f}{unit}"
    if abs(x) >= 0.01 or x == 0:
        return f"{x:.2f}{unit}"
    return f"{x:.1g}{unit}"


def secs(x: Any) -> str:
    """A duration: ``1.23s``, ``45ms``, ``0.06ms``; ``-`` when unknown."""
    if x is None or isinstance(x, bool) or x != x:
        return "-"
    x = float(x)
    if x >= 100:
        return f"{x:.0f}s"
    if x >= 1:
        return f"{x:.2f}s"
    if x >= 0.01:
        return f"{1000 * x:.0f}ms"
    return f"{1000 * x:.2f}ms"


def pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.0f}%"


def bar(x: Any, width: int = 6, marks: str = "█░") -> str:
    """``████░░`` for a ratio in [0, 1] (blank when unknown); ``marks="#."`` where the terminal is not UTF-8."""
    if x is None:
        return " " * width
    full = max(0, min(width, round(float(x) * width)))
    return marks[0] * full + marks[1] * (width - full)


def visible_len(s: str) -> int:
    return len(_SGR.sub("", s))


def cut(s: str, width: int) -> str:
    """``s`` cut to ``width`` visible columns, colour codes kept whole (and reset if the cut dropped the reset)."""
    if visible_len(s) <= width:
        return s
    out, n, i = [], 0, 0
    while i < len(s) and n < width:
        m = _SGR.match(s, i)
        if m:
            out.append(m.group())
            i = m.end()
            continue
        out.append(s[i])
        n += 1
        i += 1
    text = "".join(out)
    return text + RESET if "\x1b[" in text else text


class Paint:
    def __init__(self, color: bool, marks: str = "█░"):
        self.color, self.marks = color, marks

    def __call__(self, text: str, *codes: str) -> str:
        return "".join(codes) + text + RESET if self.color and codes else text

    def idle(self, x: Any) -> str:
        """An idle ratio: red above a quarter (that side waits: bottleneck.IDLE), yellow above a tenth."""
        cell = f"{bar(x, marks=self.marks)} {pct(x):>4}"
        if x is None:
            return cell
        return self(cell, RED if x > 0.25 else YELLOW if x > 0.10 else GREEN)

    def verdict(self, b: dict[str, Any] | None) -> str:
        name = (b or {}).get("bound") or "-"
        return self(name, BOLD, CYAN if name in ("balanced", "unknown", "-") else YELLOW)


def _pad(cell: str, width: int, right: bool = False) -> str:
    gap = max(0, width - visible_len(cell))
    return (" " * gap + cell) if right else (cell + " " * gap)


def _short(url: str, width: int) -> str:
    u = re.sub(r"^https?://", "", url)
    return u if len(u) <= width else "…" + u[-(width - 1):]


def _row(cells: list[str]) -> str:
    """Cells under :data:`COLS`: the replica's name and the verdict left-aligned, figures right-aligned."""
    left = {"replica", "trn idle", "gen idle", "bound"}
    return " ".join(_pad(c, w, right=n not in left) for c, (n, w) in zip(cells, COLS)).rstrip()


def replica_line(r: dict[str, Any], p: Paint) -> str:
    width = COLS[0][1]
    url = _short(r["url"], width)
    name = _pad(p(url, BOLD) if r["kind"] == "total" else url, width)
    if r["kind"] == "down":
        return name + " " + p(f"DOWN  {r.get('error')}", RED, BOLD)
    if r["kind"] == "gateway":
        return name + " " + p("gateway", DIM) + f"  calls {r.get('calls', 0)} ({num(r.get('calls_per_s'))}/s)  " \
            f"errors {r.get('errors', 0)}  sessions {r.get('sessions', 0)}  capacity {r.get('capacity', 0)}"
    if "production_rate" not in r:
        return name + " " + p(str(r.get("error") or "no figures"), YELLOW)
    sb = r.get("sandboxes") or {}
    return _row([name, num(r.get("production_rate")), num(r.get("effective_production_rate")),
                 num(r.get("consumption_rate")), pct(r.get("acceptance")), p.idle(r.get("trainer_idle_ratio")),
                 p.idle(r.get("generator_idle_ratio")), str(sum((r.get("queue") or {}).values())),
                 f"{num(sb.get('live'))}/{num(sb.get('limit'))}", secs(r.get("rollout_latency_s")),
                 p.verdict(r.get("bound"))])


def header(rows: list[dict[str, Any]], tot: dict[str, Any], p: Paint, interval: float | None) -> list[str]:
    when = time.strftime("%H:%M:%S UTC", time.gmtime(tot["t"])) if tot.get("t") else "-"
    down = f", {p(str(tot['down']) + ' down', RED, BOLD)}" if tot.get("down") else ""
    every = f", every {interval:g}s (Ctrl-C quits)" if interval else ""
    windows = sorted({float(r["window_s"]) for r in rows if r.get("window_s") is not None})
    win = f", rates over the last {secs(windows[-1])}" if windows and windows[-1] > 0 else ""
    return [p("envhub top", BOLD) + f": {tot['replicas']} replica(s){down}{win}, {when}{every}",
            p(_row([n for n, _ in COLS]), DIM)]


def render(rows: list[dict[str, Any]], tot: dict[str, Any], *, width: int = 120, color: bool = False,
           interval: float | None = None, unicode: bool = True) -> list[str]:
    """The screen for ``rows`` (one per replica) and ``tot`` (:func:`envhub.rollout.live.total`)."""
    p = Paint(color, "█░" if unicode else "#.")
    lines = header(rows, tot, p, interval)
    lines += [replica_line(r, p) for r in rows]
    services = [r for r in rows if r["kind"] == "service" and "production_rate" in r]
    if len(rows) > 1:
        lines.append(replica_line(tot, p))
    b = tot.get("bound") or {}
    lines += ["", p("bound", BOLD) + f": {p.verdict(b)} (side {b.get('side')}, capacity ratio trainer/generator "
                                     f"{num(b.get('ratio'))})"]
    lines += wrap(str(b.get("why")), width, "  ")
    for r in services if len(services) > 1 else []:
        rb = r.get("bound") or {}
        lines += wrap(f"{_short(r['url'], 40)}: {rb.get('bound')}: {rb.get('why')}", width, "  ")
    if services:
        sb = tot["sandboxes"]
        lines.append(f"{p('capacity', BOLD)}: trainer {num(tot.get('trainer_capacity'))}/s, generator "
                     f"{num(tot.get('generator_capacity'))}/s ({num(tot.get('peak_concurrency'))} slots at peak, "
                     f"{num(tot.get('in_flight'))} in flight); trainer steps {tot.get('steps')}")
        lines.append(f"{p('sandboxes', BOLD)}: live {num(sb.get('live'))} of {num(sb.get('limit'))}, waiting for a "
                     f"slot {num(sb.get('waiting'))} ({pct(sb.get('waiting_ratio'))} of the window), init failures "
                     f"{_pairs(sb.get('failures')) or 0}")
        lines.append(f"{p('queue', BOLD)}: " + (_pairs(tot.get("queue")) or "-"))
        lines += controllers(services, p, width)
        lines += backends(services, tot, p)
        lines += stages(tot, p)
        st, oc = tot.get("staleness") or {}, tot.get("outcomes") or {}
        lags = [f"per {u} mean {num(q.get('mean'))} p90 {num(q.get('p90'))} max {num(q.get('max'))}"
                for u, q in sorted(st.items()) if q.get("count")]
        if tot.get("partial"):
            lags.append(f"partial rollouts {num(tot.get('partial'))}")
        lines.append(f"{p('staleness', BOLD)} (versions behind at hand-over): " + ("; ".join(lags) or "-"))
        lines.append(f"{p('outcomes', BOLD)}: {_pairs(oc) or '-'}; discarded by the trainer "
                     f"{pct(tot.get('discard_share'))}, wasted {num(tot.get('wasted_s'))} in-stage seconds")
    gws = [r for r in rows if r["kind"] == "gateway"]
    if gws:
        lines.append(f"{p('gateways', BOLD)}: calls {num(tot.get('gw_calls'))} ({num(tot.get('gw_calls_per_s'))}/s), "
                     f"errors {num(tot.get('gw_errors'))}, sessions {num(tot.get('gw_sessions'))}, spliced "
                     f"{num(tot.get('gw_spliced'))}, new chains {num(tot.get('gw_new_chains'))}")
    return [cut(line, width) for line in lines]


def log_line(tot: dict[str, Any]) -> str:
    """One line per poll for a log (``envhub top --record RUN`` with stdout not a terminal)."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(tot["t"])) if tot.get("t") else "-"
    b = tot.get("bound") or {}
    return (f"{when} up {tot['replicas'] - tot['down']}/{tot['replicas']} prod {num(tot.get('production_rate'))}/s "
            f"cons {num(tot.get('consumption_rate'))}/s accept {pct(tot.get('acceptance'))} trainer idle "
            f"{pct(tot.get('trainer_idle_ratio'))} generator idle {pct(tot.get('generator_idle_ratio'))} queue "
            f"{sum((tot.get('queue') or {}).values())} bound {b.get('bound')}")


def wrap(text: str, width: int, indent: str) -> list[str]:
    """Long prose (a verdict's reason) wrapped to ``width``, never cut: it is what says why."""
    import textwrap

    return textwrap.wrap(text, max(20, width), initial_indent=indent, subsequent_indent=indent + "  ") or [indent]


def controllers(services: list[dict[str, Any]], p: Paint, width: int) -> list[str]:
    """One line per replica whose concurrency controller is on (``envhub serve --controller aimd``)."""
    out = []
    for r in services:
        c = r.get("controller")
        if not c:
            continue
        last = c.get("last") or {}
        where = f" {_short(r['url'], 30)}" if len(services) > 1 else ""
        text = (f"limit {c.get('limit')} ({c.get('in_flight')} in flight, ceiling {c.get('ceiling')} by "
                f"{c.get('ceiling_by')}, {c.get('phase')}), oversampling {num(c.get('oversampling'))}")
        if last:
            text += f"; last: {last.get('action')} {last.get('old')} -> {last.get('new')}: {last.get('reason')}"
        head = p("controller", BOLD) + where + ": "
        wrapped = wrap(text, width - visible_len(head), "")  # the reason is what says why: wrapped, never cut
        out += [head + wrapped[0], *wrapped[1:]]
    return out


def _pairs(d: Any) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items()))


def backends(services: list[dict[str, Any]], tot: dict[str, Any], p: Paint) -> list[str]:
    if not tot.get("backends"):
        return []
    out = [p("backends", BOLD) + ":" + " " * 17 + f"{'tok/s':>9} {'in flight':>9} {'waiting':>8} {'calls':>7}"]
    for name, b in sorted(tot["backends"].items()):
        out.append(f"  {_pad(name[-24:], 24)}{num(b.get('tokens_per_s')):>9} {num(b.get('in_flight')):>9} "
                   f"{num(b.get('waiting')):>8} {num(b.get('calls')):>7}")
    return out


def stages(tot: dict[str, Any], p: Paint) -> list[str]:
    st = {k: v for k, v in (tot.get("stages") or {}).items() if v.get("count")}
    if not st:
        return []
    # quantiles cannot be merged from summaries: over several replicas they are the worst one's, the mean is exact
    note = " (quantiles: the worst replica's)" if (tot.get("services") or 0) > 1 else ""
    out = [p("stage latency", BOLD) + ":" + " " * 12 + f"{'count':>7} {'mean':>7} {'p50':>7} {'p90':>7} {'p99':>7}{note}"]
    for name, q in st.items():
        out.append(f"  {name:<24}{q['count']:>7} " + " ".join(f"{secs(q.get(k)):>7}" for k in ("mean", "p50", "p90",
                                                                                                  "p99")))
    return out
