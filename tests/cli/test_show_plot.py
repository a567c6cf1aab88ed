"""The throughput figures over time in a run directory (issue #26 point 2): a ``Recorder`` attached to a real service
under load writes ``throughput.jsonl``, ``envhub rollout --out`` writes its own, and ``envhub show RUN --plot`` /
``--plot-file out.svg`` draw them (the SVG parses as XML and holds each series, point for point). An unknown figure
is a gap in its line, never a zero: drawing it as zero is shown to fail the check."""
from __future__ import annotations

import asyncio
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from envhub.cli import main, plot
from envhub.rollout.live import total
from envhub.rollout.livepoll import SERIES, Recorder, read_series

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "service"))
import svc_plugins  # noqa: E402

pytestmark = pytest.mark.timeout(120)
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def service(tiny_tokenizer):
    from envhub.service import RolloutService, ServerThread

    svc_plugins.register_all()
    srv = ServerThread(RolloutService(tiny_tokenizer, backends=["golden"], metrics_window_s=30),
                       host="127.0.0.1").start()
    yield srv
    srv.stop()


async def trainer_and_generator(url: str, seconds: float) -> None:
    """4 workers sending short rollouts and a trainer taking 2 samples per step, for ``seconds``."""
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        async def worker(i: int) -> None:
            n = 0
            while time.monotonic() < end:
                r = await c.post("/process", json={"instance": {"env_id": "svc-slow", "task": {
                    "task_id": f"w{i}-{n}", "n": n, "run_s": 0.05}}})
                assert r.status_code == 200
                n += 1

        async def trainer() -> None:
            while time.monotonic() < end:
                (await c.post("/trainer/step", json={"phase": "begin"})).raise_for_status()
                await asyncio.sleep(0.05)
                (await c.post("/trainer/step", json={"phase": "end", "samples": 2})).raise_for_status()
                await asyncio.sleep(0.05)

        await asyncio.gather(trainer(), *(worker(i) for i in range(4)))


def points(doc: ET.Element, key: str) -> list[tuple[float, float]]:
    out = []
    for line in doc.iter(SVG + "polyline"):
        if line.get("data-series") == key:
            out += [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
    return out


def test_a_recorder_writes_the_series_and_show_plots_it(service, tmp_path):
    run = tmp_path / "run"
    with Recorder(run, [service.url], interval_s=0.25) as rec:
        asyncio.run(trainer_and_generator(service.url, 2.0))
        time.sleep(0.3)
    lines = read_series(run)
    assert len(lines) == rec.lines >= 4
    assert [r["url"] for r in lines[-1]["replicas"]] == [service.url]
    for d in lines:  # each line's TOTAL is the whole of its own replicas
        assert d["total"]["production_rate"] == total(d["replicas"])["production_rate"]
    last = lines[-1]["total"]
    assert last["production_rate"] > 0 and last["consumption_rate"] > 0 and last["steps"] >= 2
    assert [d["t"] for d in lines] == sorted(d["t"] for d in lines)
    # figures are rounded to 4 digits on disk, times never (a Unix time to 4 digits is a 15-day bin)
    assert all(abs(d["replicas"][0]["t"] - d["t"]) < 5 for d in lines)

    r = CliRunner().invoke(main, ["show", str(run), "--plot", "--plot-file", str(tmp_path / "out.svg")])
    assert r.exit_code == 0, r.output
    assert "rates (samples/s)" in r.output and "idle ratios" in r.output
    assert "p production" in r.output and "g generator idle" in r.output
    assert f"{len(lines)} snapshots" in r.output and "wrote" in r.output
    doc = ET.parse(tmp_path / "out.svg").getroot()
    assert doc.tag == SVG + "svg"
    for key, *_ in (*plot.RATES, *plot.IDLES):
        known = [d for d in lines if d["total"].get(key) is not None]
        assert len(points(doc, key)) == len(known), key
    assert len(points(doc, "production_rate")) >= 4
    texts = "".join(t.text or "" for t in doc.iter(SVG + "text"))
    assert "production" in texts and "trainer idle" in texts


def test_a_controllers_limit_gets_its_own_panel(tiny_tokenizer, tmp_path):
    from envhub.service import RolloutService, ServerThread
    from envhub.service.controller import Knobs

    svc_plugins.register_all()
    srv = ServerThread(RolloutService(tiny_tokenizer, backends=["golden"], metrics_window_s=30,
                                      controller=Knobs(start=2, interval_s=0.1)), host="127.0.0.1").start()
    try:
        with Recorder(tmp_path, [srv.url], interval_s=0.25):
            asyncio.run(trainer_and_generator(srv.url, 1.5))
    finally:
        srv.stop()
    lines = read_series(tmp_path)
    limits = [d["total"]["controller_limit"] for d in lines]
    assert all(isinstance(n, int) and n >= 1 for n in limits), limits
    doc = ET.fromstring(plot.svg(lines))
    assert [g.get("data-panel") for g in doc.iter(SVG + "g")] == ["rates", "idle", "concurrency"]
    assert len(points(doc, "controller_limit")) == len(lines)
    assert "concurrency (rollouts)" in "\n".join(plot.text_chart(lines))
    # without a controller there is no such panel
    plain = [{**d, "total": {**d["total"], "controller_limit": None}} for d in lines]
    assert [g.get("data-panel") for g in ET.fromstring(plot.svg(plain)).iter(SVG + "g")] == ["rates", "idle"]


def test_a_partial_last_line_is_skipped_and_a_run_without_series_is_one_clear_error(service, tmp_path):
    run = tmp_path / "run"
    rec = Recorder(run, [service.url], interval_s=1.0)
    rec.record()
    rec.record()
    rec.poller.close()
    with open(run / SERIES, "a") as f:
        f.write('{"t": 1, "replicas": [{"url"')  # a kill mid-write
    assert len(read_series(run)) == 2
    r = CliRunner().invoke(main, ["show", str(run), "--plot"])
    assert r.exit_code == 0 and "2 snapshots" in r.output, r.output

    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(main, ["show", str(empty), "--plot-file", str(tmp_path / "x.svg")])
    assert r.exit_code == 1 and "no throughput series" in r.output and "envhub top" in r.output
    assert not (tmp_path / "x.svg").exists()
    # the chart is SVG: a .png name would get an SVG that opens as a broken PNG, so it is refused before anything
    r = CliRunner().invoke(main, ["show", str(run), "--plot-file", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "ending in .svg" in r.output, r.output
    assert not (tmp_path / "x.png").exists()


def test_rollout_out_writes_its_own_series(tmp_path, tiny_tokenizer):
    """``envhub rollout --out``'s loop (the CLI hands its run directory to this ``Run``) writes the run's figures."""
    import envhub
    from envhub.backends.base import SamplingParams
    from envhub.backends.scripted import ScriptedBackend
    from envhub.cli.runner import Run
    from envhub.cli.runs import RunWriter, started_meta
    from envhub.rollout.request import RolloutConfig

    run = tmp_path / "run"
    spec = envhub.get_spec("countdown")
    writer = RunWriter(run, started_meta(env_id=spec.id)).open()
    config = RolloutConfig(max_length=4096, sampling=SamplingParams(max_tokens=64, seed=0))
    r = Run(spec, ScriptedBackend(spec.golden), tiny_tokenizer, n=6, samples=1, concurrency=2, config=config,
            writer=writer, show_progress=False)
    assert r.execute() == 0
    writer.close()
    lines = read_series(run)
    assert lines, "no throughput.jsonl in the run directory"
    last = lines[-1]["total"]  # written once the run ended: every rollout counted
    assert last["finished"] == 6 and sum(last["outcomes"].values()) == 6
    assert last["production_rate"] > 0 and last["peak_concurrency"] == 2
    assert last["consumption_rate"] is None  # no trainer: unknown, not zero
    assert last["stages"]["run"]["count"] == 6
    out = CliRunner().invoke(main, ["show", str(run), "--plot"])
    assert out.exit_code == 0 and "production" in out.output


def test_overwrite_starts_a_fresh_series(tmp_path):
    from envhub.cli.runs import RunWriter, started_meta

    run = tmp_path / "run"
    RunWriter(run, started_meta(env_id="x")).open().close()
    (run / SERIES).write_text(json.dumps({"t": 1, "replicas": [], "total": {"production_rate": 1.0}}) + "\n")
    RunWriter(run, started_meta(env_id="x"), overwrite=True).open().close()
    assert not (run / SERIES).exists()


# ---- an unknown figure is a gap, never a zero ---------------------------------------------------------------------
def synthetic(values: list[float | None]) -> list[dict]:
    return [{"t": 100.0 + i, "replicas": [], "total": {"production_rate": 1.0, "trainer_idle_ratio": v}}
            for i, v in enumerate(values)]


def gap_is_kept(lines: list[dict]) -> bool:
    """The trainer idle line has a point for each known value only, and is split where one is unknown."""
    doc = ET.fromstring(plot.svg(lines))
    runs = [ln for ln in doc.iter(SVG + "polyline") if ln.get("data-series") == "trainer_idle_ratio"]
    known = sum(d["total"]["trainer_idle_ratio"] is not None for d in lines)
    return len(points(doc, "trainer_idle_ratio")) == known and len(runs) == 2


def test_an_unknown_figure_is_a_gap_and_drawing_it_as_zero_is_caught(monkeypatch):
    lines = synthetic([0.5, 0.4, None, 0.3])
    assert gap_is_kept(lines)
    chart = "\n".join(plot.text_chart(lines, width=20))
    assert "last      30%" in chart
    real = plot.series

    def zero_filled(lines):  # the bug: an unknown figure drawn as 0 % (a trainer "never idle")
        return {k: [(t, 0.0 if v is None else v) for t, v in pts] for k, pts in real(lines).items()}

    monkeypatch.setattr(plot, "series", zero_filled)
    assert not gap_is_kept(lines)
