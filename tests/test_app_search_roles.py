"""The search finds a node by the name messages give it in every pane that draws it (newcomer run: minilm with the
"extra user of h1" variant, the banner said "ln1 (role h1) (node 388...)"; "h1" or "ln1" typed in the after pane said
"no match" though %388 was drawn there: only the before pane tagged the candidate's roles). The after pane's
tooltips (`viz.dot`, what the browser's search reads) now list those names too (`Overlay.names`)."""

import pytest
from test_app_views import tiny

from rlxviz.app.graphpane import own_text, search_hits
from rlxviz.viz.dot import node_tooltips
from rlxviz.viz.overlay import Overlay


def _roles(tip: str) -> set[str]:
    line = next((ln for ln in tip.split("\n") if ln.startswith("roles: ")), "roles: ")
    return {r for r in line[len("roles: "):].split(", ") if r}


@pytest.mark.parametrize("variant", ["extra_h1_user", "tanh_gelu", "swapped_residual"])
def test_every_name_the_before_pane_gives_a_node_the_after_pane_gives_it_too(variant):
    s = tiny()
    s.apply_variant(variant)
    checked = 0
    for step in s.trace.steps:
        if not (step.rejections or step.matches):
            continue
        before = node_tooltips(step.before, Overlay.before(step))
        after = node_tooltips(step.after, Overlay.after(step))
        for i in before.keys() & after.keys():
            names = _roles(before[i])
            assert names <= _roles(after[i]), (step.pass_name, i, before[i], after[i])
            for name in names:  # found by its name in both panes
                assert i in search_hits(after, name) and i in search_hits(before, name), (name, i)
                checked += 1
    assert checked, variant  # each run has a candidate drawn in both panes


def test_the_extra_user_of_h1_is_found_as_ln1_and_h1_in_the_after_pane():
    s = tiny()
    s.apply_variant("extra_h1_user")
    step = next(st for st in s.trace.steps if any("ln1" in r.bindings for r in st.rejections))
    r = next(r for r in step.rejections if "ln1" in r.bindings)  # fuse_transformer_layer: h1_user_count
    node = int(r.bindings["ln1"])
    after = node_tooltips(step.after, Overlay.after(step))
    assert node in after
    assert "ln1 (role h1)" in own_text(after[node])
    for q in ("h1", "ln1", "ln1 (role h1)"):
        assert node in search_hits(after, q), (q, after[node])
    # the operand lists of other nodes are not searched: ln1's users are not hits for it
    assert all("roles: " in own_text(after[i]) for i in search_hits(after, "role h1"))
