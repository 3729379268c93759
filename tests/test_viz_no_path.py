"""A match in a graph without layer paths (IR text without @paths) is drawn without a "?" (a newcomer run: the
after pane of IR text showed "? -> ElementwiseRegion" on the region, which read as an error): the cluster's line
says "becomes OP", and the fused node gets no path note (its own lines say the op, the pass and what it absorbed).
A match with a path is drawn as before ("encoder.layer.0... -> FusedX")."""

from __future__ import annotations

import pytest
from served import SMALL_IR
from test_app_views import tiny

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.viz import Overlay, render_dot

LINEAR_IR = """graph linear {
  %0 = input {name="x"} : f32[2, 8]
  %1 = param {name="w"} : f32[8, 4]
  %2 = param {name="b"} : f32[4]
  %3 = matmul(%0, %1) : f32[2, 4]
  %4 = add(%3, %2) : f32[2, 4]
  %5 = tanh(%4) : f32[2, 4]
  %6 = exp(%5) : f32[2, 4]
  return %6
}"""
"""A matmul + bias add and an elementwise chain, no node path: two passes match pathless nodes."""


def _matched_steps(s: AppState) -> list:
    return [st for st in s.trace.steps if st.matches]


@pytest.mark.parametrize("text", [SMALL_IR, LINEAR_IR])
def test_a_pathless_match_is_drawn_without_a_question_mark(text):
    s = AppState(runner=Runner(background=False), source="ir", ir_text=text)
    steps = _matched_steps(s)
    assert steps and all(not m.path for st in steps for m in st.matches), [st.pass_name for st in steps]
    for st in steps:
        before, after = render_dot(st.before, Overlay.before(st)), render_dot(st.after, Overlay.after(st))
        assert "?" not in before and "?" not in after, st.pass_name
        for m in st.matches:
            op = st.after[m.fused].op.value
            assert f"becomes {op}" in before and f"-&gt; {op}" not in after and f"-> {op}" not in after, st.pass_name


def test_a_match_with_a_path_still_names_it():
    s = tiny()
    st = next(st for st in _matched_steps(s) if st.pass_name == "fuse_attention_block")
    m = st.matches[0]
    assert m.path
    op = st.after[m.fused].op.value
    before, after = render_dot(st.before, Overlay.before(st)), render_dot(st.after, Overlay.after(st))
    for dot in (before, after):
        assert m.path in dot and (f"-> {op}" in dot or f"-&gt; {op}" in dot), dot[:500]
