"""The Model Explorer export marks every node the app's drawing marks, with its words, and lists each rewrite's
absorbed ids on the node that holds them (newcomer run 18).

gpt-neox's attention place (`fuse_attention_block`) is a gap (`rope_full_rotary`, partial rotary): the app marked
both ropes it names, q_rope and k_rope, and the NaN guard's isnan and where behind its follower `attn_single_user`
(`△ fix of rope_full_rotary alone is not enough: ...`); the export marked the anchor and subject alone, leaving k_rope
and the NaN guard bare. And every node `fuse_attention_block.qkv_columns` made (the packed projection, its narrows
and ropes) carried the whole match's absorbed list, as if a rope had absorbed the Q/K/V matmuls. Decision: one
reading of which nodes a refusal marks (`viz.overlay.marked_nodes`, the drawing's and the export's) and of what
each node replaced itself (`passes.made.replaced`, the labels' and the search index's); a node made beside the
product says so
(`made`, `passes.made.Beside.words`). esm.qdyn's one refusal at its attention runs into two gaps: the export's line
names both, as the drawing's `△` label does.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from test_near_miss_rule import trace_of

from rlxviz.app.graphpane import absorbed_index
from rlxviz.passes import Trace
from rlxviz.passes.made import made_in_run, made_words, replaced
from rlxviz.passes.trace import whose_place
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.viz import Overlay
from rlxviz.viz.dot import _MADE, DotOptions, _Drawer
from rlxviz.viz.model_explorer import trace_json
from rlxviz.viz.overlay import all_versions, follower_note, is_gap

FIX = Path(__file__).parent / "fixtures" / "onnx"
NEOX, QDYN, GRANITE = (FIX / "cases" / f"{n}.onnx" for n in ("gpt-neox.legacy-sdpa", "esm.qdyn", "granite"))
GPTJ, PHI, ESM = (FIX / "zoo" / f"{n}.dynamo-eager.onnx" for n in ("gptj", "phi", "esm"))
MODELS = [NEOX, GPTJ, PHI, QDYN, ESM, GRANITE]


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


@functools.cache
def _export(path: Path, versions: str = "all") -> dict:
    return trace_json(_trace(path), versions)


def _attrs(node: dict) -> dict:
    return {a["key"]: a["value"] for a in node["attrs"]}


def _lines(graph: dict) -> dict[int, list[str]]:
    """Node id -> its `rejected_K` lines, for the nodes of an exported graph that carry any."""
    out = {}
    for n in graph["nodes"]:
        lines = [v for k, v in _attrs(n).items() if k.startswith("rejected_")]
        if lines:
            out[int(n["id"])] = lines
    return out


def _versions(path: Path) -> list[tuple[int, dict]]:
    """(step index, exported graph) of each exported version whose pass refused something."""
    t = _trace(path)
    by_name = {g["id"].rsplit(": ", 1)[1]: g for g in _export(path)["graphs"]}
    return [(k, by_name[f"{k + 1} {s.pass_name}"]) for k, s in enumerate(t.steps) if s.rejections]


def _app_marks(t: Trace, k: int) -> tuple[Overlay, dict[int, list[str]]]:
    """The before pane's overlay of step `k` and the node marks its drawing makes (node id -> its note lines)."""
    s = t.steps[k]
    ov = Overlay.before(s).worded_by(t, s)
    drawer = _Drawer(s.before, ov, DotOptions(max_nodes=10**6), None)
    return ov, {i: [x for x, ink in notes if ink != _MADE] for i, notes in drawer.notes.items()
                if any(ink != _MADE for _, ink in notes)}


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_the_export_marks_the_nodes_the_app_marks(path):
    t = _trace(path)
    versions = _versions(path)
    assert versions
    for k, graph in versions:
        _, app = _app_marks(t, k)
        ids = {int(n["id"]) for n in graph["nodes"]}
        assert set(_lines(graph)) == set(app) & ids, (graph["id"], sorted(_lines(graph)), sorted(app))


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_the_final_export_marks_the_nodes_the_runs_drawing_marks(path):
    t = _trace(path)
    drawer = _Drawer(t.final, Overlay.trace_summary(t), DotOptions(max_nodes=10**6), None)
    app = {i for i, notes in drawer.notes.items() if any(ink != _MADE for _, ink in notes)}
    got = set(_lines(_export(path, "final")["graphs"][0]))
    assert got and got == app & {n.id for n in t.final}, (sorted(got), sorted(app))


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_the_exports_gap_words_are_the_drawings(path):
    t = _trace(path)
    seen = 0
    for k, graph in _versions(path):
        ov, _ = _app_marks(t, k)
        nodes = {int(n["id"]): n for n in graph["nodes"]}
        for i, lines in _lines(graph).items():
            for r in ov.rejections:
                place, mine = (r.rule, r.anchor), f": {r.rule}: {r.guard} ({r.stage}): {r.message}"
                line = next((x for x in lines if x.endswith(mine)), None)
                if line is None or not is_gap(ov.standings.get(place, "")):
                    continue
                whose = whose_place(r.layer, nodes[i]["namespace"].replace("/", "."))
                caveat = ov.followers.get((*place, r.guard))
                if caveat is not None:
                    first, said = follower_note(ov.gap_names.get(place, ()), r.guard, r.kind, caveat)
                    word = f"△ {first}{whose} {said}"
                else:
                    word = f"△ {ov.standing_words(place)}{whose}"
                assert line == word + mine, (graph["id"], i, line[:200], word)
                seen += 1
    assert seen


def test_neox_k_rope_and_the_nan_guard_are_marked():
    graph = dict(_versions(NEOX))[next(k for k, s in enumerate(_trace(NEOX).steps)
                                      if s.pass_name == "fuse_attention_block")]
    lines = _lines(graph)
    for rope in (233, 235, 245, 247):
        assert any(x.startswith("△ gap in rlxviz's ops: fuse_attention_block.qkv_attention_out: rope_full_rotary")
                   for x in lines[rope]), lines.get(rope)
    for guard in (169, 170, 174, 175):
        assert any(x.startswith("△ fix of rope_full_rotary alone is not enough: attn_single_user (illegal) fails "
                                "next: ") for x in lines[guard]), lines.get(guard)
    borders = {n["id"]: n.get("style", {}).get("borderColor") for n in graph["nodes"]}
    assert borders["235"] and borders["169"] and borders["170"]


def test_esm_qdyns_refusal_names_both_gaps():
    graphs = [*_export(QDYN)["graphs"], *_export(QDYN, "final")["graphs"]]
    lines = [x for g in graphs for v in _lines(g).values() for x in v
             if ": fuse_attention_block.qkv_attention_out: default_scale (" in x]
    assert lines
    for x in lines:
        assert x.startswith("△ 2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), "
                            "default_scale: "), x
    # beside each line, the forms it lacks as the text's `rlxviz's ops lack:` lines name them (the verdict's gaps)
    lacks = {lv.layer: "; ".join(map(str, lv.gaps)) for lv in RunVerdict.of(_trace(QDYN)).layers}
    assert len(lacks) == 2 and all(x.count("FusedAttentionBlock") == 2 for x in lacks.values()), lacks
    said = [(n["namespace"], a[f"gaps_{k[9:]}"]) for g in graphs for n in g["nodes"] for a in [_attrs(n)]
            for k, v in a.items() if k.startswith("rejected_") and "qkv_attention_out: default_scale (" in v]
    assert said and all(lacks[int(ns.split("/")[2])] == x for ns, x in said), said


@pytest.mark.parametrize("versions", ["all", "final"])
@pytest.mark.parametrize("path", [NEOX, GPTJ, QDYN], ids=lambda p: p.stem)
def test_each_absorbed_list_is_on_the_node_that_holds_it(path, versions):
    t = _trace(path)
    made, every = made_in_run(t), all_versions(t)
    checked = 0
    for eg in _export(path, versions)["graphs"]:
        k = eg["id"].rsplit(": ", 1)[1]
        g = t.final if k == "final" else t.versions()[int(k.split(" ", 1)[0])][1]
        index = absorbed_index(g, t)
        for n in eg["nodes"]:
            a, node = _attrs(n), g[int(n["id"])]
            if f"n{node.id}" in index:
                own = replaced(node, g, made, every)
                assert a["absorbed"]["nodeIds"] == [str(i) for i in own], (eg["id"], node.id)
                checked += 1
            else:
                assert "absorbed" not in a, (eg["id"], node.id, node.op.value, a.get("absorbed"))
                if node.absorbed and node.id in made:
                    assert a["made"] == made_words(node.id, g, made, every)  # where a gone product went
                assert not replaced(node, g, made, every), (eg["id"], node.id)
    assert checked
