"""Two newcomer findings about the graph pane's search (graphpane.py/.js).

1. A `%id` query of a node another version of the run holds read only `no match` (the app opens on version 0; `%324`,
   an id the CLI and the Why tab use, exists only from a later version): the search note says where it is, from the
   run's versions (`absent_index`, `absent_note`; the browser's `absentNote`).
2. ernie.qdq's last version, `node_softmax_1` searched in the after pane: its layer 1 was drawn and %1871 centred, but
   the linked before pane was empty white, its view set in the after picture's coordinates (the partner's frame, or
   the old picture's layer box kept for the new picture). The before pane centres its counterpart of the node (the
   node, one it replaced, or the box holding it), in each new picture too, else it is fitted (`onBus`, `follow`).
"""

import json
import re
import shutil
import subprocess

from rlxviz.app.graphpane import _ESM, absent_index, absent_note, node_spans
from rlxviz.app.jobs import Runner
from rlxviz.app.panels import GraphCompare
from rlxviz.app.state import AppState


def _state() -> AppState:
    return AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)


def test_a_node_made_later_or_removed_is_placed_by_the_runs_versions():
    s = _state()
    versions = s.trace.versions()
    spans = node_spans(s.trace)
    assert all(a <= b for a, b in spans.values()) and set(spans) >= {n.id for _, g in versions for n in g}
    later = next(i for i, (a, _) in spans.items() if a > 0)
    gone = next(i for i, (_, b) in spans.items() if b < len(versions) - 1)
    first, last = spans[later][0], spans[gone][1]
    at0 = absent_index(s.trace, 0)
    assert at0[f"n{later}"] == f'it exists from "{versions[first][0]}" on'
    assert all(f"n{n.id}" not in at0 for n in versions[0][1])  # a node of version 0 is no absent one
    end = absent_index(s.trace, len(versions) - 1)
    assert end[f"n{gone}"] == f'it was last in "{versions[last][0]}"'
    assert absent_index(None, 0) == {}


def test_the_search_note_says_which_version_holds_an_id_it_cannot_find():
    s = _state()
    versions = s.trace.versions()
    later = next(i for i, (a, _) in node_spans(s.trace).items() if a > 0)
    label = versions[node_spans(s.trace)[later][0]][0]
    at0 = absent_index(s.trace, 0)
    assert absent_note(f" %{later} ", at0) == f'%{later} is not in this version (it exists from "{label}" on)'
    assert absent_note("%999999", at0) == ""  # no version has it: the counter's `no match` says it all
    assert absent_note("softmax", at0) == ""  # a term is no id
    # the browser shows it in the note line under the bar, beside the counter's `no match`, and reads a late index
    assert "found.textContent = 'no match'; const away = absentNote(q);" in _ESM
    assert "model.on('absent', research)" in _ESM


def test_the_browsers_note_is_the_same():
    """The ESM's `absentNote`, as written, run under node on the queries `find` hands it (trimmed, lower case)."""
    node = shutil.which("node")
    assert node, "node is needed to run the pane's script"
    s = _state()
    at0 = absent_index(s.trace, 0)
    later = next(i for i, (a, _) in node_spans(s.trace).items() if a > 0)
    queries = [f"%{later}", "%999999", "softmax", f"%{later}x", f"{later}"]
    body = re.findall(r"\n  (const absentNote = .*?\};)\n", _ESM, re.S)
    assert len(body) == 1, body
    script = (f"const model = {{ absent: {json.dumps(at0)} }};\n{body[0]}\n"
              f"console.log(JSON.stringify({json.dumps(queries)}.map((q) => absentNote(q))));")
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True, timeout=60).stdout
    assert json.loads(out) == [absent_note(q, at0) for q in queries]
    assert json.loads(out)[0].startswith(f"%{later} is not in this version (it exists from ")


def test_each_pane_is_told_where_the_ids_it_lacks_are():
    s = _state()
    pane = GraphCompare(state=s)  # version 0: the after pane alone
    later = next(i for i, (a, _) in node_spans(s.trace).items() if a > 0)
    assert pane.after.absent == absent_index(s.trace, 0) and f"n{later}" in pane.after.absent
    s.version = 3
    i = s.version_index()
    assert pane.after.absent == absent_index(s.trace, i)
    assert pane.before.absent == absent_index(s.trace, i - 1)


def _body(name: str) -> str:
    """The source of the browser's `const name = ... };` arrow function (to the next `const` at its indent)."""
    m = re.search(rf"\n  const {name} = .*?(?=\n  (?:const|let|//|window|model|search|mk)\b)", _ESM, re.S)
    assert m, name
    return m[0]


def test_a_partner_centring_a_node_this_picture_lacks_fits_it_not_its_frame():
    bus = _body("onBus")
    # the counterpart: the node, else one the partner's node replaced (`held`, sent with the centring)
    assert "lead(d)" in bus and "(d.held || [])" in _body("lead")
    assert "held: node ? held(node) : []" in _body("apply")
    # no counterpart and no hit of its own: fitted, never the partner's frame (the after picture's coordinates)
    fallback = bus.index("else if (d.node) { fit();")
    assert bus.index("if (g) centreIn(g, d);") < fallback < bus.index("tx = d.tx + offX * s")


def test_the_partners_centred_node_is_centred_again_in_the_next_picture():
    # the before pane's new picture (layer 1 drawn) arrives after the after pane centred %1871: it follows that node
    assert "else if (keep && !(h && aimed)) follow();" in _body("setSvg")  # a kept view: a new scope is fitted
    follow = _body("follow")
    assert "centreIn(at.g, d)" in follow and "else if (!at) fit();" in follow
    # a pan, a zoom or "fit" ends it, and so does another model (other ids)
    assert "led = null" in _body("moved") and "led = null" in _body("setSvg") and "led = null" in _body("rescope")
