"""The after-pane's title and the op-count chips count the same thing (a newcomer run: "after dead_code_elimination:
0 node(s) added, 11 removed" over a chip saying (-3); on an uploaded ONNX file "10 removed" while the ops stayed
15 -> 15 and the pictures looked the same). The title counted every node, params and constants too, which the
chips do not count and the drawing folds into labels; it now counts ops first, then the other nodes by kind."""

from __future__ import annotations

import re

import pytest
from test_app_views import tiny

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.viz.overlay import Overlay

DEAD = """graph dead {
  %0 = input {name="x"} : f32[2, 8]
  %1 = param {name="w"} : f32[8]
  %2 = param {name="v"} : f32[8]
  %3 = const {value=2.0} : f32[]
  %4 = add(%0, %1) : f32[2, 8]
  %5 = mul(%0, %2) : f32[2, 8]
  %6 = tanh(%5) : f32[2, 8]
  %7 = mul(%6, %3) : f32[2, 8]
  return %4
}"""
"""Three dead ops (%5..%7) and two dead params/constants (%2, %3): `dead_code_elimination` removes five nodes."""

DEAD_WEIGHT = """graph dead_weight {
  %0 = input {name="x"} : f32[2, 8]
  %1 = param {name="w"} : f32[8]
  %2 = param {name="unused"} : f32[8]
  %3 = add(%0, %1) : f32[2, 8]
  return %3
}"""
"""One dead param and no dead op (the uploaded ONNX case: nodes removed, ops unchanged)."""

TITLE = re.compile(r"^after (\S+), in the graph: (\d+) op\(s\) added, (\d+) removed(.*)$")


def _ir(text: str) -> AppState:
    return AppState(runner=Runner(background=False), source="ir", ir_text=text)


def _titles_and_chips(s: AppState) -> list[tuple[str, int]]:
    """(after-pane title, chip change) of every shown version after a pass."""
    shown = s._visible(s.trace)  # (index in the trace, label) of each row, in order (0: the input)
    rows = s.version_rows()
    assert [label for _, label in shown] == [r["version"] for r in rows]
    return [(Overlay.after(s.trace.steps[i - 1]).title, r["change"])
            for (i, _), r in zip(shown, rows, strict=True) if i]


@pytest.mark.parametrize("make", [lambda: _ir(DEAD), lambda: _ir(DEAD_WEIGHT), lambda: tiny(),
                                  lambda: tiny(variant="extra_h1_user")])
def test_the_title_counts_ops_as_the_chips_do(make):
    s = make()
    shown = _titles_and_chips(s)
    assert shown, s.version_labels
    for title, change in shown:
        m = TITLE.match(title)
        assert m, title
        assert int(m.group(2)) - int(m.group(3)) == change, (title, change)


def test_dead_params_and_constants_are_counted_apart():
    (title, change), = _titles_and_chips(_ir(DEAD))
    assert title == ("after dead_code_elimination, in the graph: 0 op(s) added, "
                     "3 removed; param(s)/constant(s): 2 removed"), title
    assert change == -3


def test_a_pass_that_removed_only_a_weight_says_no_op_changed():
    (title, change), = _titles_and_chips(_ir(DEAD_WEIGHT))
    assert title == ("after dead_code_elimination, in the graph: 0 op(s) added, "
                     "0 removed; param(s)/constant(s): 1 removed"), title
    assert change == 0


def _chip(s: AppState, label: str) -> str:
    from rlxviz.app.panels import VersionStepper

    html = VersionStepper(state=s)._counts()
    return next(c for c in html.split("<span class='rv-chip'")[1:] if f"title='{label}" in c)


@pytest.mark.parametrize("text, said", [(DEAD_WEIGHT, "(-1 params/consts)"), (DEAD, "(-3, -2 params/consts)")])
def test_a_chip_says_the_params_and_constants_a_pass_removed(text, said):
    """A newcomer read "dead_code_elimination: N" with no count change as a no-op while the pass had removed dead
    weights: the chip says the other nodes' change after the ops' (`viz.overlay.other_changes`), as the after
    pane's title counts them."""
    s = _ir(text)
    row = next(r for r in s.version_rows() if r["version"] == "after dead_code_elimination")
    assert row["others"] == said.strip("()").split(", ")[-1]
    chip = _chip(s, "after dead_code_elimination")
    assert f"</b> {said}" in chip, chip
