"""The IR tab's side-by-side diff (`app.irdiff`): rows pair changed lines, unchanged runs fold, any two versions can
be compared, and the model's text stays text."""

import re

from test_app_views import tiny

from rlxviz.app.irdiff import MAX_ROWS, diff_table, side_by_side
from rlxviz.app.panels import IRView
from rlxviz.ir import format_graph


def test_rows_pair_changes_and_fold_unchanged_runs():
    a = "\n".join(f"l{i}" for i in range(20))
    b = a.replace("l5", "L5").replace("l15\n", "") + "\nnew"
    rows = side_by_side(a, b, context=1)
    kinds = [r.kind for r in rows]
    assert kinds[0] == "skip" and rows[0].left == "4"  # l0..l3 folded
    rep = next(r for r in rows if r.kind == "replace")
    assert (rep.left_no, rep.left, rep.right_no, rep.right) == (6, "l5", 6, "L5")
    dele = next(r for r in rows if r.kind == "delete")
    assert (dele.left_no, dele.left, dele.right_no) == (16, "l15", None)
    ins = rows[-1]
    assert (ins.kind, ins.left_no, ins.right_no, ins.right) == ("insert", None, 20, "new")
    # every line of both texts is either drawn or counted in a skip row
    drawn = sum(r.left_no is not None for r in rows) + sum(int(r.left) for r in rows if r.kind == "skip")
    assert drawn == 20
    assert side_by_side(a, a) == [] and "hold the same IR" in diff_table([], "input", "input")


def test_any_two_versions_side_by_side():
    s = tiny()
    view = IRView(state=s)
    s.step_to("after fuse_attention_block")
    k = s.version
    assert (view.left.value, view.right.value) == (k - 1, k)
    assert "FusedAttentionBlock" in view.diff.object and "rv-sbs-insert" in view.diff.object or \
        "rv-sbs-replace" in view.diff.object
    view.left.value = 0  # the input against the selected version
    rows = side_by_side(format_graph(s.graph_at(0)), format_graph(s.graph_at(k)))
    assert view.diff.object == diff_table(rows, "input", s.version_labels[k])
    view.right.value = 0  # the same version on both sides (version 0's default): said as a choice, not a finding
    assert "Both sides show input: choose another version" in view.diff.object


def test_version_0_asks_for_a_second_version():
    s = tiny()
    view = IRView(state=s)
    s.step_to("input")
    assert (view.left.value, view.right.value) == (0, 0)
    assert "Both sides show input" in view.diff.object and "hold the same IR" not in view.diff.object


def test_model_text_in_the_diff_is_escaped():
    rows = side_by_side('%0 = param {name="a"}', '%0 = param {name="<script>alert(1)</script>\u202e"}')
    html = diff_table(rows, "<b>left</b>", "right")
    assert "<script>" not in html and "&lt;script&gt;" in html and "<b>left" not in html
    assert "\u202e" not in html  # a bidi override is shown escaped, as the CLI does
    assert not re.search(r"title='[^']*<", html)


def test_big_graphs_diff_with_a_bounded_table():
    """A diff of more rows than the table draws (`MAX_ROWS`): every change is a row, the table stops at the bound.
    1.5 x MAX_ROWS lines, not more: difflib's matching grows with the square of the lines changed apart (20,000
    lines took 22 s of CPU, 6,000 take 2 s) and the bound is reached either way."""
    n = MAX_ROWS + MAX_ROWS // 2
    lines = [f"  %{i} = add(%{i - 1}, %{i - 2}) : f32[4, 64] @layer{i // 50}" for i in range(n)]
    other = list(lines)
    for i in range(0, n, 5):
        other[i] = other[i].replace("add", "mul")
    rows = side_by_side("\n".join(lines), "\n".join(other))
    html = diff_table(rows, "a", "b")
    assert sum(r.kind == "replace" for r in rows) == len(range(0, n, 5)) and len(rows) > MAX_ROWS
    assert html.count("<tr") <= MAX_ROWS + 2 and "more row(s) not drawn" in html
