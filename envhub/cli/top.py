"""``envhub top URL...``: a live view of rollout services and gateways, in the style of htop (docs/metrics.md).

On a terminal the screen is redrawn every ``--interval`` seconds with plain ANSI codes (cursor home, clear to the end:
no curses, works over SSH); with ``--once``, or when stdout is not a terminal (a pipe, a log, a test), one plain-text
screen is printed and the command exits. ``--record RUN`` also appends each poll to ``RUN/throughput.jsonl`` (what
``envhub show RUN --plot`` draws); recording with stdout not a terminal (``nohup envhub top URL --record RUN &``)
keeps polling and prints one log line per poll instead of a screen. Ctrl-C leaves cleanly (status 0: quitting is
how a live view ends).
"""
from __future__ import annotations

import shutil
import sys
import time

import click


@click.command("top")
@click.argument("urls", nargs=-1, required=True)
@click.option("--interval", "-n", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between polls.")
@click.option("--once", is_flag=True, help="Print one screen of plain text and exit (also when stdout is not a "
                                           "terminal).")
@click.option("--token", default=None, envvar="ENVHUB_SERVICE_TOKEN", help="Bearer token of the servers.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds a replica may take to answer before it is shown as down.")
@click.option("--record", type=click.Path(file_okay=False), default=None,
              help="Run directory to append every poll to (throughput.jsonl).")
@click.option("--color/--no-color", default=None, help="ANSI colour (default: on a terminal only).")
def top_cmd(urls: tuple[str, ...], interval: float, once: bool, token: str | None, timeout: float,
            record: str | None, color: bool | None) -> None:
    """Live throughput of rollout services and gateways (URL...: each replica's base URL): production and
    consumption rates, trainer and generator idle, the bottleneck and why, queues, sandboxes, backends, stage
    latencies, staleness and outcomes, per replica and summed."""
    from envhub.cli.top_view import log_line, render
    from envhub.rollout.livepoll import Poller, Recorder

    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise click.BadParameter(f"{', '.join(bad)}: give each replica's base URL, e.g. http://HOST:PORT",
                                 param_hint="URL")
    tty = sys.stdout.isatty()
    # block characters only where the terminal can show them (an SSH session with LANG=C would print mojibake)
    unicode = "utf" in (getattr(sys.stdout, "encoding", None) or "").lower()
    live = tty and not once
    logging = bool(record) and not tty and not once  # a recorder in the background: a line per poll
    color = live if color is None else color
    poller = Poller(list(urls), token=token, timeout=timeout)
    recorder = Recorder(record, list(urls), interval_s=interval, token=token) if record else None
    if live:
        sys.stdout.write("\x1b[2J")  # once: later screens overwrite in place
    try:
        while True:
            began = time.monotonic()
            rows, tot = poller.poll()
            if recorder is not None:
                recorder.record(rows, tot)
            if logging:
                click.echo(log_line(tot))
                time.sleep(max(0.0, interval - (time.monotonic() - began)))
                continue
            size = shutil.get_terminal_size((120, 40))
            lines = render(rows, tot, width=size.columns if tty else 200, color=color,
                           interval=interval if live else None, unicode=unicode)
            if not live:
                click.echo("\n".join(lines))
                return
            # home, each line followed by clear-to-end-of-line, then clear the rest: no flicker, no curses. No more
            # lines than the terminal has rows: one more would scroll, and the next redraw would start mid-screen
            lines = lines[:max(1, size.lines - 1)]
            sys.stdout.write("\x1b[H" + "".join(line + "\x1b[K\n" for line in lines) + "\x1b[J")
            sys.stdout.flush()
            time.sleep(max(0.0, interval - (time.monotonic() - began)))
    except KeyboardInterrupt:
        if live:
            sys.stdout.write("\n")
        return
    finally:
        poller.close()
        if recorder is not None:
            recorder.poller.close()
