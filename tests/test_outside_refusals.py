"""An activation read through a reshape, and refusals outside every layer: said, never silent.

deit's ORT-optimized pooler computes `tanh(reshape(x @ w + b))`. `fuse_matmul_bias_act` fused the linear and left
the tanh outside its FusedMatMulBiasAct, and nothing said so: the epilogue looked only at the bias add's own
reader (a reshape, so "no activation": quiet), and a refusal in no layer of a layered graph was on no line of
`explain` (its `outside the layers:` line names fused ops only) while the pooler's box read "fused" in green.

Decisions:
- the epilogue looks through single-reader relayouts (reshape, transpose: each relabels every element, so an
  elementwise activation commutes with them exactly) to the activation, and refuses it by name: a gap in rlxviz's
  ops (off the allow-list, or taken only as the bias add's own reader), never rewritten (the graph keeps its
  reshape and tanh, so its numbers are the file's);
- refusals anchored in no layer are judged as the whole graph's kind and said under `outside the layers:`
  (`RunVerdict.outside_gaps`, `outside_misses`, the same in `--json`), not counted (the headline counts layers);
- the box of that place says it, as a layer's box would (`styles.OP_GAP`, the gap's fill), from the version of the
  pass that refuses it on (not at that version and the final one only, `fused` between).
"""

from __future__ import annotations

import functools
import html
import json
import re
from pathlib import Path

from test_near_miss_rule import trace_of

from rlxviz.cli.entry import main
from rlxviz.ir import Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.why.verdict import RunVerdict
from rlxviz.session.render import View, dot, picture
from rlxviz.viz.layers import layer_groups
from rlxviz.viz.styles import OP_GAP, STATUS_COLORS

DEIT = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "deit.ortopt.onnx"


def _pooler(act: str, between: str, layered: bool = False, out_too: bool = False) -> str:
    """A pooler `act(MOVE(x @ w + b))` (MOVE: `reshape`, `transpose`, or none), after one layer when `layered`;
    `out_too`: the relayout is a graph output as well."""
    lay = "@encoder.layer.0.mlp" if layered else "@mlp"
    head = f"""graph pooler {{
  %0 = input {{name="hidden"}} : f32[2, 8, 64]
  %1 = param {{name="fc.weight"}} : f32[64, 64] {lay}
  %2 = matmul(%0, %1) : f32[2, 8, 64] {lay}
  %3 = param {{name="fc.bias"}} : f32[64] {lay}
  %4 = add(%2, %3) : f32[2, 8, 64] {lay}
  %5 = gelu(%4) : f32[2, 8, 64] {lay}
  %6 = narrow(%5) {{axis=1, start=0, length=1}} : f32[2, 1, 64] @pooler
  %7 = param {{name="pooler.dense.weight"}} : f32[64, 64] @pooler.dense
  %8 = matmul(%6, %7) : f32[2, 1, 64] @pooler.dense
  %9 = param {{name="pooler.dense.bias"}} : f32[64] @pooler.dense
  %10 = add(%8, %9) : f32[2, 1, 64] @pooler.dense
"""
    if between == "reshape":
        mid, t = "  %11 = reshape(%10) {shape=[2, 64]} : f32[2, 64] @pooler\n", "f32[2, 64]"
    elif between == "transpose":
        mid, t = "  %11 = transpose(%10) {perm=[1, 0, 2]} : f32[1, 2, 64] @pooler\n", "f32[1, 2, 64]"
    else:
        mid, t = "", "f32[2, 1, 64]"
    src = "%11" if mid else "%10"
    outs = f"%12, {src}" if out_too and mid else "%12"
    return head + mid + f"  %12 = {act}({src}) : {t} @pooler.activation\n  return {outs}\n}}\n"


def _explain(tmp_path: Path, text: str, *args: str, capsys) -> tuple[int, str]:
    f = tmp_path / "g.rlx"
    f.write_text(text)
    rc = main(["explain", str(f), *args])
    return rc, capsys.readouterr().out


def test_an_activation_read_through_a_relayout_is_refused_by_name(tmp_path: Path, capsys) -> None:
    for act, move in (("tanh", "reshape"), ("tanh", "transpose"), ("gelu", "reshape"), ("relu", "transpose")):
        rc, out = _explain(tmp_path, _pooler(act, move), capsys=capsys)
        line = next((x for x in out.splitlines() if "epilogue_activation" in x and "gap in rlxviz's ops" in x), "")
        assert f"feeds {act} (node 12) through {move} (node 11)" in line, (act, move, out)
        assert "only as the bias add's own reader" in line and "commutes with it: exact" in line, line
        assert rc == 0  # a gap in rlxviz's ops: nothing in the model to change


def test_the_activation_right_after_the_bias_add_keeps_its_words(tmp_path: Path, capsys) -> None:
    _, out = _explain(tmp_path, _pooler("tanh", ""), capsys=capsys)
    assert "feeds tanh (node 12); the epilogue allow-list is" in out and "through" not in out
    _, out = _explain(tmp_path, _pooler("gelu", ""), capsys=capsys)
    assert "epilogue_activation" not in out  # gelu fuses: nothing refused


def test_a_relayout_the_model_returns_is_not_looked_through(tmp_path: Path, capsys) -> None:
    """The reshape is a graph output as well: the bias add's value must stay, so no activation is its epilogue."""
    _, out = _explain(tmp_path, _pooler("tanh", "reshape", out_too=True), capsys=capsys)
    assert "through reshape" not in out


def test_nothing_is_rewritten_the_graph_keeps_its_relayout_and_activation() -> None:
    g = parse_ir(_pooler("tanh", "reshape"))
    final = Pipeline.canonical().run(g).final
    ops = [n.op for n in final]
    assert Op.RESHAPE in ops and Op.TANH in ops and ops.count(Op.FUSED_MATMUL_BIAS_ACT) == 2


def test_a_layered_graphs_refusals_outside_the_layers_are_said_not_counted(tmp_path: Path, capsys) -> None:
    rc, out = _explain(tmp_path, _pooler("tanh", "reshape", layered=True), capsys=capsys)
    lines = out.splitlines()
    at = next(k for k, x in enumerate(lines) if x.startswith("outside the layers:"))
    assert lines[at + 1].startswith("  gap in rlxviz's ops: fuse_matmul_bias_act.bias_act (epilogue_activation) @ %10")
    assert lines[0].endswith("1/1 layer(s) fused as expected") and rc == 0
    rc, out = _explain(tmp_path, _pooler("tanh", "reshape", layered=True), "--json", capsys=capsys)
    d = json.loads(out)
    assert [x.split(" @ ")[0] for x in d["outside_gaps"]] == ["fuse_matmul_bias_act.bias_act (epilogue_activation)"]
    assert d["outside_misses"] == []


@functools.cache
def _deit():
    return trace_of(DEIT)


def test_deits_pooler_tanh_is_said_in_text_and_json_alike() -> None:
    v = RunVerdict.of(_deit())
    assert len(v.outside_gaps) == 1 and "feeds tanh (node 121) through reshape (node 120)" in v.outside_gaps[0]
    text = v.render()
    assert f"  gap in rlxviz's ops: {v.outside_gaps[0]}" in text.splitlines()
    assert v.to_dict()["outside_gaps"] == v.outside_gaps


def _box(t, version: int, key: str) -> str:
    text = html.unescape(dot(t, View(version, "layers", "after")))
    return next(x for x in text.splitlines() if x.strip().startswith(f"{key} "))


def test_deits_pooler_box_is_drawn_as_the_gap_on_the_final_version() -> None:
    t = _deit()
    line = _box(t, len(t.versions()) - 1, "g_pooler")
    assert f'fillcolor="{STATUS_COLORS[OP_GAP]}"' in line, line[:300]
    assert OP_GAP in re.sub(r"<[^>]+>", " ", line)
    emb = _box(t, len(t.versions()) - 1, "g_embeddings")  # nothing refused there: still green
    assert f'fillcolor="{STATUS_COLORS["fused"]}"' in emb


def test_deits_pooler_box_says_its_gap_from_the_refusing_pass_on():
    """Newcomer finding: the pooler read `△` at the version of `fuse_matmul_bias_act` (the pane's pass refused it)
    and at the final one (the run's refusals), `fused` between: a box outside the layers says a refusal once the
    pass that refuses it has run, as a layer's box says its verdict (`settled_verdicts`), so it never flips back."""
    t = _deit()
    at = next(i for i, (name, _) in enumerate(t.versions()) if name == "after fuse_matmul_bias_act")
    said = []
    for i in range(len(t.versions())):
        g, ov, kw = picture(t, View(i, "layers", "after"))
        box = layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"), kw.get("refusals"), kw.get("outside"))
        said.append(box["g_pooler"].status)
    assert [i for i, s in enumerate(said) if s == OP_GAP] == list(range(at, len(said))), said
    # the graph that pass ran on: not yet refused there, but its pane names what the pass finds
    g, ov, kw = picture(t, View(at, "layers", "before"))
    box = layer_groups(g, ov, kw.get("verdicts"), kw.get("placed"), kw.get("refusals"), kw.get("outside"))["g_pooler"]
    assert box.status != OP_GAP and box.found_by == "fuse_matmul_bias_act" and box.found_as == OP_GAP
