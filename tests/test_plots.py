"""The benchmark pictures (benchmarks/plots/): every one is redrawn from the JSON saved in
benchmarks/results/ and has a title, labelled axes with units, a legend and a caption that
names its data; the timeline draws from a run's StepStats events. matplotlib (Agg) only."""
import json
import struct
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from benchmarks.plots import save  # noqa: E402
from benchmarks.plots.__main__ import RESULTS, figures, redraw  # noqa: E402
from benchmarks.plots.timeline import timeline_figure, trace_from_events  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
UNITS = ("(s", "seconds", "MiB", "(ms)", "millions", "loss units", "nats", "bytes", "(%)")


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.texts] + [fig._supxlabel.get_text()
                                                if fig._supxlabel else ""]


def check_figure(name: str, fig) -> None:
    suptitle = fig._suptitle.get_text() if fig._suptitle else ""
    axes = [ax for ax in fig.axes if ax.has_data()]
    assert axes, name
    for ax in axes:
        assert suptitle or ax.get_title(), (name, "no title")
        assert ax.get_xlabel() and ax.get_ylabel(), (name, "unlabelled axis", ax.get_title())
        assert any(u in ax.get_ylabel() + ax.get_xlabel() for u in UNITS), (
            name, "no unit", ax.get_xlabel(), ax.get_ylabel())
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends and all(t.get_text() for lg in legends for t in lg.get_texts()), (
        name, "no legend")
    caption = " ".join(" ".join(_texts(fig)).split())
    assert "Data: " in caption and "machine" in caption.lower(), (name, caption)


def test_every_saved_result_is_drawn_with_title_axes_units_legend_caption(tmp_path):
    drawn = []
    for name, fig in figures(RESULTS):
        check_figure(name, fig)
        drawn.append(name)
        if name == "peers_small.png":  # the README's picture
            save(fig, tmp_path / name)
            head = (tmp_path / name).read_bytes()[:24]
            assert head[:8] == b"\x89PNG\r\n\x1a\n"
            width, height = struct.unpack(">II", head[16:24])
            assert width > 600 and height > 600
        else:
            import matplotlib.pyplot as plt

            plt.close(fig)
    expected = {p.stem + ".png" for p in RESULTS.glob("peers*.json")}
    expected |= {p.stem + ".png" for p in RESULTS.glob("timeline*.json")}
    expected |= {p.stem + ".png" for p in RESULTS.glob("sparse_grads*.json")}
    expected |= {p.stem + ".png" for p in RESULTS.glob("bf16_masters*.json")}
    expected |= {p.stem + ".png" for p in RESULTS.glob("sparse_adam_study*.json")}
    expected |= {"offload_capacity.png", "bf16_study.png"}
    assert set(drawn) == expected
    assert {"peers_small.png", "timeline_prefetch_on.png"} <= expected


def test_peers_figure_has_a_bar_per_engine_and_cell():
    from benchmarks.plots.peers import cells, peers_figure

    report = json.loads((RESULTS / "peers_small.json").read_text())
    fig = peers_figure(report, source="peers_small.json")
    top = fig.axes[0]
    engines = {r["engine"] for r in report["results"] if r["status"] == "ok"}
    assert len(top.patches) == len(engines) * len(cells(report))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["zerolite ZeRO-3", "DeepSpeed ZeRO-3", "PyTorch FSDP2", "PyTorch DDP"]
    zl = next(r for r in report["results"] if r["engine"] == "zerolite3")
    assert top.patches[0].get_height() == pytest.approx(zl["median_step_s"])


def test_timeline_from_stepstats_events_in_ms(tmp_path):
    events = [("compute", "forward blocks.0", 10.000, 10.050),
              ("all_gather", "all_gather blocks.1", 10.010, 10.030),
              ("wait", "wait blocks.1", 10.050, 10.052),
              ("reduce", "reduce_scatter blocks.0", 10.100, 10.120),
              ("compute", "backward blocks.0", 10.060, 10.100)]
    trace = trace_from_events(events, 0, {"size": "tiny", "world": 2, "prefetch": "on"})
    assert [e["tid"] for e in trace["traceEvents"]] == [
        "compute", "all_gather", "wait", "reduce", "compute"]
    fig = timeline_figure(json.loads(json.dumps(trace)), source="t.json")
    check_figure("timeline", fig)
    ax = fig.axes[0]
    assert ax.get_xlabel().endswith("(ms)")
    spans = sorted((c.get_paths()[0].get_extents().x0, c.get_paths()[0].get_extents().x1)
                   for c in ax.collections)
    assert spans[0] == pytest.approx((0.0, 50.0), abs=1e-6)  # ms from the first event
    assert spans[-1] == pytest.approx((100.0, 120.0), abs=1e-6)
    save(fig, tmp_path / "t.png")


def test_redraw_writes_every_png(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for name in ("peers_small.json", "bf16_study.json", "offload_capacity.json"):
        (results / name).write_bytes((RESULTS / name).read_bytes())
    written = redraw(results, tmp_path / "out")
    assert sorted(p.name for p in written) == [
        "bf16_study.png", "offload_capacity.png", "peers_small.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written)


def test_no_hand_written_image_encoder_remains():
    hits = [p for d in ("benchmarks", "zerolite", "triton_kernels") for p in (REPO / d).rglob("*.py")
            if b"IHDR" in p.read_bytes()]
    assert not hits, hits
