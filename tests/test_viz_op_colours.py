"""Op fills are not status colours (newcomer: the fused attention node's pink read as a rejected cluster's red), and
the graph has a legend of them.

Every op-family fill (`viz.styles.FAMILY_COLORS`) and every hashed fill of an op of no family lies at least
`MIN_DELTA_E` (CIE76 in Lab) from each status and rejection colour (`STATUS_MARKS`); the after pane carries a folded
legend of the op colours while no overlay recolours the nodes."""

from __future__ import annotations

import pytest

from rlxviz.app.graphpane import FULL_CLOSE, ops_legend_html
from rlxviz.app.jobs import Runner
from rlxviz.app.panels import GraphCompare
from rlxviz.app.state import AppState
from rlxviz.ir import Op, family
from rlxviz.viz.styles import (
    FAMILY_COLORS,
    MIN_DELTA_E,
    REJECT,
    REJECT_FILL,
    STATUS_COLORS,
    STATUS_MARKS,
    delta_e,
    hashed_color,
    lab,
    op_color,
    op_legend,
)


def test_delta_e_is_the_lab_distance():
    assert delta_e("#ffffff", "#ffffff") == 0
    assert delta_e("#000000", "#ffffff") == pytest.approx(100, abs=0.1)  # L* from 0 to 100, no hue
    assert lab("#ff0000")[1] > 70 and lab("#0000ff")[2] < -100  # red is +a*, blue -b*
    assert delta_e("#f7c1c1", "#ffcdd2") < 10  # the old attention pink beside the rejected fill: barely apart
    with pytest.raises(ValueError):
        lab("red")


def test_the_status_marks_are_every_status_and_rejection_colour():
    assert set(STATUS_MARKS.values()) == {*STATUS_COLORS.values(), REJECT, REJECT_FILL}


@pytest.mark.parametrize("fam", list(FAMILY_COLORS))
def test_each_op_family_fill_is_far_from_every_status_colour(fam):
    fill = FAMILY_COLORS[fam]
    near = {k: round(delta_e(fill, c), 1) for k, c in STATUS_MARKS.items() if delta_e(fill, c) < MIN_DELTA_E}
    assert not near, (fam, fill, near)
    assert lab(fill)[0] >= 70, (fam, fill)  # pale enough for the node's black text
    assert MIN_DELTA_E >= 20


def test_the_families_differ_from_each_other_too():
    fills = list(FAMILY_COLORS.items())
    close = [(a, b) for i, (a, ca) in enumerate(fills) for b, cb in fills[i + 1:] if delta_e(ca, cb) < 12]
    assert not close, close


def test_an_op_of_no_family_gets_a_hashed_fill_far_from_the_status_colours_too():
    for key in [f"op{i}" for i in range(300)] + ["host_call", "custom.Foo", "Gather"]:
        fill = hashed_color(key)
        assert fill == hashed_color(key)  # stable
        assert min(delta_e(fill, c) for c in STATUS_MARKS.values()) >= MIN_DELTA_E, (key, fill)
    for op in Op:
        fill = op_color(op)
        assert min(delta_e(fill, c) for c in STATUS_MARKS.values()) >= MIN_DELTA_E, (op, family(op), fill)


def test_the_fused_attention_node_is_not_pink():
    fill = op_color(Op.FUSED_ATTENTION_BLOCK)
    assert delta_e(fill, STATUS_COLORS["rejected"]) >= MIN_DELTA_E and delta_e(fill, REJECT) >= MIN_DELTA_E


def test_the_after_pane_has_a_folded_op_legend_unless_an_overlay_recolours_it():
    legend = op_legend()
    assert [f for f, _, _ in legend] == list(FAMILY_COLORS)
    text = ops_legend_html()
    assert text.startswith("<summary") and "open" not in text.split(">", 1)[0]  # folded: no height until opened
    for fam, fill, _ in legend:
        assert fill in text and f"<b>{fam}</b>" in text
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    g = GraphCompare(state=s)
    assert g.after.legend == text and g.before.legend == ""  # one legend, in the after pane
    s.overlay = "error"
    assert g.after.legend == ""  # the fills are the overlay's: its own legend shows
    s.overlay = "none"
    assert g.after.legend == text


def test_the_full_view_says_how_to_close_it():
    from rlxviz.app.graphpane import _ESM

    assert FULL_CLOSE == "✕ close (Esc)" and FULL_CLOSE in _ESM
    assert "head.style.visibility = on ? 'hidden' : ''" in _ESM  # the page's header no longer lies over its top
