"""Rates and idle ratios over time, from a run directory's ``throughput.jsonl`` (:mod:`envhub.rollout.livepoll`):
``envhub show RUN --plot`` draws them in the terminal (plain characters, readable over SSH), ``--plot-file
out.svg`` writes an SVG (hand-written: no plotting library is a dependency of envhub). Pure: series in, text out.

Panels share the time axis (seconds since the first snapshot): **rates** (production, effective production,
consumption; samples/s), **idle ratios** (trainer, generator; 0-100 %) and, where a concurrency controller ran,
**concurrency** (its limit and the rollouts in flight). The figures are the whole's (the TOTAL row of ``envhub
top``).
"""
from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

RATES = (("production_rate", "production", "p", "#1f77b4"),
         ("effective_production_rate", "effective production", "e", "#2ca02c"),
         ("consumption_rate", "consumption", "c", "#d62728"))
IDLES = (("trainer_idle_ratio", "trainer idle", "t", "#9467bd"),
         ("generator_idle_ratio", "generator idle", "g", "#ff7f0e"))
# a third panel where a concurrency controller ran (``envhub serve --controller aimd``): its limit, what was in flight
CONCURRENCY = (("controller_limit", "controller limit", "l", "#17becf"),
               ("in_flight", "rollouts in flight", "f", "#7f7f7f"))


def series(lines: list[dict[str, Any]]) -> dict[str, list[tuple[float, float | None]]]:
    """``{figure: [(seconds since the first line, value or None)]}`` for every figure plotted."""
    if not lines:
        return {}
    t0 = lines[0]["t"]
    out: dict[str, list[tuple[float, float | None]]] = {}
    for key, *_ in (*RATES, *IDLES, *CONCURRENCY):
        pts = []
        for d in lines:
            v = d["total"].get(key)
            pts.append((float(d["t"]) - t0, float(v) if isinstance(v, (int, float)) and v == v else None))
        out[key] = pts
    return out


def panels(s: dict[str, list[tuple[float, float | None]]]) -> list[tuple[str, str, tuple, float | None, str]]:
    """``(title, id, figures, fixed scale, unit)`` of each panel drawn: rates, idle ratios, and concurrency where a
    controller reported a limit."""
    out: list[tuple[str, str, tuple, float | None, str]] = [("rates (samples/s)", "rates", RATES, None, "/s"),
                                                           ("idle ratios", "idle", IDLES, 1.0, "")]
    if any(v is not None for _, v in s.get("controller_limit", [])):
        out.append(("concurrency (rollouts)", "concurrency", CONCURRENCY, None, ""))
    return out


def _top(values: list[float]) -> float:
    """A round upper bound for an axis (1, 2, 5 x 10^k)."""
    hi = max(values, default=0.0)
    if hi <= 0:
        return 1.0
    k = 1.0
    while k * 10 < hi:
        k *= 10
    while k > hi * 10:
        k /= 10
    for m in (1, 2, 5, 10):
        if m * k >= hi:
            return m * k
    return 10 * k


# ---- the terminal -------------------------------------------------------------------------------------------------
def text_chart(lines: list[dict[str, Any]], *, width: int = 72, height: int = 11) -> list[str]:
    """Every panel as lines of plain text; each figure a letter (``*`` where two meet), a legend with the last snapshot's
    value (``-``: unknown then) and the mean over the snapshots that had one, under each panel."""
    s = series(lines)
    if not s:
        return ["no throughput series in this run (throughput.jsonl: written by `envhub top --record RUN` or a "
                "Recorder attached to the run)"]
    real = max(t for t, _ in s["production_rate"])
    span = real or 1.0
    out = [f"{len(lines)} snapshots over {real:.0f}s"]
    for title, _, figs, scale, unit in panels(s):
        vals = [v for key, *_ in figs for _, v in s[key] if v is not None]
        top = scale or _top(vals)
        grid = [[" "] * width for _ in range(height)]
        for key, _, mark, _ in figs:
            for t, v in s[key]:
                if v is None:
                    continue
                x = min(width - 1, int(t / span * (width - 1)))
                y = height - 1 - min(height - 1, int(round(v / top * (height - 1))))
                grid[y][x] = mark if grid[y][x] in (" ", mark) else "*"
        out.append(title)
        for i, row in enumerate(grid):
            label = top * (height - 1 - i) / (height - 1)
            tick = (f"{100 * label:.0f}%" if scale else f"{label:.3g}") if i in (0, height // 2, height - 1) else ""
            out.append(f"{tick:>7} |" + "".join(row))
        out.append(" " * 8 + "+" + "-" * width)
        out.append(" " * 8 + f"0s{'':{max(0, width - 8)}}{span:.0f}s")
        for key, name, mark, _ in figs:
            got = [v for _, v in s[key] if v is not None]
            end = s[key][-1][1]
            last = _fmt(end, scale, unit) if end is not None else "-"
            mean = _fmt(sum(got) / len(got), scale, unit) if got else "-"
            out.append(f"   {mark} {name:<22} last {last:>8}  mean {mean:>8}")
    return out


def _fmt(v: float, ratio: float | None, unit: str) -> str:
    return f"{100 * v:.0f}%" if ratio else f"{v:.3g}{unit}"


# ---- SVG ----------------------------------------------------------------------------------------------------------
def svg(lines: list[dict[str, Any]], *, title: str = "envhub throughput", width: int = 900,
        panel: int = 220) -> str:
    """An SVG document: a panel per :func:`panels`, one ``<polyline data-series=figure>`` per figure (a gap where it
    was unknown splits it into several), axes with ticks, a legend."""
    s = series(lines)
    drawn = panels(s)
    left, right, top_pad, gap = 70, 190, 40, 50
    plot_w = width - left - right
    height = top_pad + len(drawn) * (panel + gap) + 40 - gap
    span = max((t for t, _ in s.get("production_rate", [])), default=0.0) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f"<title>{escape(title)}</title>", f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>']
    for n, (name, pid, figs, scale, _) in enumerate(drawn):
        y0 = top_pad + n * (panel + gap)
        vals = [v for key, *_ in figs for _, v in s.get(key, []) if v is not None]
        ymax = scale or _top(vals)
        parts.append(f'<g class="panel" data-panel="{pid}">')
        parts.append(f'<rect x="{left}" y="{y0}" width="{plot_w}" height="{panel}" fill="none" stroke="#999"/>')
        parts.append(f'<text x="{left}" y="{y0 - 6}" font-weight="bold">{escape(name)}</text>')
        for i in range(5):
            frac = i / 4
            y = y0 + panel - frac * panel
            label = f"{100 * frac * ymax:.0f}%" if scale else f"{frac * ymax:.3g}"
            parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        for i in range(6):
            x = left + plot_w * i / 5
            parts.append(f'<text x="{x:.1f}" y="{y0 + panel + 16}" text-anchor="middle">{span * i / 5:.0f}s</text>')
        for k, (key, label, _, colour) in enumerate(figs):
            runs: list[list[str]] = [[]]
            for t, v in s.get(key, []):
                if v is None:
                    runs.append([])
                    continue
                x = left + plot_w * t / span
                y = y0 + panel - min(v / ymax, 1.0) * panel
                runs[-1].append(f"{x:.1f},{y:.1f}")
            # effective production is production wherever all is accepted: dashed, so the line under it shows
            dash = ' stroke-dasharray="6,4"' if key == "effective_production_rate" else ""
            for pts in runs:
                if pts:
                    parts.append(f'<polyline data-series="{key}" fill="none" stroke="{colour}" stroke-width="2"{dash} '
                                 f'points="{" ".join(pts)}"/>')
            ly = y0 + 14 + 18 * k
            parts.append(f'<line x1="{left + plot_w + 12}" x2="{left + plot_w + 32}" y1="{ly - 4}" y2="{ly - 4}" '
                         f'stroke="{colour}" stroke-width="3"/>')
            parts.append(f'<text x="{left + plot_w + 38}" y="{ly}">{escape(label)}</text>')
        parts.append("</g>")
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">seconds since the first '
                 f"snapshot ({len(lines)} snapshots)</text>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
