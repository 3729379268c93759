"""A node a stage of a pass made names the stage (a newcomer run on glm.dynamo-eager).

The plain `attention` %298 read "by fuse_attention_block" on its label and "created by fuse_attention_block" in the
inspector, yet it is no FusedAttentionBlock: the chip `after fuse_attention_block: 48 △2` and the inspector's `△ gap …
rope_full_rotary` say that pass's rule refused it. Its stage `fuse_attention_block/qkv_columns` made it; a stage
records under its pass (`engine.stage`), so `Node.pass_name` holds the pass alone. The label, the tooltip and the
inspector now name the stage that added the node (`passes.made.maker`, from the trace's steps); the IR line keeps the
node's record (`[fuse_attention_block <- ...]`, the form `rlxviz ir` parses back).
"""

from __future__ import annotations

import html
import re
from functools import cache
from pathlib import Path

from rlxviz import session
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.ir import Op
from rlxviz.passes import Pipeline
from rlxviz.passes.made import maker, stage_makers
from rlxviz.passes.trace import Trace
from rlxviz.session.render import View
from rlxviz.session.render import dot as render_dot

GLM = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "glm.dynamo-eager.onnx"
STAGE = "fuse_attention_block/qkv_columns"


@cache
def _trace() -> Trace:
    return Pipeline.canonical().run(session.load(str(GLM)).graph)


def _attentions() -> list[int]:
    """The plain attentions the stage made that are still in the final graph (glm: one per layer)."""
    t = _trace()
    step = next(s for s in t.steps if s.pass_name == STAGE)
    out = [i for i in step.added if step.after[i].op == Op.ATTENTION and i in t.final]
    assert out, "qkv_columns made no attention"
    return out


def _node_svg_text(dot: str, i: int) -> tuple[str, str]:
    """(label text, tooltip) of node `i` in DOT source `dot`."""
    m = re.search(rf"^\tn{i} \[label=<(.*?)> ((?:color|fillcolor|id)=.*)$", dot, re.M)
    assert m, f"n{i} not drawn"
    label = html.unescape(re.sub(r"<[^>]*>", " ", m[1]))
    tip = re.search(r'tooltip="((?:[^"\\]|\\.)*)"', m[2])
    return label, html.unescape(tip[1] if tip else "")


def test_the_stage_is_who_made_glms_attention():
    t = _trace()
    for i in _attentions():
        n = t.final[i]
        assert n.pass_name == "fuse_attention_block"  # the node's record: the pass, as the IR line prints it
        assert maker(n, stage_makers(t)) == STAGE
    # a node its pass's own step made keeps the pass's name
    own = [n for n in t.final if n.pass_name and n.id not in stage_makers(t)]
    assert own and all(maker(n, stage_makers(t)) == n.pass_name for n in own)


def test_label_tooltip_and_inspector_name_the_stage():
    t = _trace()
    dot = render_dot(t, View(version=len(t.steps)))
    for i in _attentions():
        label, tip = _node_svg_text(dot, i)
        assert f"by {STAGE}" in label, label
        assert f"created by: {STAGE}" in tip, tip
        md = report_markdown(node_report(t.final, i, t)).replace("\\", "")
        assert f"**created by** <code>{STAGE}</code>" in md, md
        assert "[fuse_attention_block &lt;- " in md  # the IR line: the node's own record, unchanged
