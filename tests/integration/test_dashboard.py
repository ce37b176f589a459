"""`kvbench dashboard`: pages build from the committed results, from sample records of the real shapes and
from an empty folder; one colour per dtype everywhere; units on every axis; hovers name the run; data text
is escaped; the site is swapped in whole."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from support import committed_results, kvbench

from kvbench.dashboards import data as site_data
from kvbench.dashboards import derive, site, theme
from kvbench.dashboards.theme import esc
from kvbench.records import workload_label

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("dashboard_sample", Path(__file__).parents[1] / "dashboard_sample.py")
sample = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sample)

PAGE_SLUGS = ["index", "history", "gpus", "capacity", "latency", "tradeoff", "quality", "atlas", "claims", "kernels"]
CATEGORICAL_AXES = {"KV-cache dtype", "machine", "claim"}


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory):
    root = sample.write_results(tmp_path_factory.mktemp("results"))
    loaded = site_data.load(root)
    loaded.history = sample.history_frame()
    loaded.history["when"] = loaded.history["run_started"]
    loaded.regressions = sample.regressions_frame(loaded.history)
    return loaded


@pytest.fixture(scope="module")
def sample_pages(sample_data):
    return {p.slug: p for p in site.build_pages(sample_data)}


@pytest.fixture(scope="module")
def sample_site(sample_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "site"
    site.write_site(sample_data, out)
    return out


def all_figures(pages):
    for page in pages.values():
        for div_id, fig in page.figures:
            yield page.slug, div_id, fig


# --- building -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def committed():
    """The committed results, loaded, and their pages (built once for the tests that read them)."""
    loaded = site_data.load(committed_results(), asv_conf=REPO / "asv.conf.json")
    return loaded, {p.slug: p for p in site.build_pages(loaded)}


def test_builds_from_committed_results(tmp_path, committed):
    loaded, pages = committed
    written = site.write_site(loaded, tmp_path / "site")
    assert [p.stem for p in written] == PAGE_SLUGS
    assert (tmp_path / "site" / site.PLOTLY_JS).stat().st_size > 1_000_000  # plotly.js bundled once
    assert len(list((tmp_path / "site").rglob("plotly*.js"))) == 1
    for page in written:
        html = page.read_text()
        assert '<script src="assets/plotly.min.js"></script>' in html
        assert not re.search(r'<script[^>]+src="(https?:)?//', html), f"{page.name} fetches a script from the network"
    assert loaded.problems == []
    if not loaded.accuracy.empty:  # the committed accuracy record is plotted
        assert any(d.startswith("accuracy-") for d, _ in pages["kernels"].figures)
    if not loaded.history.empty:  # the committed history: the glance figure plus one chart per measured metric
        measured = loaded.history.dropna(subset=["value"])["metric"].nunique()
        assert len(pages["history"].figures) == loaded.history["machine"].nunique() + measured
    if loaded.records:
        for slug in ("index", "gpus", "capacity", "latency"):
            assert pages[slug].figures, slug


def test_the_overview_leads_with_a_real_model(committed):
    # issue 46: a reader choosing a KV dtype sees a real pretrained model's verdict first, the tiny model after it
    # labelled synthetic; the committed results hold both (SmolLM2-135M and Gemma-3-270M beside the tiny model)
    loaded, pages = committed
    labels = re.findall(r"; model <code>[^<]*</code> \(<b>([^<]*)</b>\)", pages["index"].body)
    assert labels and labels[0].startswith("real: "), labels[:3]
    assert "synthetic" in labels and labels.index("synthetic") > max(
        i for i, label in enumerate(labels) if label.startswith("real: ")
    )


def test_workload_runs_are_named_by_their_workload_not_placeholder_lengths(committed):
    # The committed Intel records hold one run of each workload kind; a spec's lengths vary per request, so
    # the overview names the workload where a fixed run gives its lengths, and the capacity page titles say it.
    loaded, pages = committed
    overview = pages["index"].body
    assert "workload shared-prefix (prefix-cache)" in overview
    assert "workload trace (" in overview and "workload multi-turn (" in overview
    heads = re.findall(r"<p>[^<]*; model <code>.*?</p>", overview)
    spec_heads = [h for h in heads if "workload " in h]
    assert len(spec_heads) >= 5 and not any("prompt +" in h for h in spec_heads)  # no placeholder lengths
    assert any("384 prompt + 128 output tokens per request" in h for h in heads)  # the fixed CPU default
    newest = max((d for d in loaded.records if d["machine"] == "cpu-intel-xeon"), key=lambda d: d["created_at"])
    label = workload_label(newest["config"])
    assert not label.startswith("fixed") and f"run {newest['run_id']}, {esc(label)}</h2>" in pages["capacity"].body


def test_builds_from_empty_results_with_instructions(tmp_path):
    (tmp_path / "results").mkdir()
    loaded = site_data.load(tmp_path / "results")
    pages = {p.slug: p for p in site.build_pages(loaded)}
    assert all(not p.figures for slug, p in pages.items() if slug != "claims")  # claims come from shipped data
    site.write_site(loaded, tmp_path / "site")
    text = {slug: (tmp_path / "site" / f"{slug}.html").read_text() for slug in PAGE_SLUGS}
    for slug in ("index", "gpus", "capacity", "latency"):
        assert "kvbench run" in text[slug], slug
    assert "kvbench history run" in text["history"] and "kvbench history run" in text["index"]
    assert "kvbench kernels" in text["kernels"] and "kvbench accuracy" in text["kernels"]


def test_missing_results_folder_says_so(tmp_path):
    loaded = site_data.load(tmp_path / "nowhere")
    site.write_site(loaded, tmp_path / "site")
    assert "no results folder" in (tmp_path / "site" / "index.html").read_text()


def test_every_page_has_its_plots(sample_pages):
    counts = {slug: len(p.figures) for slug, p in sample_pages.items()}
    assert counts["index"] == 1 and counts["history"] == 3 and counts["claims"] == 1  # history: glance + one per metric
    assert counts["capacity"] == 4  # h100, h200, cpu, and the evil record's machine
    assert counts["latency"] == 5  # the same, plus latency vs request rate for h200's open-loop loads
    assert counts["gpus"] >= 2  # llama-3.1-8b on two GPUs; the tiny model on the CPU
    assert counts["kernels"] == 2  # one kernel record, one accuracy record
    assert counts["tradeoff"] == 2  # llama-3.1-8b's front on two GPUs (one setup), its cost (h100 was priced)
    assert counts["quality"] == 3  # llama-3.1-8b's pass-key accuracy on two GPUs, and each GPU's forest plot
    forests = [d for d, _ in sample_pages["quality"].figures if d.startswith("quality-forest-")]
    assert len(forests) == 2


def test_cli_writes_site(tmp_path):
    (tmp_path / "results").mkdir()
    out = kvbench("dashboard", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "site"), timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"wrote {len(PAGE_SLUGS)} pages" in out.stdout and (tmp_path / "site" / "index.html").is_file()


# --- made for people -----------------------------------------------------------------------------------------


def _trace_colors(trace) -> list[str]:
    out = []
    for part in ("marker", "line"):
        obj = getattr(trace, part, None)
        c = getattr(obj, "color", None) if obj is not None else None
        if isinstance(c, str):
            out.append(c)
    return out


def test_one_colour_per_dtype_on_every_page(sample_pages):
    palette = theme.colors()
    seen: dict[str, set[str]] = {}
    for _slug, _div, fig in all_figures(sample_pages):
        for trace in fig.data:
            group = trace.legendgroup
            if group in palette:
                for c in _trace_colors(trace):
                    seen.setdefault(group, set()).add(c)
            marker_colors = getattr(trace.marker, "color", None) if hasattr(trace, "marker") else None
            if (
                isinstance(marker_colors, (list, tuple)) and trace.x is not None
            ):  # bars coloured per dtype on the x axis
                for x, c in zip(trace.x, marker_colors, strict=False):
                    if x in palette:
                        seen.setdefault(x, set()).add(c)
    assert {"auto", "fp8", "nvfp4"} <= set(seen)
    for dtype, colors in seen.items():
        assert colors == {palette[dtype]}, (dtype, colors)


def test_palette_is_okabe_ito_and_markers_differ():
    okabe_ito = {"#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000", "#999999"}
    palette, symbols = theme.colors(), theme.symbols()
    assert set(palette.values()) <= okabe_ito
    assert len(set(palette.values())) == len(palette)
    assert len(set(symbols.values())) == len(symbols)


def test_every_axis_title_has_a_unit(sample_pages):
    checked = 0
    for slug, div, fig in all_figures(sample_pages):
        layout = fig.to_plotly_json()["layout"]
        for key, axis in layout.items():
            if not re.fullmatch(r"[xy]axis\d*", key):
                continue
            title = ((axis.get("title") or {}).get("text")) or ""
            if not title or title in CATEGORICAL_AXES or title.startswith("data source"):
                continue
            checked += 1
            assert re.search(r"\([^)]+\)\s*$", title), f"{slug}/{div} {key}: {title!r} has no unit"
    assert checked > 20


def test_hover_names_run_date_vllm_and_machine(sample_pages):
    checked = 0
    for slug, div, fig in all_figures(sample_pages):
        if slug == "claims":
            continue  # claims are derived from specs, not from a run (their hover says so)
        for trace in fig.data:
            if trace.hoverinfo == "skip":
                continue  # legend-only entries
            tpl = trace.hovertemplate or ""
            assert re.search(r"(run|record) %\{customdata\[0\]\}", tpl), (slug, div, trace.name, tpl)
            assert "vLLM %{customdata[2]}" in tpl and "machine %{customdata[3]}" in tpl, (slug, div, tpl)
            assert re.search(r"%\{customdata\[1\]\}", tpl)
            for row in trace.customdata:
                assert row[0] not in ("", "—") and re.match(r"\d{4}-\d{2}-\d{2}", row[1]), (slug, div, row)
            checked += 1
    assert checked > 20
    claims = next(fig for slug, div, fig in all_figures(sample_pages) if slug == "claims")
    assert all("derived from kvbench's specs (no run)" in t.hovertemplate for t in claims.data)


def test_hover_values_come_from_the_records(sample_pages, sample_data):
    latency = dict(sample_pages["latency"].figures)["latency-h100-sxm-80gb"]
    runs = sample_data.runs
    run_id = runs[runs["machine"] == "h100-sxm-80gb"]["run_id"].iloc[0]
    rows = [row for t in latency.data for row in t.customdata]
    assert {row[0] for row in rows} == {run_id}
    assert {row[2] for row in rows} == {"0.32.0"} and {row[3] for row in rows} == {"h100-sxm-80gb"}


def test_data_text_is_escaped(sample_site, sample_pages):
    for page in sample_site.glob("*.html"):
        html = page.read_text()
        assert sample.PAYLOAD not in html and sample.SCRIPT not in html, page.name
        assert "onerror=" not in html.replace("onerror=&quot;", "").replace('onerror=\\"', "") or "&lt;img" in html
    assert "&lt;script&gt;window.__kvbench_injected=true&lt;/script&gt;" in (sample_site / "index.html").read_text()
    # plotly reads labels as HTML too: the figures carry the escaped text
    for slug, div, fig in all_figures(sample_pages):
        blob = json.dumps(fig.to_plotly_json(), default=str)
        assert "<img" not in blob and "<script" not in blob, (slug, div)


def test_units_and_escaping_in_tables(sample_site):
    html = (sample_site / "index.html").read_text()
    for header in (
        "TTFT P95 (ms)",
        "TPOT P95 (ms)",
        "output throughput (tokens/s)",
        "measured under the SLO (requests)",
    ):
        assert header in html


# --- what the pages conclude ---------------------------------------------------------------------------------


def test_recommendation_is_derived_and_explained(sample_pages, sample_data):
    html = sample_pages["index"].body
    assert "Recommended:" in html and "Chosen in code" in html
    h100 = sample_data.runs[sample_data.runs["machine"] == "h100-sxm-80gb"]
    rec = derive.recommend(site_data.latest_runs(h100), "h100-sxm-80gb", sample_data.records)
    # fp8's knee (28) beats auto's (24), but its evaluation loses 5 and 10 of 500 items against a 1-point budget:
    # not shown non-inferior, so not eligible; nvfp4 crashed
    assert rec.dtype == "auto" and rec.concurrency == 24
    lines = {line.split(":")[0]: line for line in rec.lines}
    assert lines["fp8"].startswith("fp8: excluded: accuracy ") and "budget 1.0" in lines["fp8"]
    assert lines["nvfp4"].startswith("nvfp4: excluded: run partial")
    for line in rec.lines:  # the page prints each dtype's line, as report does
        assert esc(line) in html
    cpu = sample_data.runs[sample_data.runs["machine"] == "cpu-amd-epyc"]
    rec = derive.recommend(site_data.latest_runs(cpu), "cpu-amd-epyc", sample_data.records)
    assert rec.dtype == "auto" and any("no eval" in line for line in rec.lines)  # fp8 was never evaluated


def test_pages_switch_on_the_finding_kind_not_its_text(tmp_path):
    """Issue 24, BAD 6: a CPU-wait warning or an accuracy exclusion about fp8 (any finding with a dtype) made the
    overview call fp8 'probably not honoured' and changed its recommendation."""
    doc = sample.cpu_record()
    doc["findings"] += [
        {"level": "warning", "dtype": "fp8", "text": "fp8 excluded from the recommendation: accuracy: -2 points"},
        {"level": "warning", "dtype": "fp8", "text": "the load generator waited for a CPU 30% of phase fixed (fp8)"},
    ]
    (tmp_path / "m" / "runs").mkdir(parents=True)
    (tmp_path / "m" / "runs" / "r.json").write_text(json.dumps(doc))
    data = site_data.load(tmp_path)
    rows = data.runs.set_index("kv_cache_dtype")
    assert rows.at["fp8", "honoured"] and not rows.at["nvfp4", "honoured"]
    kinds = dict(zip(data.findings["text"].str[:12], data.findings["kind"], strict=True))
    assert kinds["fp8 excluded"] == "accuracy" and kinds["the load gen"] == "starved-client"
    html = next(p for p in site.build_pages(data) if p.slug == "index").body
    assert "fp8: excluded: no eval" in html and "fp8: excluded: probably not honoured" not in html
    assert html.count("probably not honoured") == 1  # nvfp4's line, once


def test_capacity_page_shows_the_not_honoured_finding(sample_pages):
    page = sample_pages["capacity"]
    assert "probably NOT honoured on this platform" in page.body and 'class="note finding"' in page.body
    fig = dict(page.figures)["capacity-cpu-amd-epyc"]
    notes = [a.text for a in fig.layout.annotations]
    assert any("nvfp4 probably NOT honoured" in t for t in notes)
    names = {t.name for t in fig.data}
    assert {
        "auto: capacity model",
        "nvfp4: capacity model",
        "nvfp4: engine-reported",
        "auto: measured under the SLO",
    } <= names
    # the engine's nvfp4 point sits on fp8's line (32 requests), far below nvfp4's own
    line = next(t for t in fig.data if t.name == "nvfp4: capacity model")
    at_512 = dict(zip(line.x, line.y, strict=False))[512]
    assert at_512 == pytest.approx(56.75, rel=0.01)


def test_latency_page_marks_slo_and_knee(sample_pages):
    fig = dict(sample_pages["latency"].figures)["latency-h100-sxm-80gb"]
    shapes = fig.layout.shapes
    assert sum(1 for s in shapes if s.y0 == s.y1 == 250) == 1  # TTFT SLO
    assert sum(1 for s in shapes if s.y0 == s.y1 == 25) == 1  # TPOT SLO
    knees = sorted({s.x0 for s in shapes if s.x0 == s.x1})
    assert knees == [24, 28]  # auto and fp8; nvfp4 never finished its search
    texts = [a.text for a in fig.layout.annotations]
    assert "knee fp8: 28" in texts and "SLO 250 ms" in texts
    assert "engine died during slo-c32" in sample_pages["latency"].body  # the failure is on the page


def test_latency_vs_request_rate_for_open_loop_loads(sample_pages):
    fig = dict(sample_pages["latency"].figures)["latency-rate-h200-141gb"]
    assert fig.layout.xaxis.title.text == "request rate (requests/s)"
    assert sorted({x for t in fig.data for x in t.x}) == [2.0, 8.0]
    assert not [s for s in fig.layout.shapes if s.x0 == s.x1]  # a knee is a concurrency, not a rate


def test_history_marks_releases_and_regressions(sample_pages):
    figs = dict(sample_pages["history"].figures)
    ttft = figs["history-ttft-p95"]
    assert ttft.layout.title.text == "TTFT P95 (ms) — cpu-amd-epyc"
    regression = [t for t in ttft.data if t.name == "regression (kvbench regress)"]
    assert len(regression) == 1 and len(regression[0].x) == 1
    fp8 = next(t for t in ttft.data if t.name == "fp8")
    assert regression[0].y[0] == pytest.approx(fp8.y[-1])  # the ring is on the newest fp8 point, in ms
    assert fp8.y[0] == pytest.approx(350.0)
    releases = [a.text for a in ttft.layout.annotations if "→" in a.text]
    assert releases == ["vLLM 0.30.0 → 0.31.0", "vLLM 0.31.0 → 0.32.0"]
    assert all("vLLM 0.3" in t for t in ttft.layout.xaxis.ticktext)  # every point labelled with its version
    body = sample_pages["history"].body
    assert "Not measured at these points" in body and "failed" in body  # nvfp4's failures are listed, not hidden


def test_history_with_real_regress_rule(sample_data):
    regress = pytest.importorskip("kvbench.analysis.regress")
    found = regress.find_regressions(sample_data.history)
    flagged = [r for r in found if r.verdict == "regression"]
    assert [(r.metric, r.kv_dtype) for r in flagged] == [("ttft_p95", "fp8")]


def test_claims_page_lists_every_claim_with_source(sample_pages, sample_data):
    body = sample_pages["claims"].body
    for v in sample_data.verdicts:
        assert v.id in body
    assert body.count('class="badge"') == len(sample_data.verdicts)
    # the article is named by title, publisher and date; nothing outside the claims folder is linked
    source = sample_data.claims["source"]
    assert source.title in body and source.publisher in body and source.date in body
    assert "../shared" not in body and "javascript:" not in body


def test_gpus_page_compares_machines_side_by_side(sample_pages):
    figs = dict(sample_pages["gpus"].figures)
    llama = next(f for k, f in figs.items() if "llama-3-1-8b" in k)
    xs = {x for t in llama.data for x in t.x}
    assert xs == {"h100-sxm-80gb", "h200-141gb"}


def test_kernels_page_draws_roofline(sample_pages):
    fig = dict(sample_pages["kernels"].figures)["kernels-h100-sxm-80gb"]
    assert any(s.y0 == 3350.0 for s in fig.layout.shapes)
    assert any("roofline 3,350 GB/s" in (a.text or "") for a in fig.layout.annotations)


# --- writing -----------------------------------------------------------------------------------------------------


def test_site_is_swapped_in_whole(tmp_path, sample_data, sample_pages, monkeypatch):
    built = list(sample_pages.values())  # the pages themselves are other tests' subject: built once
    monkeypatch.setattr(site, "build_pages", lambda data: built)
    out = tmp_path / "site"
    site.write_site(sample_data, out, generated_at="first")
    assert "first" in (out / "index.html").read_text()

    def broken(page, *args):
        if page.slug == "claims":  # some pages are written, then one fails
            raise RuntimeError("page failed")
        return "<html></html>"

    with monkeypatch.context() as m:
        m.setattr(site, "render_page", broken)
        with pytest.raises(RuntimeError):
            site.write_site(sample_data, out, generated_at="second")
    assert "first" in (out / "index.html").read_text()  # the old site is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # no temp folders left
    site.write_site(sample_data, out, generated_at="third")
    assert "third" in (out / "index.html").read_text() and sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_refuses_to_replace_a_foreign_folder(tmp_path, sample_data):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    from kvbench.core.errors import UsageError

    with pytest.raises(UsageError, match="refusing to replace"):
        site.write_site(sample_data, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_overview_keeps_each_workload_of_a_machine():
    # A nightly runs several workloads per machine: each keeps its own newest run, titled by its setup.
    import pandas as pd

    def row(run, when, prompt, dtype="auto"):
        return {
            "machine": "h100-sxm-80gb",
            "run_id": run,
            "created_at": pd.Timestamp(when),
            "model": "llama",
            "prompt_tokens": prompt,
            "output_tokens": 256,
            "fixed_load": "concurrency 64",
            "kv_cache_dtype": dtype,
        }

    runs = pd.DataFrame(
        [row("a", "2026-11-28", 1024), row("b", "2026-11-29", 16384), row("c", "2026-11-29 01:00", 1024)]
    )
    latest = site_data.latest_runs(runs)
    assert sorted(latest["run_id"]) == ["b", "c"]
    titles = [t for _, _, t in site_data.setups(latest)]
    assert len(titles) == 2 and all(t.startswith("h100-sxm-80gb — llama, ") for t in titles)
    single = site_data.setups(site_data.latest_runs(runs[runs["run_id"] != "b"]))
    assert [t for _, _, t in single] == ["h100-sxm-80gb"]


def test_tradeoff_page_draws_fronts_per_dtype_and_machine_with_cost(sample_pages):
    figs = dict(sample_pages["tradeoff"].figures)
    front = next(f for k, f in figs.items() if k.startswith("front-"))
    names = {t.name for t in front.data if t.mode == "lines"}
    assert {"auto · h100-sxm-80gb", "fp8 · h200-141gb"} <= names  # one front line per dtype and machine
    assert front.layout.xaxis.title.text.endswith("(tokens/s per user)")
    cost = next(f for k, f in figs.items() if k.startswith("cost-"))
    ys = [y for t in cost.data for y in t.y]
    assert ys and all(y > 0 for y in ys)  # USD per million output tokens, only where a price was given
    assert "Energy per token: not measured" in sample_pages["tradeoff"].body


def test_repeated_headlines_get_error_bars(sample_pages):
    figs = dict(sample_pages["gpus"].figures)
    fig = next(f for k, f in figs.items() if "llama-3-1-8b" in k)
    bars = [t for t in fig.data if t.error_y and t.error_y.array is not None and any(v > 0 for v in t.error_y.array)]
    assert bars  # output throughput was repeated 3 times: its 95% interval is drawn


def test_quality_page_shows_accuracy_with_intervals_per_condition(sample_pages):
    page = sample_pages["quality"]
    fig = dict(page.figures)[next(iter(dict(page.figures)))]
    fp8 = [t for t in fig.data if t.name.startswith("fp8")]
    assert fp8 and list(fp8[0].x) == ["at rest", "at load", "during load"]
    assert all(v > 0 for v in fp8[0].error_y.array)  # the Wilson interval is drawn
    assert "drop of 1.0 points" in page.body and "99.0%" in page.body


def test_history_points_with_repeats_get_95pct_error_bars():
    from kvbench.dashboards import page_history
    from kvbench.records.repeats import half_width

    loaded = site_data.load(committed_results(), asv_conf=REPO / "asv.conf.json")
    ttft = loaded.history[loaded.history["metric"] == loaded.history["metric"].iloc[0]].copy()
    unit = ttft["unit"].iloc[0]
    _, factor = page_history.display_unit(unit)
    newest = ttft["when"].idxmax()
    ttft.loc[newest, ["repeat_std", "repeat_n"]] = [2.0, 3]  # as a run with --repeat 3 records it
    fig = page_history.metric_figure(ttft, pd.DataFrame(), "t", unit)
    dtype = ttft.loc[newest, "kv_dtype"]
    trace = next(t for t in fig.data if t.name == dtype and t.error_y is not None and t.error_y.array is not None)
    bars = [b for b in trace.error_y.array if b == b]
    assert bars == [pytest.approx(half_width(2.0, 3) * factor)]  # only the repeated point, t interval of its mean
    assert all(
        t.error_y.array is None
        for t in page_history.metric_figure(
            loaded.history[loaded.history["metric"] == ttft["metric"].iloc[0]], pd.DataFrame(), "t", unit
        ).data
        if t.error_y is not None
    )  # the committed points were not repeated: no bars
