"""What the collapsed layers view's boxes say (newcomer run 22, findings 5, 7, 9, 10 and 11).

7. bert-tiny with `dead_h1_user` on layer 1, version 23 (`after fuse_residual_ln`): layer 1's box read `not fused /
   rejected: h1_user_count`, red dashed, as if settled, because the layer's nodes are already those of the final
   graph; the refusal is `fuse_transformer_layer`'s, two steps later, and the pane to its left said `final: not
   fused`. A box before the pass that refuses its layer (`why_step`) says `final: ...`, as at every earlier version.
5. deit.ortopt's final norm had a box only from version 23 on (`placement.placed`).
9. a box outside the layers said nothing of what the pane's pass refused there (minilm's embeddings, `○1`).
10. a settled box dropped the CLI's `rewritten as:` ops (bart-full's decoder layers, gptj, gpt-neox).
11. a stub of the Why drawing said its node's path (`encoder`), not the CLI's place (`embeddings`).
"""

from __future__ import annotations

import functools
import html
import re
from collections import Counter
from pathlib import Path

from clirun import case_trace

from rlxviz.models import load_model
from rlxviz.passes import Pipeline, Trace
from rlxviz.passes.placement import outside_box, placed
from rlxviz.passes.trace import Layer, layer_label, layer_of
from rlxviz.passes.why.verdict import RunVerdict, why_step
from rlxviz.session.render import View, dot
from rlxviz.session.variants import variant_named

FIX = Path(__file__).parent / "fixtures" / "onnx"
STUB = r'^\s*s(\d+) \[label="… %\d+ \w+\n([^"\n]*)'
"""A stub's DOT line: (its node id, the place its second line says)."""


@functools.cache
def _case(name: str) -> Trace:
    return case_trace(FIX / name)


@functools.cache
def _dead_user() -> Trace:
    """bert-tiny with a dead third reader of h1 in layer 1 (the app's ② demo)."""
    return Pipeline.canonical().run(load_model("bert-tiny", 1, 16, variant=variant_named("dead_h1_user", 1)).graph)


@functools.cache
def _preset(name: str) -> Trace:
    return Pipeline.canonical().run(load_model(name, 1, 8).graph)


def _label(source: str, key: str) -> str:
    """The text of box `key`'s label in a layers-view DOT source, markup dropped."""
    label = re.search(rf"^\s*{key} \[label=<(.*?)>\s+(?:color|fillcolor|id)=", source, re.M).group(1)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", label)).split())


def _version(t: Trace, name: str) -> int:
    return next(i for i, (n, _) in enumerate(t.versions()) if n == f"after {name}")


def test_dead_user_layer_says_final_before_the_pass_that_refuses_it():
    t = _dead_user()
    v = _version(t, "fuse_residual_ln")
    label = _label(dot(t, View(v, "layers")), "layer1")
    assert label.count("final: not fused") == 1 and "at this version:" in label, label
    left = _label(dot(t, View(v, "layers", "before")), "layer1")
    assert "final: not fused" in left, left
    # the refusing pass's own after pane, and every later one, says the verdict settled
    for k in range(_version(t, "fuse_transformer_layer"), len(t.versions())):
        label = _label(dot(t, View(k, "layers")), "layer1")
        assert label.startswith("encoder.layer.1") and "final:" not in label and "rejected: h1_user_count" in label


def test_no_box_says_its_verdict_settled_before_the_pass_that_refused_it():
    """On every model of the kind (a near-miss, a gap in rlxviz's ops; one stack or two): at each version before the
    step `why_step` names, the layer's box says `final:`."""
    cases = {"dead_user": _dead_user(), "llama-block": _preset("llama-block"), "t5": _case("zoo/t5.encdec.onnx"),
             "deit": _case("cases/deit.ortopt.onnx"), "bart": _case("cases/bart-full.onnx")}
    seen = 0
    for name, t in cases.items():
        drawn = {i: dot(t, View(i, "layers")) for i in range(len(t.versions()))
                 if i == 0 or t.steps[i - 1].changed}
        for key in sorted(set(re.findall(r"^\s*(layer\w*) \[label=<", drawn[0], re.M))):
            m = re.fullmatch(r"layer(\d+)|layer_(.+)_(\d+)", key)
            layer = int(m.group(1)) if m.group(1) is not None else _layer(t, m.group(2), int(m.group(3)))
            k = why_step(t, layer)
            if k is None:
                continue
            for i, source in drawn.items():
                if i <= k and re.search(rf"^\s*{key} \[label=<", source, re.M):
                    assert "final: " in _label(source, key), (name, key, i, _label(source, key))
                    seen += 1
    assert seen > 20


def _layer(t: Trace, stack: str, index: int) -> Layer:
    """The `Layer` of `t`'s input with that stack and index."""
    return next(k for n in t.input if (k := layer_of(n.path)) is not None and k.stack == stack and int(k) == index)


def test_the_final_norm_has_its_box_at_every_version():
    """5. deit.ortopt: ONNX Runtime named the final `layer_norm` `layers.1.mlp.fc2`, so before `fuse_residual_ln` it
    was counted in `layers.1` (`layer_norm×3`) and a `final norm` box appeared only at version 23. The norm a placed
    residual norm took in sits where it sits at every version (`placement.placed`), on every model with one."""
    for name in ("cases/deit.ortopt.onnx", "cases/esm.qdyn.onnx", "cases/granite.onnx",
                 "cases/gpt-neox.legacy-sdpa.onnx", "zoo/t5.encdec.onnx"):
        t = _case(name)
        for i in range(len(t.versions())):
            if i and not t.steps[i - 1].changed:
                continue
            source = dot(t, View(i, "layers"))
            assert re.search(r"^\s*g_final_norm \[label=<", source, re.M), (name, i)
            if "deit" in name:
                assert "layer_norm×3" not in _label(source, "layer1"), (i, _label(source, "layer1"))
                norm = _label(source, "g_final_norm")
                assert norm.startswith("final norm 1 op(s)"), (i, norm)


def test_a_box_outside_the_layers_says_what_the_panes_pass_found_there():
    """9. minilm, version 23 (`after fuse_residual_ln`): the caption and chip say `○1` (the embeddings' norm, its
    sum no residual), but no box said it: a layer's box says what the pane's pass found there, a box outside the
    layers said nothing. Both panes of that pass now say it on the embeddings box, named by the pass, as a layer's
    box would; the input graph (the run's refusals, not its own) says none."""
    t = _preset("minilm")
    v = _version(t, "fuse_residual_ln")
    for side in ("before", "after"):
        label = _label(dot(t, View(v, "layers", side)), "g_embeddings")
        assert label.endswith("fuse_residual_ln: ○ not near-miss: residual_same_shape"), (side, label)
    assert "fuse_residual_ln" not in _label(dot(t, View(0, "layers")), "g_embeddings")
    # deit's pooler: the gap said once, named by its pass (it read `△ gap in rlxviz's ops:` and no gap)
    t = _case("cases/deit.ortopt.onnx")
    label = _label(dot(t, View(_version(t, "fuse_matmul_bias_act"), "layers")), "g_pooler")
    assert label.count("△") == 1 and label.endswith("fuse_matmul_bias_act: △ gap in rlxviz's ops: epilogue_activation")


def test_every_refusal_outside_the_layers_is_said_by_a_box():
    """Each pane of a pass that refused a place outside the layers names the pass on a box outside them."""
    seen = 0
    for t in (_preset("minilm"), _dead_user(), _case("cases/deit.ortopt.onnx"), _case("cases/bart-full.onnx"),
              _case("cases/roberta.onnx"), _case("zoo/t5.encdec.onnx")):
        for i in range(1, len(t.versions())):
            step = t.steps[i - 1]
            if not step.changed or not any(r.layer is None for r in step.rejections):
                continue
            for side in ("before", "after"):
                source = dot(t, View(i, "layers", side))
                boxes = re.findall(r"^\s*(g_\w+) \[label=<", source, re.M)
                assert any(f"{step.pass_name}: " in _label(source, b) for b in boxes), (t.input.name, i, side)
                seen += 1
    assert seen >= 6


def _rewritten_ops(label: str) -> Counter:
    """op -> count of a box label's settled `rewritten as ...` words (Counter() when it has none)."""
    m = re.search(r"rewritten as ((?:[\w]+(?:×\d+)?(?:, )?)+)", label)
    if m is None:
        return Counter()
    items = [x.split("×") for x in m.group(1).split(", ") if x]
    return Counter({x[0]: int(x[1]) if len(x) > 1 else 1 for x in items})


def test_a_final_box_says_what_the_cli_says_was_rewritten():
    """10. bart-full's decoder layer 0 at the final version said its fused ops and dropped the CLI's `rewritten as:
    attention %312` (the cross-attention left unfused), which earlier versions' boxes said; gptj and gpt-neox alike.
    At the final version each layer box names the plain ops the verdict lists as rewritten (`LayerVerdict.rewritten`),
    as many of each."""
    seen = 0
    for name in ("cases/bart-full.onnx", "zoo/gptj.dynamo-eager.onnx", "cases/gpt-neox.legacy-sdpa.onnx",
                 "zoo/t5.encdec.onnx", "cases/granite.onnx", "cases/deit.ortopt.onnx"):
        t = _case(name)
        source = dot(t, View(len(t.versions()) - 1, "layers"))
        stacked = len({k.stack for n in t.input if (k := layer_of(n.path)) is not None}) > 1
        for lv in RunVerdict.of(t).layers:
            key = f"layer_{lv.layer.stack}_{int(lv.layer)}" if stacked else f"layer{int(lv.layer)}"
            label = _label(source, key)
            want = Counter(item.split(" %", 1)[0] for item in lv.rewritten)
            assert "final:" not in label and _rewritten_ops(label) == want, (name, key, label, lv.rewritten)
            seen += bool(want)
    assert seen >= 8
    t = _case("cases/bart-full.onnx")
    label = _label(dot(t, View(len(t.versions()) - 1, "layers")), "layer_decoder_0")
    assert "FusedMatMulBiasAct×4 rewritten as attention" in label, label


def test_a_stub_names_the_place_the_cli_says():
    """11. bart-full's Why drawing of encoder layer 0 drew its stub of the encoder's embeddings norm as `… %376
    FusedResidualLN / encoder` (its path) where `explain` says `outside the layers: ... embeddings: FusedResidualLN
    %376`; the decoder's narrows read `decoder.layers`, boxed in `decoder`. A stub of a node outside the layers says
    its place (`placement.outside_box`), one placed in a layer its path does not name says that layer."""
    t = _case("cases/bart-full.onnx")
    why = dot(t, View(len(t.versions()) - 1, "full", "why", focus=_layer(t, "encoder", 0)))
    stubs = dict(re.findall(STUB, why, re.M))
    assert stubs["376"] == "embeddings", stubs
    seen = 0
    for name in ("cases/bart-full.onnx", "cases/deit.ortopt.onnx", "cases/esm.qdyn.onnx", "zoo/t5.encdec.onnx",
                 "cases/gpt-neox.legacy-sdpa.onnx"):
        t = _case(name)
        where = placed(t)
        for layer in sorted({k for n in t.input if (k := layer_of(n.path)) is not None}, key=repr):
            for side, v in (("why", len(t.versions()) - 1), ("after", len(t.versions()) - 1), ("before", 20)):
                source = dot(t, View(v, "full", side, focus=layer))
                for j, place in re.findall(STUB, source, re.M):
                    at = where.get(int(j))
                    path = next(g[int(j)].path for _, g in t.versions() if int(j) in g)
                    if isinstance(at, str) or (at is None and layer_of(path) is None):
                        assert place == outside_box(t, int(j)), (name, layer, side, j, place)
                        seen += 1
                    elif at is not None and at != layer_of(path):
                        assert place == layer_label(at), (name, layer, side, j, place)
    assert seen >= 10
