"""The start strip's next step follows what the run shows (issue 39's newcomer run): ② then ① said "Next: ① again,
then ②" with the layer already broken; ③ first opened the Why tab on layer 0, which fused, above a list of "not
applicable" lines, and said it "lists ... the first guard that failed"; the line sent a user with the sidebar open to
"the sidebar (☰)" (the server does not know whether it is open: the words no longer assume either)."""

import html

from test_app_views import tiny

from rlxviz.app.start import BREAK_VARIANT, StartHere


def _line(start: StartHere) -> str:
    return html.unescape(start.note.object.split(">", 1)[1])


def test_step_after_break_points_at_why_for_the_broken_layer():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    start.brk.clicks += 1
    assert s.variant == BREAK_VARIANT and start.unfused_layers() == [1]
    start.step.clicks += 1
    line = _line(start)
    # ② showed the refusing pass, so ① lands on a later version (the last: its line says ① goes back to the input;
    # issue: "① again" there wrapped to version 0 unsaid); either way the next click named is ③ on the broken layer
    # (dead_h1_user's dead probe is removed by the dead_code_elimination after the layer pass: a version of its own)
    assert line.startswith(("<b>Next: ③ to ask why layer 1 did not fuse, or ① back to the input",
                            "<b>Next: ① again, or ③ to ask why layer 1 did not fuse.")), line
    assert "then ②" not in line


def test_step_on_a_model_whose_own_layer_did_not_fuse_points_at_why():
    s = tiny()
    # chosen in the sidebar, not by ②: layer 0 stays unfused (dead_h1_user: a dead reader, a sibling fused)
    s.param.update(variant_layer=0, variant="dead_h1_user")
    start = StartHere(state=s, show_why=lambda: None)
    assert start.unfused_layers() == [0]
    start.step.clicks += 1
    assert _line(start).startswith("<b>Next: ① again, or ③ to ask why layer 0 did not fuse."), _line(start)
    start.why.clicks += 1
    assert s.selected_layer == 0 and "outcome on layer 0 and the first guard that failed" in _line(start)


def test_step_with_every_layer_fused_points_at_break():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    assert start.unfused_layers() == []
    start.step.clicks += 1
    assert _line(start).startswith("<b>Next: ① again, then ②."), _line(start)


def test_why_first_on_a_fused_layer_says_it_fused_then_break_then_why_moves_to_the_broken_one():
    s = tiny()
    opened = []
    start = StartHere(state=s, show_why=lambda: opened.append(True))
    start.why.clicks += 1
    line = _line(start)
    assert opened and s.selected_layer == 0
    assert line.startswith("<b>Layer 0 fused: nothing it expects was refused. </b>"), line
    assert "② breaks a layer" in line, line
    assert "guard that failed" not in line
    start.brk.clicks += 1
    start.why.clicks += 1  # the selection (layer 0, fused) moves to the layer ② broke
    assert s.selected_layer == 1 and "outcome on layer 1 and the first guard that failed" in _line(start)


def test_no_line_assumes_the_sidebar_is_open_or_folded():
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    lines = []
    for click in (start.why, start.step, start.brk, start.step, start.why):
        click.clicks += 1
        lines.append(_line(start))
    assert not any("☰" in line for line in lines), lines


def test_the_step_line_names_the_graph_tab_and_one_pane_at_the_input():
    """The panes the line describes are the Graph tab's (the Why tab may be open), and at version 0 there is one
    pane, the graph as read: no "before this pass" (newcomer run: ① wrapped to the input and named two panes)."""
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    start.step.clicks += 1
    assert s.version > 0 and "on the Graph tab, left, the graph before this pass" in _line(start), _line(start)
    s.version = 0
    start._say_version()
    line = _line(start)
    assert "(version 0)" in line and "one pane: the graph as read, before any pass" in line, line
    assert "before this pass" not in line and "right, after it" not in line, line
