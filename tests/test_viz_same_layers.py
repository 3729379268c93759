"""Identical layers marked in the layer view (issue 39: a 32-layer graph stays navigable): a layer whose ops,
shapes, wiring and verdict are those of an earlier layer says "same as layer K" on its folded box; any difference
(an attribute, a shape, a wire, the verdict) makes it a layer of its own."""

from __future__ import annotations

import re
from pathlib import Path

from clirun import case_trace

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.ir import parse_ir
from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.why.places import layer_places
from rlxviz.passes.why.policy import NOT_EXPECTED_HERE
from rlxviz.session.render import settled_verdicts
from rlxviz.viz import Verdict, layer_groups, layers_to_dot
from rlxviz.viz.layers import SAME_AS

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"


def _same(graph, verdicts=None) -> dict[int, int | None]:
    """layer index -> the layer it is marked the same as (None: first of its kind)."""
    return {int(g.layer): (None if g.same_as is None else int(g.same_as))
            for g in layer_groups(graph, verdicts=verdicts).values() if g.layer is not None}


def _layer(k: int, x: str, first: int, act: str = "tanh", axis: int = -1, width: int = 8) -> str:
    """Layer k of a toy stack: act(x) -> softmax(axis) -> add(x); node ids from `first`."""
    p = f"@encoder.layer.{k}.block"
    return (f"  %{first} = {act}({x}) : f32[2, {width}] {p}\n"
            f"  %{first + 1} = softmax(%{first}) {{axis={axis}}} : f32[2, {width}] {p}\n"
            f"  %{first + 2} = add(%{first + 1}, {x}) : f32[2, {width}] {p}\n")


def _stack(*layers: dict) -> str:
    body, x = "", "%0"
    for k, kw in enumerate(layers):
        body += _layer(k, x, 1 + 3 * k, **kw)
        x = f"%{3 + 3 * k}"
    return f'graph toy {{\n  %0 = input {{name="x"}} : f32[2, 8]\n{body}  return {x}\n}}'


def test_equal_layers_are_marked_and_any_difference_splits_them():
    assert _same(parse_ir(_stack({}, {}, {}, {}))) == {0: None, 1: 0, 2: 0, 3: 0}
    # an attribute differs in layer 2: its own kind; layer 3 is again the same as layer 0
    assert _same(parse_ir(_stack({}, {}, {"axis": 0}, {}))) == {0: None, 1: 0, 2: None, 3: 0}
    # an op differs in layer 1; layer 3 repeats layer 1's
    assert _same(parse_ir(_stack({}, {"act": "exp"}, {}, {"act": "exp"}))) == {0: None, 1: None, 2: 0, 3: 1}


def test_the_verdict_is_part_of_the_sameness():
    g = parse_ir(_stack({}, {}, {}))
    verdicts = {0: Verdict(True), 1: Verdict(False, "h1_user_count", "h1 has 3 users"), 2: Verdict(True)}
    assert _same(g, verdicts) == {0: None, 1: None, 2: 0}
    # the same guard on two refused layers: the same; another guard: not
    verdicts[2] = Verdict(False, "h1_user_count", "h1 has 3 users")
    assert _same(g, verdicts) == {0: None, 1: None, 2: 1}
    verdicts[2] = Verdict(False, "single_use", "x has 2 users")
    assert _same(g, verdicts) == {0: None, 1: None, 2: None}


def test_the_folded_box_and_the_open_layer_say_it():
    g = parse_ir(_stack({}, {}, {"axis": 0}))
    dot = layers_to_dot(g)
    box = {k: re.search(rf"^\s*layer{k} \[label=<(.*)$", dot, re.M).group(1) for k in range(3)}
    assert "same as layer 0" in box[1] and "same as" not in box[0] and "same as" not in box[2]
    assert "same as layer 0: the same ops" in re.search(r"^\s*layer1 \[.*tooltip=\"([^\"]*)", dot, re.M).group(1)
    opened = layers_to_dot(g, expanded=[1])
    assert re.search(r'label="encoder\.layer\.1[^"]*\(same as layer 0\)', opened), opened


def test_a_built_model_reads_as_one_layer_and_its_exception():
    """MiniLM (6 layers): every fused layer is the same as layer 0; with the extra-user variant on one layer, that
    layer is its own kind and the others are the same as the first fused one."""
    s = AppState(runner=Runner(background=False), preset="minilm", seq=8)
    final = s.trace.final
    assert _same(final) == {0: None, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0}
    assert _same(s.trace.input) == {0: None, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0}
    s.param.update(variant_layer=2, variant="extra_h1_user")
    assert _same(s.trace.final) == {0: None, 1: 0, 2: None, 3: 0, 4: 0, 5: 0}


def _same_at(trace, version: int) -> dict[int, int | None]:
    """`_same` of version `version` of `trace`, its boxes given the run's final verdicts as the app draws them."""
    g = trace.versions()[version][1]
    return _same(g, settled_verdicts(trace, g))


def test_the_final_verdicts_places_are_part_of_the_sameness():
    """granite's layer 1 box said "same as layer 0" at every version but the last, though its final verdict differs:
    the residual-norm refusal at 2 places (its input norm reads layer 0's residual sum) against layer 0's 1. The
    verdict's places (pattern, guard, status, why, how many) are compared, at an early version and the final one."""
    trace = case_trace(CASES / "granite.onnx")
    at = layer_places(trace)
    norm = [(p[0], p[1], p[2], p[4]) for layer in (0, 1) for p in at[layer] if p[1] == "sum_single_user"]
    assert norm == [("fuse_residual_rms_norm.residual_no_beta", "sum_single_user", NOT_EXPECTED_HERE, 1),
                    ("fuse_residual_rms_norm.residual_no_beta", "sum_single_user", NOT_EXPECTED_HERE, 2)], norm
    last = len(trace.versions()) - 1
    for version in (0, 1, last):
        assert _same_at(trace, version) == {0: None, 1: None}, version
    g = trace.versions()[1][1]
    dot = layers_to_dot(g, verdicts=settled_verdicts(trace, g))
    assert "same as" not in re.search(r"^\s*layer1 \[label=<(.*)$", dot, re.M).group(1)


def test_identical_layers_stay_the_same_with_their_verdicts():
    """MiniLM's six layers: the same ops and the same final verdict, at the input and the final version alike; the
    tooltip says what is compared (`SAME_AS`)."""
    trace = Pipeline.canonical().run(load_model("minilm", seq=8).graph)
    every = {0: None, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0}
    assert _same_at(trace, 0) == every and _same_at(trace, len(trace.versions()) - 1) == every
    dot = layers_to_dot(trace.final, verdicts=settled_verdicts(trace, trace.final))
    assert f"same as layer 0: {SAME_AS}" in re.search(r"^\s*layer1 \[.*tooltip=\"([^\"]*)", dot, re.M).group(1)


def test_a_verdict_summary_difference_splits_the_layers():
    g = parse_ir(_stack({}, {}, {}))
    one = (("fuse_x.rule", "single_use", "not expected here", "why", 1),)
    two = (("fuse_x.rule", "single_use", "not expected here", "why", 2),)
    verdicts = {0: Verdict(True, summary=((), one)), 1: Verdict(True, summary=((), two)),
                2: Verdict(True, summary=((), one))}
    assert _same(g, verdicts) == {0: None, 1: None, 2: 0}


def test_layers_counting_different_weights_are_never_the_same():
    """esm.qdyn: "encoder.layer.0: ..., 1.22K weights" and "encoder.layer.1 ... 704 weights ... same as layer 0". A
    weight both layers read counts in the first only, so the boxes' counts differ: not "the same"."""
    def stack(shared: bool) -> str:
        lines = ['  %0 = input {name="x"} : f32[2, 8]', '  %1 = param {name="w"} : f32[8]',
                 '  %2 = param {name="v"} : f32[8]']
        x = "%0"
        for k in range(2):
            w = "%1" if shared or k == 0 else "%2"
            p = f"@encoder.layer.{k}.block"
            lines += [f"  %{3 + 2 * k} = mul({x}, {w}) : f32[2, 8] {p}",
                      f"  %{4 + 2 * k} = tanh(%{3 + 2 * k}) : f32[2, 8] {p}"]
            x = f"%{4 + 2 * k}"
        return "graph toy {\n" + "\n".join(lines) + f"\n  return {x}\n}}"

    assert _same(parse_ir(stack(False))) == {0: None, 1: 0}  # one weight each: the same
    groups = {int(g.layer): g for g in layer_groups(parse_ir(stack(True))).values() if g.layer is not None}
    assert (groups[0].weights, groups[1].weights) == (8, 0)
    assert groups[1].same_as is None
