"""One rule decides what is a near-miss (`policy.excuse`, per refusal `verdict.standing`), and the version chips,
`explain`'s text, `--json` and the verdict all read it; the chips count places (a rule's candidate at its anchor),
never failing guards.

A newcomer run found the chips disagreeing with the verdict: deit.ortopt and granite showed `✗2`, `✗7`, `✗3` on runs
whose every layer fused as expected and whose every refusal `explain` called "not expected here" (the model's own
pre-norm layout); granite's `fuse_sdpa` chip showed no `○` for the two places that keep the model's own mask term;
the DeepNorm case showed `✗4` for one rejected layer (its four failing guards); and falcon, whose Q/K/V is already one
matmul, was called NOT fused (exit 1) for the one merge left, QKV with the parallel MLP's FC1, which the tool's own
cost test refuses because it would cost FC1's GELU epilogue (`merge_keeps_fusions`, remedy `guard.DOES_NOT_PAY`).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from costwords import cost_reason

from rlxviz.app.derived import not_near_misses, refusals, step_places
from rlxviz.app.jobs import Runner
from rlxviz.app.panels import NOT_NEAR_MISS_MARK, VersionStepper
from rlxviz.app.state import AppState
from rlxviz.passes import Trace
from rlxviz.passes.guard import DOES_NOT_PAY, MODEL_TERM, NOT_PROFITABLE, near_miss_kind
from rlxviz.passes.pattern import describe
from rlxviz.passes.report import in_context
from rlxviz.passes.trace import place_label
from rlxviz.passes.why.places import places
from rlxviz.passes.why.policy import NOT_EXPECTED_HERE, NOT_EXPECTED_WHY
from rlxviz.passes.why.standing import standing
from rlxviz.passes.why.verdict import OP_GAP_GROUP, RunVerdict
from rlxviz.session import OpenRequest, open_model, open_pipeline, open_trace

FIX = Path(__file__).parent / "fixtures" / "onnx"
DATA = Path(__file__).parent / "data" / "cases"
DEEPNORM = DATA / "n4-06-deepnorm-residual.rlx"

PRE_NORM_EXPORTS = ["cases/deit.ortopt.onnx", "cases/granite.onnx", "zoo/deit.dynamo-eager.onnx",
                    "zoo/granite.dynamo-eager.onnx", "zoo/llama.dynamo-eager.onnx", "zoo/deit.fp16.onnx"]
FALCON_EXPORTS = ["cases/falcon.onnx", "zoo/falcon.dynamo-eager.onnx", "zoo/falcon.dynamo-sdpa.onnx",
                  "ortopt/falcon.ortopt.onnx"]


@functools.cache
def shared_trace(source: Path) -> Trace:
    """`trace_of(source)`, made once per test process: for tests that only read the trace."""
    return trace_of(source)


def step_index(trace: Trace, pass_name: str) -> int:
    """The index in `trace.steps` of the first step of `pass_name` (what `View` and `picture` take)."""
    return next(k for k, s in enumerate(trace.steps) if s.pass_name == pass_name)


def trace_of(source: str | Path) -> Trace:
    """The canonical run of a file (an ONNX export or IR text), as the CLI and the app open it."""
    req = OpenRequest(source=str(source))
    pipe = open_pipeline(req)
    return open_trace(open_model(req).graph, req, pipe)


def hard_places_of_near_miss_kind(trace: Trace) -> set[tuple[str, int]]:
    """(rule, anchor) of every hard refusal whose kind alone is a near-miss kind: what the chips counted before."""
    return {(r.rule, r.anchor) for r in trace.rejections if not r.soft and r.near_miss}


def app(**kw: object) -> AppState:
    kw.setdefault("seq", 8)
    return AppState(runner=Runner(background=False), **kw)


def chips(s: AppState) -> dict[str, str]:
    """Version label -> the HTML of its chip."""
    out = {}
    for c in VersionStepper(state=s)._counts().split("<span class='rv-chip'")[1:]:
        out[re.search(r"title='([^']*)'>", c).group(1).split(" (", 1)[0]] = c
    return out


def deepnorm_layers(n: int) -> str:
    """The DeepNorm case (`n4-06`, one post-LN layer `LN(2x + f(x))` on both residuals) stacked `n` times: layer k
    reads layer k-1's output; every layer is refused by FusedTransformerLayer at several guards of one candidate."""
    text = DEEPNORM.read_text()
    body = [ln for ln in text.splitlines() if re.match(r"\s*%\d+ = ", ln)]
    layer = [ln for ln in body if int(re.match(r"\s*%(\d+)", ln).group(1)) >= 2]  # %0, %1: the inputs
    out = [ln for ln in body if int(re.match(r"\s*%(\d+)", ln).group(1)) < 2]
    last = 59
    for k in range(n):
        off = k * 58

        def ref(m: re.Match[str], off: int = off, prev: int = last) -> str:
            i = int(m.group(1))
            return f"%{prev}" if i == 0 and off else ("%1" if i == 1 else f"%{i + off}")
        for ln in layer:
            ln = re.sub(r"%(\d+)", ref, ln).replace("encoder.layer.0", f"encoder.layer.{k}")
            ln = ln.replace('name="', f'name="l{k}.')
            out.append(ln)
        last = 59 + off
    return "graph deepnorm_stack {\n" + "\n".join(out) + f"\n  return %{last}\n}}\n"


def parallel_packed(layers: int, paths: bool = True) -> str:
    """A falcon-like parallel block: `x + attn(ln(x)) + mlp(ln(x))` whose Q/K/V is ONE matmul `[64, 192]` (+ bias)
    narrowed into Q, K and V, and whose FC1 (+ bias + GELU) reads the same LayerNorm output, stacked `layers` times
    (paths `h.K...` when `paths`). The only shared-input merge left is QKV with FC1, which costs FC1's epilogue."""
    lines = ["  %0 = input {name=\"hidden\"} : f32[2, 8, 64]", "  %1 = input {name=\"attention_mask\"} : i64[2, 8]",
             "  %2 = cast(%1) {dtype=\"f32\"} : f32[2, 8]", "  %3 = const {value=1.0} : f32[]",
             "  %4 = sub(%3, %2) : f32[2, 8]", "  %5 = const {value=-3.4028234663852886e+38} : f32[]",
             "  %6 = mul(%4, %5) : f32[2, 8]", "  %7 = reshape(%6) {shape=[2, 1, 1, 8]} : f32[2, 1, 1, 8]"]
    x, n = 0, 8
    for k in range(layers):
        at = f" @h.{k}" if paths else ""
        ids: dict[str, int] = {}

        def node(name: str, text: str, ids: dict[str, int] = ids, x: int = x, at: str = at) -> None:
            nonlocal n
            ids[name] = n
            lines.append(f"  %{n} = {text.format(**{key: f'%{v}' for key, v in ids.items()}, x=f'%{x}')}{at}")
            n += 1
        node("lnw", f"param {{{{name=\"h.{k}.ln.weight\"}}}} : f32[64]")
        node("lnb", f"param {{{{name=\"h.{k}.ln.bias\"}}}} : f32[64]")
        node("ln", "layer_norm({x}, {lnw}, {lnb}) {{eps=1e-05, axis=-1}} : f32[2, 8, 64]")
        node("qkvw", f"param {{{{name=\"h.{k}.query_key_value.weight\"}}}} : f32[64, 192]")
        node("qkvb", f"param {{{{name=\"h.{k}.query_key_value.bias\"}}}} : f32[192]")
        node("qkvm", "matmul({ln}, {qkvw}) : f32[2, 8, 192]")
        node("qkv", "add({qkvm}, {qkvb}) : f32[2, 8, 192]")
        for j, h in enumerate("qkv"):
            node(f"{h}n", f"narrow({{qkv}}) {{{{axis=-1, start={64 * j}, length=64}}}} : f32[2, 8, 64]")
            node(f"{h}r", f"reshape({{{h}n}}) {{{{shape=[2, 8, 4, 16]}}}} : f32[2, 8, 4, 16]")
            node(f"{h}t", f"transpose({{{h}r}}) {{{{perm=[0, 2, 1, 3]}}}} : f32[2, 4, 8, 16]")
        node("kT", "transpose({kt}) {{perm=[0, 1, 3, 2]}} : f32[2, 4, 16, 8]")
        node("s", "matmul({qt}, {kT}) : f32[2, 4, 8, 8]")
        node("c", "const {{value=4.0}} : f32[]")
        node("sd", "div({s}, {c}) : f32[2, 4, 8, 8]")
        node("sm", "add({sd}, %7) : f32[2, 4, 8, 8]")
        node("p", "softmax({sm}) {{axis=-1}} : f32[2, 4, 8, 8]")
        node("o", "matmul({p}, {vt}) : f32[2, 4, 8, 16]")
        node("ot", "transpose({o}) {{perm=[0, 2, 1, 3]}} : f32[2, 8, 4, 16]")
        node("or", "reshape({ot}) {{shape=[2, 8, 64]}} : f32[2, 8, 64]")
        node("dw", f"param {{{{name=\"h.{k}.dense.weight\"}}}} : f32[64, 64]")
        node("dm", "matmul({or}, {dw}) : f32[2, 8, 64]")
        node("f1w", f"param {{{{name=\"h.{k}.fc1.weight\"}}}} : f32[64, 256]")
        node("f1b", f"param {{{{name=\"h.{k}.fc1.bias\"}}}} : f32[256]")
        node("f1m", "matmul({ln}, {f1w}) : f32[2, 8, 256]")
        node("f1", "add({f1m}, {f1b}) : f32[2, 8, 256]")
        node("g", "gelu({f1}) : f32[2, 8, 256]")
        node("f2w", f"param {{{{name=\"h.{k}.fc2.weight\"}}}} : f32[256, 64]")
        node("f2", "matmul({g}, {f2w}) : f32[2, 8, 64]")
        node("sum", "add({dm}, {f2}) : f32[2, 8, 64]")
        node("out", "add({sum}, {x}) : f32[2, 8, 64]")
        x = ids["out"]
    return "graph parallel_packed {\n" + "\n".join(lines) + f"\n  return %{x}\n}}\n"


# -- 1: a refusal the verdict excuses is no ✗ -------------------------------------------------------------------


@pytest.mark.parametrize("name", PRE_NORM_EXPORTS)
def test_pre_norm_exports_show_no_near_miss_where_every_layer_fused(name):
    """On a pre-norm export whose every layer fused as expected, no pass's chip counts a ✗: each refusal that the
    refusal's kind alone would have counted (FusedAttentionBlock, FusedTransformerLayer, the residual norm on the
    pre-norm sum) is a `○` place with the verdict's reason, or a `△` place at a gap in rlxviz's ops (the layers held
    back only by those are counted apart from "fused as expected", still ok)."""
    t = trace_of(FIX / name)
    v = RunVerdict.of(t)
    assert v.ok and v.fused_layers + v.gap_layers == len(v.layers), v.render()
    assert not [s.pass_name for s in t.steps if refusals(s, t)]
    old = hard_places_of_near_miss_kind(t)
    assert old, "the export no longer has a refusal the kind alone counts: the test checks nothing"
    for s in t.steps:
        mine = {(r.rule, r.anchor) for r in s.rejections if not r.soft} & old
        excused = step_places(s, t).excused  # the faded ○ (`not_near_misses`) and the gaps' △
        assert sum(len(x) for x in excused.values()) >= len(mine), (s.pass_name, excused)
        for rule, _anchor in mine:
            items = excused.get(NOT_EXPECTED_HERE, []) + excused.get(OP_GAP_GROUP, [])
            assert any(f": {rule} (" in i for i in items), (rule, excused)  # the reason names the rule


@pytest.mark.parametrize("name", ["cases/deit.ortopt.onnx", "cases/granite.onnx"])
def test_each_excused_place_says_why_as_explain_does(name):
    """The chip's `○` reason for a place not expected of its layer is worded as the line `explain` prints under that
    layer: the same rule and guard, the same why, and the place's anchor among the places the line names (`explain`
    prints one line per pattern and guard naming every place, the chip each place, named once by its node and path
    as `near_miss_item` names it, so the guard's own reason, which names the place's nodes, may differ)."""
    t = trace_of(FIX / name)
    v = RunVerdict.of(t)

    # a not-expected line's why follows "why it is not expected here"; a gap's line says the form rlxviz lacks and
    # its compiler fix, with no "why not expected" (issue 39), under its own heading and in its own list
    seps = {NOT_EXPECTED_HERE: f"; {NOT_EXPECTED_WHY}: ", OP_GAP_GROUP: "; rlxviz has no "}

    def head_and_why(line: str, sep: str) -> tuple[str, str, str]:
        """(RULE (GUARD), the places it names, why)."""
        head = line.split(": ", 1)[0]
        rule_guard = head.split(" @ ", 1)[0].split(" at ", 1)[0]
        return rule_guard, head.removeprefix(rule_guard), line.rsplit(sep, 1)[-1]

    said = {NOT_EXPECTED_HERE: [head_and_why(x, seps[NOT_EXPECTED_HERE]) for lv in v.layers for x in lv.not_expected],
            OP_GAP_GROUP: [head_and_why(x, seps[OP_GAP_GROUP])
                           for x in [*(y for lv in v.layers for y in lv.gap_refusals), *v.outside_gaps]]}
    for s in t.steps:
        p = step_places(s, t)  # the chip's ○ and, at a gap in rlxviz's ops, its △
        for g in (NOT_EXPECTED_HERE, OP_GAP_GROUP):
            for item, anchor in zip(p.excused.get(g, []), p.excused_at.get(g, []), strict=True):
                line = item.split(": ", 1)[1]
                rule_guard, at, why = head_and_why(line, seps[g])
                assert at == "" and item.startswith(f"%{anchor} ("), item  # its place, `%ANCHOR (PATH)`, named once
                assert seps[g] in line and (g == NOT_EXPECTED_HERE) == (NOT_EXPECTED_WHY in line), item
                assert any((rg, w) == (rule_guard, why) and f"%{anchor} (" in places for rg, places, w in said[g]), item


def test_granites_kept_mask_terms_are_marked_on_the_sdpa_chip():
    """Granite: `explain` lists 2 places that keep the model's own terms (fuse_sdpa's where-mask, soft); the chip of
    fuse_sdpa now marks them `○2` with that heading, no ✗."""
    t = trace_of(FIX / "cases/granite.onnx")
    s = next(s for s in t.steps if s.pass_name == "fuse_sdpa")
    v = RunVerdict.of(t)
    assert len(v.left_out_groups[MODEL_TERM]) == 2
    assert not refusals(s, t)
    assert len(not_near_misses(s, t)[MODEL_TERM]) == 2


# -- 2: count places, never guards ------------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_a_layer_refused_at_several_guards_is_one_place(layers):
    """DeepNorm layers (FusedTransformerLayer refused at 4 guards of one candidate each): the chip counts one place
    per refused layer, and the layers it counts are the layers the verdict holds back. No change to the model keeps
    alpha's numbers and the compiler fix is a residual scale on the layer op: a gap in rlxviz's ops (`△`, no `✗`)."""
    s = app(source="ir", ir_text=deepnorm_layers(layers))
    step = next(st for st in s.trace.steps if st.pass_name == "fuse_transformer_layer")
    guards = [r for r in step.rejections if not r.soft]
    assert len(guards) >= 2 * layers  # several failing guards per candidate
    row = next(r for r in s.version_rows() if r["version"] == "after fuse_transformer_layer")
    assert row["rejections"] == 0 and len(row["op_gap_at"]) == layers
    assert f"✗{layers}<" not in chips(s)["after fuse_transformer_layer"]
    v = RunVerdict.of(s.trace)
    held = {lv.layer for lv in v.layers if lv.gap_only}
    assert {r.layer for st in s.trace.steps for r in step_places(st, s.trace).near_misses} == set()
    assert {r.layer for r in step.rejections if r.anchor in row["op_gap_at"]} == held
    assert len(held) == layers and v.ok


def test_places_keeps_the_headline_guard_of_each_candidate():
    t = trace_of(DEEPNORM)
    k = next(k for k, st in enumerate(t.steps) if st.pass_name == "fuse_transformer_layer")
    p = places(t, k)
    assert not p.near_misses and len(p.excused[OP_GAP_GROUP]) == 1  # DeepNorm's refusal: a gap in rlxviz's ops
    assert "(ln1_residual_scaled)" in p.excused[OP_GAP_GROUP][0], p.excused


# -- 3: a merge the tool's own cost test refuses is no NOT fused ------------------------------------------------


@pytest.mark.parametrize("name", FALCON_EXPORTS)
def test_falcon_exports_are_not_called_not_fused_for_a_merge_that_does_not_pay(capsys, name):
    """Falcon's Q/K/V is already one matmul; the only merge left (QKV with the parallel MLP's FC1) would cost FC1's
    GELU epilogue, and the tool refuses it. explain: every layer fused as expected, exit 0, the shared-input QKV
    matmul not listed as expected; --json agrees. The QKV matmul the refusal is anchored at then goes into each
    layer's FusedAttentionBlock (Q and K read one RoPE table pair, tests/test_rope_shared_table.py); the chip of
    fuse_shared_input_matmul still counts each refusal `○`, so the cost test's heading lists each, in the text and in
    --json (tests/test_chip_places_in_text.py checks every place a chip counts)."""
    code, out, _ = cli_run(capsys, "explain", FIX / name)
    assert "NOT fused" not in out, out
    assert "shared-input QKV matmul" not in "\n".join(ln for ln in out.splitlines() if "expected" in ln), out
    assert code == 0, out
    code, out, _ = cli_run(capsys, "explain", FIX / name, "--json")
    d = json.loads(out)
    assert d["ok"] and all(lv["fused"] for lv in d["layers"])
    assert d["final_op_counts"]["FusedAttentionBlock"] == len(d["layers"])
    t = trace_of(FIX / name)
    refused = [r for r in t.rejections if r.guard == "merge_keeps_fusions"]
    assert len(refused) == len(d["layers"]) and not any(r.anchor in t.final for r in refused)
    (paid,) = [g for g in d["left_out_groups"] if g["kind"] == DOES_NOT_PAY]
    assert [x.split(": ")[0] for x in paid["items"]] == [f"{r.rule} @ %{r.anchor} ({r.path})" for r in refused]


@pytest.mark.parametrize("layers, paths", [(1, True), (2, True), (2, False)])
def test_a_parallel_block_with_packed_qkv_fuses_as_expected(layers, paths):
    """Own falcon-like graphs (packed QKV + FC1/GELU on one LayerNorm output), layered or not: the merge is refused
    by the cost test (remedy DOES_NOT_PAY, no near-miss), FC1 keeps its epilogue, the verdict is ok, and no chip
    counts a ✗ for the refusal; its chip marks it `○` under the cost test's heading."""
    s = app(source="ir", ir_text=parallel_packed(layers, paths))
    t = s.trace
    step = next(st for st in t.steps if st.pass_name == "fuse_shared_input_matmul")
    hard = [r for r in step.rejections if not r.soft]
    assert len(hard) == layers and all(r.guard == "merge_keeps_fusions" for r in hard)
    assert all(r.kind == NOT_PROFITABLE and r.remedy == DOES_NOT_PAY and not r.near_miss for r in hard)
    assert all(standing(t, r)[0] == DOES_NOT_PAY for r in hard)
    assert all("query_key_value.weight" in r.message.split("fewer than 2 matmuls would be left to merge (only ")[1]
               for r in hard)  # the message names the one matmul left: the QKV the model already packs
    assert sum(n.attrs.get("activation") == "gelu" for n in t.final if n.op.value == "FusedMatMulBiasAct") == layers
    v = RunVerdict.of(t)
    assert v.ok, v.render()
    assert "shared-input QKV matmul" not in " ".join(lv.expected for lv in v.layers)
    assert not refusals(step, t)
    # each place, then the node the cost test left out (FC1), as messages name nodes: the place alone hid which;
    # then why, as the table and `explain -v` say it (`places.cost_reason`: the recorded costs in context)
    k = t.steps.index(step)
    # (`places.own_item`: the refusal's whole message in context, as `explain -v` lists it, its last clause too)
    items = not_near_misses(step, t)[DOES_NOT_PAY]
    assert items == [f"{place_label(r.anchor, r.path, with_node=True)}: {r.rule} ({r.guard}): "
                     f"{in_context(t, k, r)[0]}" for r in hard]
    for r, item in zip(hard, items, strict=True):
        node = describe(step.before[r.offending[0]]).removeprefix("matmul ")  # FC1: `matmul with W (node N, PATH)`
        assert f"{node} is not merged: {cost_reason(t, r)}" in item, item
        assert item.count(": it would cost ") == 1 and "; fewer than 2 matmuls would be left to merge" in item
    s.hide_unchanged = False
    chip = chips(s)["after fuse_shared_input_matmul"]
    assert "✗" not in chip and f">{NOT_NEAR_MISS_MARK}{layers}</span>" in chip
    assert "refusal" in chip and "cost test" in chip


def test_a_size_gate_still_counts_as_a_near_miss():
    """Not every `not profitable` refusal is excused: the attention size gate (bert-tiny over the threshold) is a
    near-miss of its layers: ✗ on its chip, the layers NOT fused."""
    s = app(preset="bert-tiny")
    s.apply_variant("over_threshold")
    gate = [r for r in s.trace.rejections if r.guard == "attention_size_gate"]
    assert gate and all(r.kind == NOT_PROFITABLE and near_miss_kind(r.kind, r.remedy) for r in gate)
    assert all(standing(s.trace, r) is None for r in gate)
    assert not RunVerdict.of(s.trace).ok
    counted = {(r.rule, r.anchor) for st in s.trace.steps for r in refusals(st, s.trace)}
    assert {(r.rule, r.anchor) for r in gate if r.headline} <= counted
