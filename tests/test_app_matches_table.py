"""The Matches & rejections table and the version chips (issue 39's newcomer run): the table listed every pass's rows
whatever version was selected and did not say so; the red "✗1" on the selected dark-blue chip was unreadable."""

import re

import pytest
from test_app_views import tiny

from rlxviz.app.explain import decision_rows
from rlxviz.app.panels import VersionStepper
from rlxviz.app.whyview import DecisionTable


def test_the_table_says_it_lists_the_whole_run_and_can_follow_the_selected_pass():
    s = tiny()
    s.apply_variant("extra_h1_user")  # a rejection in the run
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
    s.apply_variant("extra_h1_user")
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
    s.apply_variant("extra_h1_user")
    rows = s.version_rows()
    k = next(r["#"] for r in rows if r.get("rejections"))
    if not selected:
        s.version = next(r["#"] for r in rows if not r.get("rejections"))
    else:
        s.version = k
    html = VersionStepper(state=s)._counts()
    chip = next(c for c in html.split("<span class='rv-chip'")[1:] if "✗" in c)
    chip_bg = re.search(r"background:(#[0-9a-f]{6})", chip).group(1)
    mark = re.search(r"<span title='rejections of this pass' style='([^']*)'>✗", chip).group(1)
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
    assert table.table.titles == {"hint": "fix", "fix": "compiler fix"}
    said = _why_markdown("g", "", "m", "HINT", "FIX")
    assert "*Fix:* HINT" in said and "*Compiler fix:* FIX" in said
