"""The Model Explorer export borders each refused place by its standing, as the app's drawings and chips do
(newcomer report: every refusal was bordered red, a refusal the layer's kind does not expect as red as a near-miss).
Granite in float16 has two: `fuse_attention_block`'s default_scale a gap in rlxviz's ops (`△`, its ink),
`fuse_transformer_layer` not expected of a LLaMA layer (`○`, grey); the handed case 03e a near-miss (`✗`, red: its
attention scale is not 1/sqrt(d)). (Granite's float16 padding sum, `canonicalize_exported.where_bias`, was its `✗`
until the fill test took f16's own min: it is the model's own term now, `○`.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.viz import styles as st
from rlxviz.viz.model_explorer import trace_json
from rlxviz.viz.overlay import place_groups

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
CASES = Path(__file__).parent / "data" / "cases"


def _flagged(graph: dict) -> dict[str, tuple[list[str], str]]:
    """Node id -> (its `rejected_K` lines, its border colour) of the nodes a refusal is about."""
    out = {}
    for n in graph["nodes"]:
        lines = [a["value"] for a in n["attrs"] if a["key"].startswith("rejected_")]
        if lines:
            out[n["id"]] = (lines, n["style"]["borderColor"])
    return out


@pytest.mark.parametrize("path,marks", [(ZOO / "granite.fp16.onnx", {"△", "○"}),
                                        (CASES / "03e-wrong-factor.rlx", {"✗", "○"})],
                         ids=lambda x: getattr(x, "stem", ""))
def test_each_refusal_is_bordered_and_worded_by_its_standing(path, marks):
    m = session.load(str(path), 1, 8)
    trace = session.run_pipeline(m.graph, session.build_pipeline())
    data = trace_json(trace)
    by_pass = {g["id"].split(": ", 1)[1].split(" ", 1)[1]: g for g in data["graphs"][1:]}
    seen = set()
    for s in trace.steps:
        if s.pass_name not in by_pass or not s.rejections:
            continue
        groups = place_groups(trace, s)
        flagged = _flagged(by_pass[s.pass_name])
        for r in s.rejections:
            lines, border = flagged[str(r.subject if r.subject is not None else r.anchor)]
            group = groups.get((r.rule, r.anchor))
            word = "✗ near-miss" if group is None else ("△ " if group == "gap in rlxviz's ops" else "○ ") + group
            assert any(ln.startswith(f"{word}: {r.rule}: ") for ln in lines), (word, lines)
            seen.add(word[0])
            if all(ln.startswith("○") for ln in lines):
                assert border == st.NOT_NEAR_MISS_INK, (lines, border)
            elif all(ln.startswith("△") for ln in lines):
                assert border == st.OP_GAP_INK, (lines, border)
            elif any(ln.startswith("✗") for ln in lines):
                assert border == st.REJECT, (lines, border)
    assert seen == marks, seen
    if "△" in marks:
        final = _flagged(trace_json(trace, "final")["graphs"][0])
        assert {b for _, b in final.values()} >= {st.NOT_NEAR_MISS_INK, st.OP_GAP_INK}
