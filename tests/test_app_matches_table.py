"""The Matches & rejections table and the version chips (issue 39's newcomer run): the table listed every pass's rows
whatever version was selected and did not say so; the red "✗1" on the selected dark-blue chip was unreadable."""

import functools
import re

import pytest
from test_app_views import tiny

from rlxviz.app.explain import decision_rows
from rlxviz.app.panels import VersionStepper
from rlxviz.app.whyview import DecisionTable
from rlxviz.passes.why.policy import NOT_EXPECTED_FIX


def test_the_table_says_it_lists_the_whole_run_and_can_follow_the_selected_pass():
    s = tiny()
    s.apply_variant("dead_h1_user")  # a rejection in the run
    table = DecisionTable(state=s)
    every = decision_rows(s.trace)
    assert len(table.table.value) == len(every) and "**The whole run:**" in table.about.object
    assert f"({len(every)} rows)" in table.about.object
    table.only.value = True
    for k, label in enumerate(s.version_labels):
        s.version = k
        n = s.version_index()
        if n == 0:
            assert len(table.table.value) == len(every) and "input graph" in table.about.object
            continue
        step = n - 1
        assert label == f"after {s.trace.steps[step].pass_name}"
        want = [r for r in every if r["step"] == step]
        assert list(table.table.value["pass"]) == [r["pass"] for r in want]
        assert table.about.object.startswith(f"**{label.replace('_', chr(92) + '_')} only:**"), table.about.object
        assert f"({len(want)} rows)" in table.about.object and table.table.selection == []


def test_a_row_clicked_in_the_followed_list_stays_in_it():
    s = tiny()
    s.apply_variant("dead_h1_user")
    table = DecisionTable(state=s)
    table.only.value = True
    s.version = next(k for k, lbl in enumerate(s.version_labels) if lbl == "after fuse_transformer_layer")
    rows = list(table._rows)
    assert rows and any(r["kind"] == "rejected" for r in rows)
    table.select_row(next(i for i, r in enumerate(rows) if r["kind"] == "rejected"))
    assert s.version_labels[s.version] == "after fuse_transformer_layer" and table._rows == rows


def _luminance(hex_colour: str) -> float:
    def lin(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def _contrast(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@pytest.mark.parametrize("selected", [True, False])
def test_the_rejection_count_is_readable_on_its_chip(selected):
    s = tiny()
    s.apply_variant("dead_h1_user")
    rows = s.version_rows()
    k = next(r["#"] for r in rows if r.get("rejections"))
    if not selected:
        s.version = next(r["#"] for r in rows if not r.get("rejections"))
    else:
        s.version = k
    html = VersionStepper(state=s)._counts()
    chip = next(c for c in html.split("<span class='rv-chip'")[1:] if "✗" in c)
    chip_bg = re.search(r"background:(#[0-9a-f]{6})", chip).group(1)
    mark = re.search(r"<span class='rv-rejected' title='[^']*' style='([^']*)'>✗", chip).group(1)
    colour = re.search(r"(?:^|;)color:(#[0-9a-f]{6})", mark).group(1)
    behind = m.group(1) if (m := re.search(r"background:(#[0-9a-f]{6})", mark)) else chip_bg
    assert _contrast(colour, behind) >= 4.5, (colour, behind, _contrast(colour, behind))
    assert colour == "#c62828"  # red stays the rejection's colour


def test_the_table_takes_the_tabs_height_and_fits_its_width():
    """A newcomer run at 1920x1080: the table was fixed at 420 px ("(18 rows)", 12 shown, ~400 px blank below it,
    no scroll bar in sight) and its message, hint and fix columns (420, 260, 220 px) ran past the right edge, hint
    and fix cut. Now it stretches to the tab's height, its columns share the width (100% in all) with their text
    wrapped, and its scroll bar is drawn."""
    from rlxviz.app.whyview import TABLE_CSS

    s = tiny()
    table = DecisionTable(state=s)
    t = table.table
    assert t.sizing_mode == "stretch_both" and t.height is None and t.min_height and t.min_height <= 320
    assert table.__panel__().sizing_mode == "stretch_both"
    assert t.layout == "fit_columns"
    widths = t.widths
    assert set(widths) == set(DecisionTable.columns)
    assert all(isinstance(w, str) and w.endswith("%") for w in widths.values()), widths
    assert sum(float(w[:-1]) for w in widths.values()) == pytest.approx(100)
    for col in ("message", "hint", "fix", "rule"):
        assert t.formatters[col] == {"type": "textarea"}, col
    assert "::-webkit-scrollbar" in TABLE_CSS and TABLE_CSS in t.stylesheets
    # what Tabulator is given: each column's share, as a percentage string (Panel passes it through)
    frame = t.value
    spec = {c["field"]: c for c in t._config_columns(t._get_column_definitions(list(frame.columns), frame))}
    assert {f: spec[f].get("width") for f in DecisionTable.columns} == widths, spec


def test_the_fix_columns_are_titled_as_the_why_tab_and_inspector_name_them():
    """The row's `hint` is what the Why tab and the inspector print as "Fix:", its `fix` their "Compiler fix:" (the
    table titled them "hint" and "fix": a newcomer read the compiler fix as the model's fix)."""
    from rlxviz.app.explain import _why_markdown

    table = DecisionTable(state=tiny())
    assert table.table.titles["hint"] == "fix" and table.table.titles["fix"] == "compiler fix"
    said = _why_markdown("g", "", "m", "HINT", "FIX")
    assert "*Fix:* HINT" in said and "*Compiler fix:* FIX" in said


# -- the rows' order (issue 39: a newcomer could not follow it) ---------------------------------------------------

def _reading_keys(rows, trace):
    from rlxviz.passes.trace import reading_order

    key = reading_order(trace)
    return [(key(r["layer"], r["anchor"]), r["step"]) for r in rows]


RUNS = ["bert-tiny dead_h1_user", "bert-tiny tanh_gelu", "llama-block", "n3-01-rope-rotate-half-heads.rlx"]
"""Runs with rows in several layers, each its own case: bert-tiny with a rejection, bert-tiny with a soft rejection,
a LLaMA block, an IR file whose nodes are ordered by layer (a shared case copied into tests/data)."""


@functools.cache
def _run(name):
    from pathlib import Path

    from rlxviz import session

    if name.startswith("bert-tiny"):
        return tiny(variant=name.split()[1]).trace
    if name == "llama-block":
        m = session.load("llama-block", 1, 8)
    else:
        m = session.load_ir_text((Path(__file__).parent / "data" / "cases" / name).read_text())
    return session.run_pipeline(m.graph, session.build_pipeline())


@pytest.mark.parametrize("name", RUNS)
def test_rows_follow_the_model_by_layer_then_graph_position_then_pass(name):
    trace = _run(name)
    rows = decision_rows(trace)
    assert len(rows) > 2
    keys = _reading_keys(rows, trace)
    assert keys == sorted(keys), [(r["layer"], r["position"], r["step"], r["rule"]) for r in rows]
    # the shown position is the sort key's: non-decreasing within a layer, each layer's rows together
    layers = [r["layer"] for r in rows]
    seen = [k for i, k in enumerate(layers) if i == 0 or layers[i - 1] != k]
    assert len(seen) == len(set(seen)), seen
    for a, b in zip(rows, rows[1:], strict=False):
        if a["layer"] == b["layer"] and a["layer"] is not None:
            assert a["position"] <= b["position"] and (a["position"] < b["position"] or a["step"] <= b["step"])
    assert all(isinstance(r["position"], int) and 0 <= r["position"] < len(trace.input) for r in rows)


def test_a_made_anchor_stands_where_its_result_stood():
    """A node a pass made (the attention fuse_sdpa packed) takes the position of the last node it absorbed in the
    input graph (where its result stood); a rejection anchored on it sorts there."""
    from rlxviz.passes.trace import anchor_position

    trace = tiny(variant="dead_h1_user").trace
    position = anchor_position(trace)
    made = [n for s in trace.steps for n in s.after if n.id not in trace.input and n.absorbed]
    assert made
    for n in made:
        origin = [position(int(a)) for a in n.absorbed]
        assert position(n.id) == max(origin)
    assert position(10**9) == float("inf")


def test_the_table_shows_its_order_and_keeps_it():
    """The table lists the rows in `decision_rows`' order (the browser's sort by kind is gone), its first columns are
    the sort key (layer, graph position), and the line above it says the order."""
    from rlxviz.app.whyview import ORDER_NOTE

    s = tiny()
    s.apply_variant("dead_h1_user")
    table = DecisionTable(state=s)
    rows = decision_rows(s.advised_trace())
    assert table.table.sorters == []
    assert list(table.table.value.columns[:2]) == ["layer", "position"]
    assert list(table.table.value["anchor"]) == [r["anchor"] for r in rows]
    assert list(table.table.value["position"]) == [r["position"] for r in rows]
    assert ORDER_NOTE in table.about.object and "by layer" in ORDER_NOTE and "then by pass" in ORDER_NOTE
    table.only.value = True
    s.version = next(k for k, lbl in enumerate(s.version_labels) if lbl == "after fuse_transformer_layer")
    assert ORDER_NOTE in table.about.object


@pytest.mark.parametrize("name", RUNS)
def test_explain_lists_its_left_out_places_in_the_tables_order(name):
    """One order: `explain`'s left-out lines (text and JSON: `report.left_out_rejections`) come in the order the
    app's table lists the same places."""
    from rlxviz.passes.report import left_out_rejections
    from rlxviz.passes.trace import reading_order

    trace = _run(name)
    rows = decision_rows(trace)
    listed = [(r.rule, r.anchor, r.guard) for r in left_out_rejections(trace)]
    in_table = [(r["rule"], r["anchor"], r["guard"]) for r in rows]
    assert [in_table.index(x) for x in listed] == sorted(in_table.index(x) for x in listed)
    key = reading_order(trace)
    got = [key(r.layer, r.anchor) for r in left_out_rejections(trace)]
    assert got == sorted(got)


def test_explain_on_an_exported_decoder_lists_places_layer_by_layer(capsys):
    """optimum's LLaMA export with past key values (a shared case): its model's own terms, two per layer from two
    passes, were listed pass by pass (layer 0, layer 1, layer 0, layer 1); now layer by layer, in the table's order,
    in the text and in `--json`."""
    import json
    from pathlib import Path

    from clirun import run

    path = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "optimum.llama-with-past.onnx"
    code, out, _ = run(capsys, "explain", path)
    assert code == 0, out
    head = next(i for i, ln in enumerate(out.splitlines()) if "places keep the model's own terms" in ln)
    items = out.splitlines()[head + 1:head + 5]
    layers = [re.search(r"\(model\.layers\.(\d+)\.", ln)[1] for ln in items]
    passes = [ln.split()[0].split(".")[0] for ln in items]
    assert layers == ["0", "0", "1", "1"] and passes == ["fuse_sdpa", "fuse_attention_block"] * 2, items
    code, out, _ = run(capsys, "explain", path, "--json")
    group = next(g for g in json.loads(out)["left_out_groups"] if len(g["items"]) == 4)
    assert [re.search(r"\(model\.layers\.(\d+)\.", x)[1] for x in group["items"]] == ["0", "0", "1", "1"]


def test_every_header_fits_its_column_at_1280_and_says_its_meaning():
    """At 1280 px beside the sidebar "layer" and "anchor" read "la…" and "anc…": each title fits its share there
    (an estimate; tests/test_browser_matches_table.py measures it), and a shortened one has its whole name as a
    tooltip."""
    from rlxviz.app.whyview import COLUMN_WIDTHS, header_fits

    t = DecisionTable(state=tiny()).table
    for col in DecisionTable.columns:
        title = t.titles.get(col, col)
        assert header_fits(title, COLUMN_WIDTHS[col]), (col, title, COLUMN_WIDTHS[col])
        if col in ("position", "anchor"):  # shortened: the whole name in the tooltip
            assert title != col and t.header_tooltips[col].startswith(col), (col, t.header_tooltips)
    assert not header_fits("layer", "4%") and not header_fits("anchor", "5%")  # the old shares cut them


def test_the_fix_column_says_a_fix_not_the_message_again():
    """llama-block's `attn_is_fused_block` row (fuse_transformer_layer: fuse_attention_block refused earlier) had its
    fix column repeat the whole nested message ("fuse_attention_block ran before and said no here: ..."). It then
    named the earlier refusal's fix ("fix fuse_attention_block's refusal first ..."), a line `explain` never prints,
    on a refusal the layer does not expect. Its fix is now `explain`'s (`passes.report.fix_line`): that nothing needs
    changing, since the layer's kind does not expect the fusion (`policy.not_expected_fix`); the earlier refusal's own
    row keeps its fix; the graph's tooltips say the same."""
    from rlxviz.viz.overlay import worded

    s = tiny(preset="llama-block")
    rows = decision_rows(s.trace)
    row = next(r for r in rows if r["guard"] == "attn_is_fused_block")
    block = next(r for r in rows if r["pass"] == "fuse_attention_block" and r["anchor"] == row["anchor"])
    assert "fuse_attention_block ran before and said no here" in row["message"], row
    assert row["hint"].startswith(f"{NOT_EXPECTED_FIX}: ") and row["hint"] not in row["message"], row["hint"]
    assert "refusal first" not in row["hint"] and block["hint"] != row["hint"]
    assert block["hint"] and block["hint"] not in block["message"]
    k = row["step"]
    tips = {(r.rule, r.guard): r.hint for r in worded(s.trace, s.trace.steps[k])}
    assert tips[(row["rule"], row["guard"])] == row["hint"]


def test_node_ids_are_written_as_ids_not_as_numbers_with_separators():
    """Newcomer run 31: convbert.qdq's node and pos columns read `1,332` and `3,127` (a number column's default
    format), where every other view writes `%1332` / `node 1332`."""
    table = DecisionTable(state=tiny()).table
    assert {c: table.formatters.get(c) for c in ("anchor", "position")} == {
        "anchor": {"type": "plaintext"}, "position": {"type": "plaintext"}}
