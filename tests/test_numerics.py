"""The input battery, the tolerance table and the two-way equivalence check (oracle + unfused on MLX)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import random_transformer_like_graphs

from rlxviz.ir import DType, Graph, Op, format_graph, parse_ir
from rlxviz.models import load_model
from rlxviz.passes import Pass, PassResult, Pipeline
from rlxviz.runtime import LoweringOptions, MlxExecutor, run_oracle, run_reference
from rlxviz.runtime.battery import KINDS, Battery, battery, load_inputs, mask_inputs
from rlxviz.runtime.compare import Baseline, baselines, check_version, check_versions, judge
from rlxviz.runtime.precision import TABLE, Tolerance, graph_dtype, precision_policy

CASE05 = Path(__file__).parent / "data" / "cases" / "05-fully-masked-row.rlx"


def _weights(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for n in graph:
        if n.op == Op.PARAM:
            fan = n.shape[0] if n.rank == 2 else 1
            base = 1.0 if n.rank == 1 and n.attrs["name"].endswith(("g", "gamma")) else 0.0
            out[n.attrs["name"]] = (base + rng.standard_normal(n.shape) / np.sqrt(fan)).astype(np.float32)
    return out


def _to(graph: Graph, dtype: str) -> Graph:
    """The same graph with every f32 type (and cast) in `dtype`; HF's mask fill finfo(f32).min becomes
    finfo(f16).min in f16 (as HF writes it: f32's minimum is -inf in f16, and 0 * -inf is NaN)."""
    text = format_graph(graph).replace("f32[", f"{dtype}[").replace('dtype="f32"', f'dtype="{dtype}"')
    if dtype == "f16":
        text = text.replace("{value=-3.4028234663852886e+38}", "{value=-65504.0}")
    return parse_ir(text)


def _changed(trace) -> list[tuple[str, Graph]]:
    """The input graph and every version a pass changed."""
    vs = trace.versions()
    return [vs[0]] + [vs[i + 1] for i, s in enumerate(trace.steps) if s.changed]


# -- the battery ---------------------------------------------------------------------------------

def test_battery_on_a_bert_graph_changes_the_mask_and_says_what_does_not_apply():
    m = load_model("bert-tiny", batch=3, seq=8, style="hf")
    base = m.random_feeds(0)
    bat = battery(m.graph, base)
    assert bat.names == ["random", "fully_masked_row", "left_padding", "holes", "single_token"]
    assert dict(bat.skipped) == {"large_magnitude": "no float input", "constant_rows": "no float input"}
    masks = {s.name: s.feeds["attention_mask"] for s in bat.sets}
    assert not masks["random"].all(axis=1).all() and masks["random"].any(axis=1).all()  # random never empties a row
    assert (masks["fully_masked_row"][-1] == 0).all() and masks["fully_masked_row"][:-1].all()
    assert (masks["left_padding"][:, 0] == 0).all() and masks["left_padding"][:, -1].all()
    assert (masks["holes"][:, 1] == 0).all() and masks["holes"][:, 0].all() and masks["holes"][:, 2].all()
    assert (masks["single_token"].sum(axis=1) == 1).all()
    for s in bat.sets:  # token ids untouched, dtypes kept
        np.testing.assert_array_equal(s.feeds["input_ids"], base["input_ids"])
        assert s.feeds["attention_mask"].dtype == np.int64
    assert "not applicable: large_magnitude (no float input)" in bat.describe()


def test_battery_on_float_inputs_reaches_f16_overflow_and_constant_rows():
    g = parse_ir(CASE05.read_text())
    bat = battery(g, {"hidden": np.zeros((2, 8, 64), np.float32), "attention_mask": np.ones((2, 8), np.int64)})
    assert bat.names == list(KINDS) and not bat.skipped
    big = dict(zip(bat.names, bat.sets, strict=True))["large_magnitude"].feeds["hidden"]
    assert 250 < np.abs(big).max() <= 300 and float(np.float16(big.max())) ** 2 > 65504  # squares overflow f16
    const = dict(zip(bat.names, bat.sets, strict=True))["constant_rows"].feeds["hidden"]
    assert np.ptp(const, axis=-1).max() == 0 and np.ptp(const) > 0
    assert [n.attrs["name"] for n in mask_inputs(g)] == ["attention_mask"]
    with pytest.raises(ValueError, match="unknown input kind"):
        battery(g, {}, kinds=("nope",))


def test_load_inputs_checks_names_shapes_and_dtypes_before_reading(tmp_path):
    g = parse_ir(CASE05.read_text())
    h, m = np.ones((2, 8, 64), np.float32), np.ones((2, 8), np.int64)
    np.savez(tmp_path / "ok.npz", hidden=h, attention_mask=m)
    user = load_inputs(tmp_path / "ok.npz", g)
    assert user.name == "user" and user.feeds["attention_mask"].dtype == np.int64
    cases = {
        "shape": ({"hidden": h[:1], "attention_mask": m}, "input 'hidden' has shape [1, 8, 64], the graph needs"),
        "name": ({"hiddn": h, "attention_mask": m}, "unknown input(s) hiddn; the graph takes hidden, attention_mask"),
        "missing": ({"hidden": h}, "no array for input 'attention_mask'"),
        "dtype": ({"hidden": h.astype(np.int64), "attention_mask": m}, "input 'hidden' is int64, the graph needs f32"),
    }
    for name, (arrays, msg) in cases.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
        with pytest.raises(ValueError) as e:
            load_inputs(tmp_path / f"{name}.npz", g)
        assert msg in str(e.value) and "\n" not in str(e.value), name
    np.save(tmp_path / "one.npy", h)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    for bad in ("one.npy", "junk.npz", "absent.npz"):
        with pytest.raises(ValueError, match="not a readable .npz"):
            load_inputs(tmp_path / bad, g)


# -- the tolerance table -------------------------------------------------------------------------

def test_policy_comes_from_one_table_per_dtype_and_device():
    g32 = parse_ir(CASE05.read_text())
    assert graph_dtype(g32) == DType.f32 and graph_dtype(_to(g32, "f16")) == DType.f16
    p = precision_policy(g32, "cpu")
    assert (p.oracle, p.same_backend) == TABLE[DType.f32, "cpu"]
    tf32 = precision_policy(g32, "cuda+tf32")
    assert tf32.tf32 and tf32.oracle.atol >= 4.1e-3 > p.oracle.atol  # the 4.1e-3 TF32 error measured on an H200
    assert "TF32" in tf32.describe() and "float64" in p.describe()
    assert precision_policy(_to(g32, "bf16"), "cpu").oracle.rtol > precision_policy(_to(g32, "f16"), "cpu").oracle.rtol
    assert precision_policy(DType.bf16, "cpu") == precision_policy(_to(g32, "bf16"), "cpu")  # a dtype or a graph
    with pytest.raises(KeyError, match="no tolerance for f64 on metal"):
        precision_policy(_to(g32, "f64"), "metal")


def test_oracle_is_float64_and_sees_the_rounded_leaves():
    g = _to(parse_ir(CASE05.read_text()), "f16")
    rng = np.random.default_rng(0)
    feeds = {"hidden": rng.standard_normal((2, 8, 64)).astype(np.float32) * 0.5, "attention_mask": np.ones((2, 8))}
    w = _weights(g)
    o = run_oracle(g, feeds, w)[0]
    assert o.dtype == np.float64
    f16 = run_reference(g, feeds, w)[0]
    assert f16.dtype == np.float16 and 0 < np.abs(o - f16).max() < 1e-2


# -- verdicts ------------------------------------------------------------------------------------

LN16 = """graph ln16 {
  %0 = input {name="x"} : f16[2, 8, 64]
  %1 = input {name="r"} : f16[2, 8, 64]
  %2 = param {name="g"} : f16[64]
  %3 = param {name="b"} : f16[64]
  %4 = add(%0, %1) : f16[2, 8, 64]
  %5 = layer_norm(%4, %2, %3) {eps=1e-05} : f16[2, 8, 64]
  return %5
}"""

LN16_DECOMPOSED = """graph ln16dec {
  %0 = input {name="x"} : f16[2, 8, 64]
  %1 = input {name="r"} : f16[2, 8, 64]
  %2 = param {name="g"} : f16[64]
  %3 = param {name="b"} : f16[64]
  %4 = add(%0, %1) : f16[2, 8, 64]
  %5 = reduce_mean(%4) {axes=[2], keepdims=true} : f16[2, 8, 1]
  %6 = sub(%4, %5) : f16[2, 8, 64]
  %7 = mul(%6, %6) : f16[2, 8, 64]
  %8 = reduce_mean(%7) {axes=[2], keepdims=true} : f16[2, 8, 1]
  %9 = const {value=1e-05} : f16[]
  %10 = add(%8, %9) : f16[2, 8, 1]
  %11 = rsqrt(%10) : f16[2, 8, 1]
  %12 = mul(%6, %11) : f16[2, 8, 64]
  %13 = mul(%12, %2) : f16[2, 8, 64]
  %14 = add(%13, %3) : f16[2, 8, 64]
  return %14
}"""


def _ln_feeds(scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: (rng.standard_normal((2, 8, 64)) * scale).astype(np.float16) for k in ("x", "r")}


def test_f16_layer_norm_op_is_not_marked_wrong():
    g = parse_ir(LN16)
    trace = Pipeline.canonical().run(g)
    assert any(n.op == Op.FUSED_RESIDUAL_LN for n in trace.final)
    verdicts = check_versions(_changed(trace), battery(g, _ln_feeds()), _weights(g), precision_policy(g))
    assert all(v.ok for v in verdicts), [v.note for v in verdicts]


def test_f16_overflow_is_reported_as_overflow_with_the_input_and_node():
    g = parse_ir(LN16_DECOMPOSED)
    v = check_versions([("input", g)], battery(g, _ln_feeds()), _weights(g), precision_policy(g))[0]
    assert v.status == "overflow" and v.broke_on == "large_magnitude"
    assert "%7 mul f16[2, 8, 64]" in v.note and "in the unfused graph" in v.note
    assert "outputs stay finite" in v.note  # rsqrt(inf) = 0: the overflow is inside, the outputs are finite
    assert [c.status for c in v.checks if c.inputs != "large_magnitude"] == ["ok", "ok"]


def test_an_f16_residual_sum_that_overflows_is_not_ok():
    g = parse_ir(LN16)
    feeds = _ln_feeds()
    feeds["x"][..., 0] = feeds["r"][..., 0] = 40000.0  # finite in f16; the sum 80000 > 65504 is not
    user = battery(g, feeds, kinds=("random",))
    v = check_versions([("input", g), ("fused", Pipeline(["fuse_residual_ln"]).run(g).final)], user, _weights(g),
                       precision_policy(g))
    for verdict in v:
        assert verdict.status == "overflow" and "%4 add f16[2, 8, 64]" in verdict.note, verdict.note


def test_judge_separates_a_fusion_bug_from_conditioning():
    pol = precision_policy(parse_ir(LN16), "cpu")
    oracle, unfused = [np.ones(4)], [np.array([1.0, 1.0, 1.0, 1.5], np.float16)]
    assert judge([np.ones(4, np.float16)], oracle, unfused, pol).status == "ok"  # closer than unfused: fine
    assert judge(unfused, oracle, unfused, pol).status == "precision"
    assert judge([np.full(4, 3.0)], oracle, unfused, pol).status == "fusion"
    # rounds differently from unfused but is no farther from the oracle: conditioning, not a fusion fault
    assert judge([np.array([1.0, 1.0, 1.0, 0.6])], oracle, unfused, pol).status == "precision"
    inf = [np.array([1.0, np.inf, 1.0, 1.0])]
    assert judge(inf, oracle, inf, pol).status == "overflow" and judge(inf, oracle, unfused, pol).status == "fusion"
    nan = [np.array([1.0, np.nan, np.nan, 1.0])]
    assert judge(nan, oracle, inf, pol).status == "overflow"  # unfused overflows too: not blamed on the pass
    assert judge(oracle, [np.array([np.nan, 1, 1, 1])], oracle, pol).status == "nonfinite"


# -- a deliberately broken rewrite is caught and named with the input that broke it ----------------

def _binary_keep_mask(graph: Graph, params) -> PassResult:
    """TEST ONLY, WRONG ON PURPOSE: turn HF's additive mask into a binary keep mask (the old fuse_sdpa)."""
    nodes = [n.replace(attrs={**n.attrs, "mask_fill": None}) if n.attrs.get("mask_fill") is not None else n
             for n in graph]
    return PassResult(Graph(nodes, graph.outputs, graph.name))


BROKEN = Pass("binary_keep_mask", _binary_keep_mask, doc="test only: drops the additive fill")


@pytest.mark.parametrize("source", ["case05", "bert-tiny"])
def test_a_broken_rewrite_is_caught_and_named_with_the_input_that_broke_it(source):
    if source == "case05":
        g = parse_ir(CASE05.read_text())
        rng = np.random.default_rng(0)
        base = {"hidden": rng.standard_normal((2, 8, 64)).astype(np.float32),
                "attention_mask": np.array([[1] * 8, [1] * 6 + [0] * 2])}
        w = _weights(g)
    else:
        m = load_model("bert-tiny", batch=2, seq=8, style="hf")
        g, base, w = m.graph, m.random_feeds(0), m.weights
    trace = Pipeline(["fuse_sdpa", BROKEN, "fuse_shared_input_matmul", "fuse_matmul_bias_act",
                      "fuse_attention_block"]).run(g)
    versions = trace.versions()
    verdicts = check_versions(versions, battery(g, base), w, precision_policy(g))
    by = dict(zip([label for label, _ in versions], verdicts, strict=True))
    # the unfused graph may itself lose precision (f32 scores - 10000 on the empty row): never a fusion fault
    assert by["input"].status in ("ok", "precision") and by["after fuse_sdpa"].status == by["input"].status
    broken = by["after binary_keep_mask"]
    if source == "bert-tiny":  # HF's fill is finfo(f32).min there: a binary mask is the same for 0/1 masks
        assert all(v.ok for v in verdicts), [v.note for v in verdicts]
        return
    assert broken.status == "fusion" and broken.broke_on == "fully_masked_row", broken.note
    assert "binary_keep_mask changed the numbers on fully_masked_row" in broken.note  # the pass is named
    assert [c.status for c in broken.checks if c.inputs == "random"] == ["ok"]  # random inputs alone miss it
    assert by["after fuse_attention_block"].broke_on == "fully_masked_row"  # carried into the block
    # ... and still blamed on the pass where the error vs unfused first jumped, not on the later fusion
    assert by["after fuse_attention_block"].note.startswith("NO: binary_keep_mask changed the numbers")


# -- properties: every pipeline version, fused vs unfused on MLX, f32 and f16 ----------------------

@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("model", ["case05", "bert-tiny-hf", "bert-tiny-rlx"])
def test_mask_battery_through_every_version(model, dtype):
    if model == "case05":
        g = parse_ir(CASE05.read_text())
        base = {"hidden": np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32),
                "attention_mask": np.ones((2, 8), np.int64)}
        w = _weights(g)
    else:
        m = load_model("bert-tiny", batch=2, seq=8, style=model.rsplit("-", 1)[1])
        g, base, w = m.graph, m.random_feeds(0), m.weights
    g = _to(g, dtype)
    trace = Pipeline.canonical().run(g)
    versions = _changed(trace)
    assert len(versions) >= 3
    verdicts = check_versions(versions, battery(g, base), w, precision_policy(g))
    unfused = [c.status for c in verdicts[0].checks]
    assert unfused[0] == "ok"  # random inputs (case05 in f32: the empty row loses precision, -10000 fill)
    for (label, _), v in zip(versions, verdicts, strict=True):  # a version is ok, or exactly as off as unfused
        assert all(c.status in ("ok", u) for c, u in zip(v.checks, unfused, strict=True)), f"{label}: {v.note}"
        assert v.status != "fusion", f"{model} {dtype} {label}: {v.note}"


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_transformer_like_graphs())
def test_random_transformers_fused_equal_unfused_on_mlx_f32_and_f16(case):
    """Every version of random BERT-like graphs on the whole battery, f32 and f16: never a fusion fault.
    (Fast-math kernels uncompiled: `mx.compile` tracing of each new tiny graph would take 5x longer.)"""
    ex = MlxExecutor(LoweringOptions(compile_fused=False))

    def run(graph, feeds, weights):
        return ex.run(graph, feeds, weights)

    for dtype in ("f32", "f16"):
        g = case.graph if dtype == "f32" else _to(case.graph, dtype)
        versions = _changed(Pipeline.canonical().run(g))
        bases = baselines(g, battery(g, case.feeds), case.weights, run)
        for label, v in versions[1:]:
            verdict = check_version(v, bases, case.weights, precision_policy(g), run)
            assert verdict.status != "fusion", f"{dtype} {label}: {verdict.note}"


def test_baseline_runs_the_oracle_and_the_backend_once_per_input():
    g = parse_ir(LN16)
    calls = []

    def run(graph, feeds, weights):
        calls.append(graph)
        return run_reference(graph, feeds, weights)

    bases = baselines(g, battery(g, _ln_feeds()), _weights(g), run)
    assert len(bases) == 3 and len(calls) == 3 and all(isinstance(b, Baseline) for b in bases)
    assert Battery(()).names == [] and Tolerance(1e-3, 1e-4).__str__() == "rtol 0.001, atol 0.0001"


def test_a_version_as_far_from_the_oracle_as_unfused_is_not_blamed_on_a_pass():
    """Off the unfused graph by more than the same-dtype tolerance but no farther from the oracle than the unfused
    graph (or than rounding the inputs alone moves the oracle: `err_cond`): `precision`, the note says it differs
    from unfused but is no farther from the oracle, names no pass. Farther than 2x that: the pass is named."""
    from rlxviz.runtime.compare import InputCheck, Verdict, attribute_changes

    pol = precision_policy(parse_ir(LN16), "cpu")
    oracle, unfused = [np.ones(4)], [np.array([1.0, 1.0, 1.0, 1.5], np.float16)]
    same = judge(unfused, oracle, unfused, pol, "fully_masked_row")
    moved = judge([np.array([1.0, 1.0, 1.0, 0.6])], oracle, unfused, pol, "fully_masked_row")
    far = judge([np.array([1.0, 1.0, 1.0, 3.0])], oracle, unfused, pol, "fully_masked_row")
    conditioned = judge([np.array([1.0, 1.0, 1.0, 3.0])], oracle, unfused, pol, "fully_masked_row", err_cond=1.5)
    assert same.status == moved.status == conditioned.status == "precision" and far.status == "fusion"
    assert not same.changed and moved.changed and far.changed
    ok = InputCheck("random", 0.0, 0.0, "ok")
    labels = ["input", "after fuse_sdpa", "after fuse_matmul_bias_act", "after fuse_attention_block"]
    vs = attribute_changes(labels, [Verdict([ok, same]), Verdict([ok, same]), Verdict([ok, moved]),
                                    Verdict([ok, moved])])
    assert "loses precision in its dtype on fully_masked_row" in vs[0].note and "unfused too" in vs[0].note
    for v in vs[2:]:
        assert "changed the numbers" not in v.note and v.changed_by is None, v.note
        assert "differs from the unfused graph (9.0e-01) but is no farther from the oracle (4.0e-01" in v.note
    c = attribute_changes(labels[:3], [Verdict([ok, same]), Verdict([ok, same]), Verdict([ok, conditioned])])[2]
    assert "changed the numbers" not in c.note and "moves the oracle by 1.5e+00" in c.note
    vs = attribute_changes(labels, [Verdict([ok, same]), Verdict([ok, same]), Verdict([ok, far]), Verdict([ok, far])])
    for v in vs[2:]:
        assert v.note.startswith("NO: fuse_matmul_bias_act changed the numbers on fully_masked_row (1.5e+00 vs "
                                 "unfused"), v.note


def test_conditioning_of_large_logits_is_read_before_blaming_a_pass():
    """+-300 inputs push softmax logits to ~1e4: one ulp of the inputs moves the oracle by O(1), so a version that
    rounds differently from the unfused graph is as far from the oracle as rounding allows, not a pass's fault;
    on standard-normal inputs the same graph's conditioning is tiny."""
    from rlxviz.runtime.compare import conditioning

    g = parse_ir("""graph sm {
  %0 = input {name="x"} : f32[8, 16]
  %1 = const {value=1500.0} : f32[]
  %2 = mul(%0, %1) : f32[8, 16]
  %3 = softmax(%2) {axis=-1} : f32[8, 16]
  return %3
}""")
    rng = np.random.default_rng(0)
    x = rng.uniform(-300, 0, (8, 16)).astype(np.float32)
    x[:, :2] = 300.0  # two equal top logits (4.5e5): one ulp of x moves their softmax share by ~1e-2
    big = conditioning(g, {"x": x}, {})
    small = conditioning(g, {"x": rng.standard_normal((8, 16)).astype(np.float32) * 1e-3}, {})
    assert big > 1e-3 and small < 1e-6, (big, small)


def test_the_note_names_the_worst_input_set_the_column_shows():
    """The table's vs-oracle column is the worst over the input sets; when that is not the first bad set (e.g. nan
    on large_magnitude after 2.5e-02 on fully_masked_row), the note names it too, so they agree."""
    from rlxviz.runtime.compare import InputCheck, Verdict

    v = Verdict([InputCheck("fully_masked_row", 2.5e-2, 0.0, "precision", err_base=2.5e-2),
                 InputCheck("large_magnitude", float("nan"), 0.0, "overflow", "%29 matmul f16[2, 4, 8, 8]")])
    assert np.isnan(v.err_oracle) and v.err_unfused == 0.0
    assert "fully_masked_row (2.5e-02 vs the oracle" in v.note
    assert "worst (nan vs the oracle): overflows in its dtype on large_magnitude at %29 matmul" in v.note
    # the unfused graph is 0 away from itself even where it holds NaN
    from rlxviz.runtime.compare import max_abs

    a = [np.array([1.0, np.nan, np.inf])]
    assert np.isnan(max_abs(a, a)) and max_abs(a, a, same_nonfinite=True) == 0.0
