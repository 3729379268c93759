"""What each timing row says, the same in `rlxviz time` (text and `--json`) and the Timing tab (newcomer run 8):
rows that ran rlxviz's kernels are named so in both tables and the row where the lowering changes says that its
comparison with the row above is not the pass's alone; a busy run's JSON holds no bare ratio; a version a pass left
unchanged has no copied figures; the input set made from the text box is named `text`; the busy banner says no ratio
is shown; the Timing button's tooltip does not cover its neighbours. Fabricated rounds: no quiet machine needed."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from timed_versions import timed

from rlxviz.app.timeproc import force_busy
from rlxviz.app.timingchart import (
    machine_verdict,
    ms_label,
    speedup_label,
    table_rows,
    timing_factor,
    timing_figure,
)
from rlxviz.cli.timing import busy_verdict, split_json
from rlxviz.models import load_model
from rlxviz.session import VersionTiming, input_sets, timing_table
from rlxviz.session.inputs import RANDOM_SET, TEXT_SET, feeds_kind
from rlxviz.session.lowerings import fusion_and_kernels_of
from rlxviz.session.timing import OWN_LOWERING_LABEL, speedup_text
from rlxviz.session.timing_text import format_timings, json_speedup
from rlxviz.session.timing_words import KERNELS_MARK, lowering_note, unchanged_text


def falcon_like(seed: int = 0) -> tuple[list[VersionTiming], frozenset[int]]:
    """Input and one pass on MLX's own lowering, then fuse_sdpa on rlxviz's kernels, an unchanged pass (same as #2)
    and one more fused version on the kernels; the indices that ran the kernels."""
    base = 1.0 + 0.01 * np.random.default_rng(seed).random(21)
    rows = [timed(0, "input", base), timed(1, "after canonicalize_gelu", base * 0.9),
            timed(2, "after fuse_sdpa", base * 0.8), VersionTiming(3, "after fuse_shared_input_matmul", 8, same_as=2),
            timed(4, "after fuse_matmul_bias_act", base * 0.7)]
    return rows, frozenset({2, 3, 4})


def test_rows_on_rlxviz_kernels_say_so_in_both_tables_and_the_switch_is_marked():
    rows, kernels = falcon_like()
    table = timing_table(rows, kernels=kernels)
    assert [t["lowering"] for t in table] == ["MLX ops", "MLX ops", "rlxviz kernels", "rlxviz kernels",
                                              "rlxviz kernels"]
    # the lowering changes once, on #2: its comparison with #1 is the pass and the lowering together
    assert [bool(t["lowering_change"]) for t in table] == [False, False, True, False, False]
    note = lowering_note(table[2])
    assert note.startswith("lowering changes here: MLX ops -> rlxviz kernels: ") and "together" in note
    text = format_timings(rows, table=table).splitlines()
    by_start = {ln.split()[0]: ln for ln in text[1:] if ln[:2].strip().isdigit()}
    assert "after fuse_sdpa" + KERNELS_MARK in by_start["2"] and KERNELS_MARK in by_start["4"]
    assert KERNELS_MARK not in by_start["0"] and KERNELS_MARK not in by_start["1"]
    after = text[text.index(by_start["2"]) + 1]
    assert after.strip() == f"^ {note}" and sum(note in ln for ln in text) == 1
    app = table_rows(table)
    assert app[2]["version"] == "2: after fuse_sdpa" + KERNELS_MARK  # the chart's words
    assert app[2]["version"].endswith(KERNELS_MARK) and timing_factor(table[2], True).endswith(KERNELS_MARK)
    assert app[0]["version"] == "0: input" and not app[1]["version"].endswith(KERNELS_MARK)
    assert app[2]["vs_previous"].endswith(note) and table[2]["vs_previous"] in app[2]["vs_previous"]
    assert not any("lowering changes" in r["vs_previous"] for i, r in enumerate(app) if i != 2)


def test_without_kernels_no_row_is_marked():
    rows, _ = falcon_like(1)
    table = timing_table(rows)
    assert {t["lowering"] for t in table} == {"MLX ops"} and not any(t["lowering_change"] for t in table)
    assert KERNELS_MARK not in format_timings(rows) and "lowering changes" not in format_timings(rows)


def test_a_version_not_timed_again_has_no_figures_of_its_own():
    rows, kernels = falcon_like(2)
    table = timing_table(rows, kernels=kernels)
    same = table[3]
    assert same["same_as"] == 2 and table[2]["same_as"] is None
    for k in ("median_ms", "min_ms", "p25_ms", "p75_ms", "first_call_ms", "max_err", "speedup"):
        assert same[k] != same[k], k  # NaN: not #2's figures copied
    assert same["vs_input"] == same["vs_previous"] == "" and same["rounds"] == 0
    words = unchanged_text(2)
    assert words == "unchanged: same as #2, not timed again"
    assert speedup_text(same) == words and table_rows(table)[3]["speedup"] == words
    assert ms_label(same) == words and speedup_label(same) == words  # the chart: no bar, the same words
    assert f"({words})" in format_timings(rows, table=table)
    # the version after it still reads against the version before it, the one that was timed
    assert table[4]["vs_previous"] and table[4]["vs_previous"] != "-"


def test_the_chart_draws_no_bar_for_a_version_not_timed_again():
    rows, kernels = falcon_like(3)
    fig = timing_figure(timing_table(rows, kernels=kernels))
    data = fig.children[0].renderers[0].data_source.data
    assert data["ms"][3] != data["ms"][3] and data["ms_at"][3] == 0.0
    assert data["ms_label"][3] == unchanged_text(2) and data["x"][3] != data["x"][3]


def test_a_busy_runs_json_holds_no_ratio():
    rows, kernels = falcon_like(4)
    busy = force_busy(rows)
    table = timing_table(busy, kernels=kernels)
    assert table[0]["busy"] and all(json_speedup(t) is None for t in table)
    quiet = timing_table(rows, kernels=kernels)
    assert json_speedup(quiet[0]) == 1.0 and json_speedup(quiet[2]) == quiet[2]["speedup"]
    assert json_speedup(quiet[3]) is None  # not timed again
    own = timed(5, OWN_LOWERING_LABEL, np.asarray(rows[4].samples_ms) * 1.2)
    split = fusion_and_kernels_of(force_busy(rows), force_busy([own])[0])
    doc = split_json(split)
    for step in ("fusion", "kernels", "total"):
        assert doc[step]["ratio"] is None and doc[step]["ci_low"] is None and doc[step]["ci_high"] is None
    assert all(r["median_ms"] > 0 for r in doc["rows"])  # the medians in ms stay
    quiet_doc = split_json(fusion_and_kernels_of(rows, own))
    assert isinstance(quiet_doc["fusion"]["ratio"], float)


def test_the_busy_banner_says_no_ratio_is_shown():
    table = timing_table(force_busy(falcon_like(5)[0]))
    text, kind = machine_verdict(table_rows(table))
    assert kind == "danger" and "ratios below are not verdicts" not in text
    assert "No ratio is shown below" in text and "busy: not read" in text
    assert "ratios below are not verdicts" not in busy_verdict("unusable run: ...")
    assert "No ratio below is read" in busy_verdict("unusable run: ...")


def test_the_input_set_made_from_the_text_box_is_named_text():
    model = load_model("bert-tiny")
    feeds = model.random_feeds(seed=0)
    plain = input_sets(model.graph, feeds)
    assert plain.names[0] == "random"
    named = input_sets(model.graph, feeds, base=TEXT_SET)
    assert named.names[0] == "text" and "random" not in named.names
    assert named.names[1:] == plain.names[1:] and named.sets[0].what == TEXT_SET[1]
    assert named.describe().startswith("inputs: text, ")
    tokenizing = SimpleNamespace(tokenizer_file="tokenizer.json", graph=model.graph)
    assert feeds_kind(tokenizing, "rlxviz shows why") == TEXT_SET
    assert feeds_kind(tokenizing, "  ") == RANDOM_SET
    assert feeds_kind(SimpleNamespace(tokenizer_file=None, graph=model.graph), "text") == RANDOM_SET


def test_the_timing_buttons_tooltips_sit_below_them():
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import TimingView

    view = TimingView(state=AppState(runner=Runner(background=False), preset="bert-tiny", batch=1, seq=8))
    for button in (view.button, view.again):
        assert button.description.position == "bottom", button.label
        assert button.description.content
