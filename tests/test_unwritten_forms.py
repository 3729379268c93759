"""Forms nobody wrote a rule for (issue 21; ../shared/cases/n3-*, copied to tests/data/cases) and two or more
inputs of each kind written here.

* LoRA `x@W + (x@A)@B`: the shared-input merge of x@W and x@A is legal (the add of two products is merged by
  nobody, so it is no dependency of the packed matmul); a weight computed from a member is still a cycle.
* A 0-d float input: `rlxviz time` runs; an input set that cannot apply to it (`constant_rows`) leaves it alone.
* Mask input sets reach every mask form: rank 2 and rank 4, int keep, bool, float additive (fully masked rows).
* `time --inputs` takes a real additive causal mask (0 / finfo.min, or -inf).
Every version keeps the unfused numbers on the reference interpreter and on MLX.
"""

from pathlib import Path

import numpy as np
import pytest
from clirun import run as cli_run

from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.passes import Pipeline, missed_fusions
from rlxviz.runtime import run_reference
from rlxviz.runtime.battery import battery, check_inputs, mask_form, mask_inputs
from rlxviz.runtime.executor import run_mlx
from rlxviz.session.status import check_fusion

CASES = Path(__file__).parent / "data" / "cases"


def case(name: str) -> Graph:
    return parse_ir(next(CASES.glob(f"n3-{name}.rlx")).read_text())


def random_feeds(g: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for n in g.inputs:
        if n.dtype.is_float:
            feeds[n.name] = rng.standard_normal(n.shape).astype(n.dtype.numpy)
        else:  # a 0/1 keep mask with padding, every row keeps key 0
            m = (rng.random(n.shape) > 0.3).astype(n.dtype.numpy)
            m[..., 0] = 1
            feeds[n.name] = m
    return feeds


def equal_numbers(g: Graph, pipeline: Pipeline | None = None, rtol: float = 1e-4, atol: float = 1e-5):
    """Run the pipeline; every version's outputs equal the unfused graph's, on the reference and on MLX.

    `atol` is per unit of the output's largest magnitude: float32 rounding grows with the values summed, so an
    element near zero in an output of magnitude 25 is off by ~4e-5 on MLX even in the unfused version (n3-08 written
    twice, AMD EPYC, 2026-12-06), while a wrong rewrite is off by the output's own scale."""
    t = (pipeline or Pipeline.canonical()).run(g)
    assert not [s.error for s in t.steps if s.error]
    rng = np.random.default_rng(0)
    feeds = random_feeds(g, rng)
    w = {n.name: (0.2 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    ref = run_reference(g, feeds, w)
    for label, v in t.versions()[1:]:
        for run in (run_reference, run_mlx):
            for a, b in zip(ref, run(v, feeds, w), strict=True):
                scale = max(1.0, float(np.abs(np.asarray(a, np.float64)).max(initial=0.0)))
                np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64), rtol=rtol,
                                           atol=atol * scale, err_msg=f"{label} on {run.__name__}")
    return t


def ops(g: Graph) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in g:
        out[n.op.value] = out.get(n.op.value, 0) + 1
    return out


# -- LoRA: the shared-input merge is legal -----------------------------------------------------------

LORA_BIASED = """graph lora_biased {
  %0 = input {name="x"} : f32[16, 32]
  %1 = param {name="W"} : f32[32, 32]
  %2 = matmul(%0, %1) : f32[16, 32]
  %3 = param {name="b"} : f32[32]
  %4 = add(%2, %3) : f32[16, 32]
  %5 = param {name="A"} : f32[32, 4]
  %6 = matmul(%0, %5) : f32[16, 4]
  %7 = param {name="B"} : f32[4, 32]
  %8 = matmul(%6, %7) : f32[16, 32]
  %9 = add(%4, %8) : f32[16, 32]
  return %9
}"""

LORA_SCALED = """graph lora_scaled {
  %0 = input {name="x"} : f32[2, 8, 32]
  %1 = param {name="W"} : f32[32, 48]
  %2 = matmul(%0, %1) : f32[2, 8, 48]
  %3 = param {name="A"} : f32[32, 4]
  %4 = matmul(%0, %3) : f32[2, 8, 4]
  %5 = param {name="B"} : f32[4, 48]
  %6 = matmul(%4, %5) : f32[2, 8, 48]
  %7 = const {value=0.5} : f32[]
  %8 = mul(%6, %7) : f32[2, 8, 48]
  %9 = add(%8, %2) : f32[2, 8, 48]
  return %9
}"""


@pytest.mark.parametrize("source", ["case", LORA_BIASED, LORA_SCALED])
def test_lora_shared_input_merge_is_legal_and_keeps_the_numbers(source):
    g = case("lora-shared-input") if source == "case" else parse_ir(source)
    t = equal_numbers(g)
    assert not [r for r in missed_fusions(t) if r.guard == "operands_independent"]
    assert "a cycle" not in " ".join(r.message for s in t.steps for r in s.rejections)
    # x@W and x@A became one matmul over concat(W, A): one matmul (or fused matmul) fewer
    def products(graph: Graph) -> int:
        return sum(k for op, k in ops(graph).items() if "matmul" in op.lower())

    assert products(t.final) == products(g) - 1
    assert ops(t.final).get("concat", 0) >= 1


# -- input sets that cannot apply are skipped ----------------------------------------------------------

SCALAR_ONLY = """graph scalar_only {
  %0 = input {name="s"} : f32[]
  %1 = input {name="t"} : f32[]
  %2 = mul(%0, %1) : f32[]
  return %2
}"""

SCALAR_F16 = """graph scalar_f16 {
  %0 = input {name="x"} : f16[3, 4, 5]
  %1 = input {name="temperature"} : f16[]
  %2 = div(%0, %1) : f16[3, 4, 5]
  %3 = softmax(%2) {axis=-1} : f16[3, 4, 5]
  return %3
}"""


@pytest.mark.parametrize("source", ["case", SCALAR_ONLY, SCALAR_F16])
def test_time_runs_on_a_0d_float_input(capsys, tmp_path, source):
    if source == "case":
        path = next(CASES.glob("n3-scalar-input-time.rlx"))
    else:
        path = tmp_path / "g.ir"
        path.write_text(source)
    code, out, err = cli_run(capsys, "time", path, "--repeat", 1, "--warmup", 0)
    assert code == 0, err
    assert "large_magnitude" in out and "error" not in err
    g = parse_ir(path.read_text())
    bat = battery(g, random_feeds(g, np.random.default_rng(0)))
    by = {s.name: s for s in bat.sets}
    if all(n.rank == 0 for n in g.inputs):
        assert "constant_rows" not in by and ("constant_rows", "no float input of rank 1 or more") in bat.skipped
    else:  # constant along the last axis for the inputs that have one; the 0-d input keeps its base value
        rows = next(n.name for n in g.inputs if n.rank)
        scalar = next(n.name for n in g.inputs if not n.rank)
        a = by["constant_rows"].feeds[rows]
        assert (a == a[..., :1]).all()
        assert by["constant_rows"].feeds[scalar] == by["random"].feeds[scalar]


# -- mask input sets for every mask form --------------------------------------------------------------

def _masked_attention(mask_type: str, form: str) -> str:
    """A [2, 2, 4, 4] scores softmax with a mask input of `mask_type`: `form` additive (added), keep (HF's
    (1 - m) * min), bool (where)."""
    head = f"""graph masked {{
  %0 = input {{name="x"}} : f32[2, 2, 4, 4]
  %1 = input {{name="attention_mask"}} : {mask_type}
"""
    if form == "additive":
        body = """  %2 = add(%0, %1) : f32[2, 2, 4, 4]
  %3 = softmax(%2) {axis=-1} : f32[2, 2, 4, 4]
  return %3
}"""
    elif form == "bool":
        body = """  %2 = const {value=-3.4028234663852886e+38} : f32[]
  %3 = where(%1, %0, %2) : f32[2, 2, 4, 4]
  %4 = softmax(%3) {axis=-1} : f32[2, 2, 4, 4]
  return %4
}"""
    else:
        body = """  %2 = cast(%1) {dtype="f32"} : """ + mask_type.replace("i64", "f32") + """
  %3 = const {value=1.0} : f32[]
  %4 = sub(%3, %2) : """ + mask_type.replace("i64", "f32") + """
  %5 = const {value=-3.4028234663852886e+38} : f32[]
  %6 = mul(%4, %5) : """ + mask_type.replace("i64", "f32") + """
  %7 = add(%0, %6) : f32[2, 2, 4, 4]
  %8 = softmax(%7) {axis=-1} : f32[2, 2, 4, 4]
  return %8
}"""
    return head + body


@pytest.mark.parametrize("mask_type, form", [
    ("f32[2, 1, 4, 4]", "additive"), ("f32[2, 2, 4, 4]", "additive"), ("f32[2, 1, 1, 4]", "additive"),
    ("bool[2, 1, 4, 4]", "bool"), ("bool[2, 2, 4, 4]", "bool"), ("i64[2, 1, 1, 4]", "keep"),
    ("f32[2, 1, 1, 4]", "keep")])
def test_mask_sets_reach_rank4_additive_and_bool_masks(mask_type, form):
    g = parse_ir(_masked_attention(mask_type, form))
    (m,) = mask_inputs(g)
    assert mask_form(g, m) == form
    rng = np.random.default_rng(0)
    bat = battery(g, random_feeds(g, rng))
    assert {"fully_masked_row", "left_padding", "holes", "single_token"} <= set(bat.names)
    by = {s.name: s.feeds["attention_mask"] for s in bat.sets}
    full = by["fully_masked_row"]
    masked = {"additive": np.finfo(np.float32).min, "keep": 0, "bool": False}[form]
    kept = {"additive": 0.0, "keep": 1, "bool": True}[form]
    assert (full[-1] == masked).all() and (full[0] == kept).all()  # the last row masks every key
    assert (by["single_token"][..., 0] == kept).all() and (by["single_token"][..., 1:] == masked).all()
    x = {"x": rng.standard_normal((2, 2, 4, 4)).astype(np.float32)}
    out = run_reference(g, {**x, "attention_mask": by["single_token"]}, {})[0]
    np.testing.assert_allclose(out[..., 0], 1.0, rtol=1e-6)  # the one visible key takes all the weight
    for s in bat.sets:  # every mask set is a valid input of this mask form
        if s.name in ("fully_masked_row", "left_padding", "holes", "single_token"):
            check_inputs(s.feeds, g)


CAUSAL = """graph causal_additive {
  %0 = input {name="x"} : f32[2, 4, 4]
  %1 = input {name="causal_mask"} : f32[4, 4]
  %2 = add(%0, %1) : f32[2, 4, 4]
  %3 = softmax(%2) {axis=-1} : f32[2, 4, 4]
  return %3
}"""


@pytest.mark.parametrize("fill", [np.finfo(np.float32).min, -np.inf, -10000.0])
def test_time_inputs_accepts_a_real_additive_causal_mask(capsys, tmp_path, fill):
    (tmp_path / "g.ir").write_text(CAUSAL)
    causal = np.triu(np.full((4, 4), fill, np.float32), 1)
    x = np.random.default_rng(0).standard_normal((2, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x, causal_mask=causal)
    code, out, err = cli_run(capsys, "time", tmp_path / "g.ir", "--repeat", 1, "--warmup", 0, "--inputs",
                             tmp_path / "in.npz")
    assert code == 0, err
    assert "user" in out


@pytest.mark.parametrize("bad, fragment", [(1.0, "additive mask"), (np.nan, "additive mask")])
def test_an_additive_mask_with_a_positive_or_nan_value_is_refused(bad, fragment):
    g = parse_ir(CAUSAL)
    causal = np.triu(np.full((4, 4), -1e9, np.float32), 1)
    causal[0, 0] = bad
    with pytest.raises(ValueError, match=fragment):
        check_inputs({"x": np.zeros((2, 4, 4), np.float32), "causal_mask": causal}, g)


def test_a_keep_mask_still_holds_only_0_and_1():
    g = parse_ir(_masked_attention("i64[2, 1, 1, 4]", "keep"))
    with pytest.raises(ValueError, match="must hold only 0 and 1, got 2"):
        check_inputs({"x": np.zeros((2, 2, 4, 4), np.float32),
                      "attention_mask": np.full((2, 1, 1, 4), 2, np.int64)}, g)


def test_the_fused_graph_of_a_shared_input_uses_one_matmul_node():
    """The merged LoRA graph holds the concat of W and A as the packed weight (the rewrite, not a copy)."""
    t = Pipeline.canonical().run(case("lora-shared-input"))
    (cat,) = [n for n in t.final if n.op == Op.CONCAT]
    assert [t.final[i].name for i in cat.inputs] == ["W", "A"]


# -- attention with the heads folded into the batch ----------------------------------------------------

def explain_json(capsys, path) -> tuple[int, dict]:
    import json

    code, out, err = cli_run(capsys, "explain", path, "--json")
    assert "Traceback" not in err
    return code, json.loads(out)


def test_case_08_folded_heads_fuse_like_the_4d_control(capsys):
    folded = equal_numbers(case("08-bart-bmm-3d-heads"))
    control = equal_numbers(case("08c-bart-4d-control"))
    assert ops(folded.final) == ops(control.final)
    assert ops(folded.final).get("FusedAttentionBlock") == 1
    assert any(m.rule == "fuse_sdpa.unfold_heads" for s in folded.steps for m in s.matches)
    code, out, _ = cli_run(capsys, "explain", next(CASES.glob("n3-08-*.rlx")))
    assert code == 0 and "no attention" not in out and "FusedAttentionBlock" in out


@pytest.mark.parametrize("name, product", [("08v-folded-scaled-scores", "attention"),
                                           ("08w-folded-position-bias", "attention")])
def test_folded_heads_variants_become_packed_attention(name, product):
    t = equal_numbers(case(name))
    assert ops(t.final).get(product) == 1
    assert not any(n.op == Op.SOFTMAX for n in t.final)


def test_folded_heads_attention_the_lift_cannot_take_is_flagged(capsys):
    path = next(CASES.glob("n3-08x-*.rlx"))
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 1 and "no attention" not in out
    assert "unrecognized.attention" in out and "heads folded into the batch" in out
    equal_numbers(case("08x-folded-bias-not-liftable"))


def test_unfold_heads_keeps_a_3d_value_read_elsewhere():
    """A lifted value also read outside the chain (the attention probabilities returned) keeps its 3-D form."""
    src = next(CASES.glob("n3-08v-*.rlx")).read_text()
    src = src.replace("  return %26", "  return %26, %20")
    t = equal_numbers(parse_ir(src))
    out = t.final[t.final.outputs[1]]
    assert out.shape == (4, 4, 4)


# -- advice that keeps the model: additive terms that are not padding masks, cross-attention ----------

def _with_term(decl: str) -> Graph:
    """n3-17b with its [1, 1, 8, 8] band replaced by `decl` (a node %15 added to the [2, 4, 8, 8] scores)."""
    src = next(CASES.glob("n3-17b-*.rlx")).read_text().splitlines()
    out = [f"  %15 = {decl} @model.layers.0.self_attn" if ln.startswith("  %15 = ") else ln for ln in src]
    return parse_ir("\n".join(out))


def _causal_const() -> str:
    rows = [[0.0 if k <= q else -1e9 for k in range(8)] for q in range(8)]
    return f"const {{value=[[{rows}]]}} : f32[1, 1, 8, 8]".replace("[[[[", "[[[[").replace("'", "")


TERMS = {
    "sliding_window": None,  # the case itself
    "causal_band": _causal_const(),
    "relative_position_bias": 'param {name="rel_pos_bias"} : f32[1, 4, 8, 8]',
    "alibi": 'param {name="alibi_slopes_x_positions"} : f32[1, 4, 1, 8]',
}


@pytest.mark.parametrize("name", list(TERMS))
def test_an_additive_term_that_is_not_a_padding_mask_is_kept_as_an_operand(capsys, tmp_path, name):
    from rlxviz.ir.printer import format_graph

    g = case("17b-sliding-window-additive") if TERMS[name] is None else _with_term(TERMS[name])
    t = equal_numbers(g)
    # issue 37: the block takes the additive mask too, so the attention may sit inside a FusedAttentionBlock
    (attn,) = [n for n in t.final if n.op in (Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK)]
    assert attn.attrs["mask"] == "additive"
    assert check_fusion(t).ok and not [m for m in missed_fusions(t) if m.guard in ("mask_form", "mask_model_term")]
    path = tmp_path / "g.ir"
    path.write_text(format_graph(g))
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0, out
    assert "mask_model_term [the model's own term]" in out and "not a per-key mask such as padding alone" in out
    assert "not a padding mask" not in out  # the term may hold padding as well
    assert "extended-mask formula" not in out and "keep mask" not in out.split("keeps the model's own term")[1]


def test_a_per_key_additive_mask_still_gets_the_padding_advice():
    """[B, 1, 1, S] varies only by batch and key: it can be a padding keep mask, so the advice stands."""
    g = _with_term('param {name="pad_bias"} : f32[2, 1, 1, 8]')
    t = Pipeline.canonical().run(g)
    (m,) = [m for m in missed_fusions(t) if m.guard == "mask_form"]
    assert "extended-mask formula" in m.hint


def _cross(sq: int, bias: bool, sk: int = 6) -> str:
    """Cross-attention (2 heads of 8): Q from `hidden_states` [2, sq, 16], K/V from `encoder_hidden_states`
    [2, sk, 16], an encoder keep mask over the sk keys (HF's extended mask), with or without projection biases."""
    at = " @decoder.layers.0.encoder_attn"
    lines = [f'  %0 = input {{name="hidden_states"}} : f32[2, {sq}, 16]',
             f'  %1 = input {{name="encoder_hidden_states"}} : f32[2, {sk}, 16]',
             f'  %2 = input {{name="encoder_attention_mask"}} : i64[2, {sk}]',
             f'  %3 = cast(%2) {{dtype="f32"}} : f32[2, {sk}]{at}',
             f"  %4 = const {{value=1.0}} : f32[]{at}",
             f"  %5 = sub(%4, %3) : f32[2, {sk}]{at}",
             f"  %6 = const {{value=-3.4028234663852886e+38}} : f32[]{at}",
             f"  %7 = mul(%5, %6) : f32[2, {sk}]{at}",
             f"  %8 = reshape(%7) {{shape=[2, 1, 1, {sk}]}} : f32[2, 1, 1, {sk}]{at}"]
    nid = 9
    heads = {}
    for name, src, s in (("q", 0, sq), ("k", 1, sk), ("v", 1, sk)):
        lines.append(f'  %{nid} = param {{name="{name}_proj.weight"}} : f32[16, 16]{at}')
        lines.append(f"  %{nid + 1} = matmul(%{src}, %{nid}) : f32[2, {s}, 16]{at}")
        val = nid + 1
        nid += 2
        if bias:
            lines.append(f'  %{nid} = param {{name="{name}_proj.bias"}} : f32[16]{at}')
            lines.append(f"  %{nid + 1} = add(%{val}, %{nid}) : f32[2, {s}, 16]{at}")
            val = nid + 1
            nid += 2
        lines.append(f"  %{nid} = reshape(%{val}) {{shape=[2, {s}, 2, 8]}} : f32[2, {s}, 2, 8]{at}")
        lines.append(f"  %{nid + 1} = transpose(%{nid}) {{perm=[0, 2, 1, 3]}} : f32[2, 2, {s}, 8]{at}")
        heads[name] = nid + 1
        nid += 2
    lines += [f"  %{nid} = transpose(%{heads['k']}) {{perm=[0, 1, 3, 2]}} : f32[2, 2, 8, {sk}]{at}",
              f"  %{nid + 1} = matmul(%{heads['q']}, %{nid}) : f32[2, 2, {sq}, {sk}]{at}",
              f"  %{nid + 2} = const {{value=2.8284271247461903}} : f32[]{at}",
              f"  %{nid + 3} = div(%{nid + 1}, %{nid + 2}) : f32[2, 2, {sq}, {sk}]{at}",
              f"  %{nid + 4} = add(%{nid + 3}, %8) : f32[2, 2, {sq}, {sk}]{at}",
              f"  %{nid + 5} = softmax(%{nid + 4}) {{axis=-1}} : f32[2, 2, {sq}, {sk}]{at}",
              f"  %{nid + 6} = matmul(%{nid + 5}, %{heads['v']}) : f32[2, 2, {sq}, 8]{at}",
              f"  %{nid + 7} = transpose(%{nid + 6}) {{perm=[0, 2, 1, 3]}} : f32[2, {sq}, 2, 8]{at}",
              f"  %{nid + 8} = reshape(%{nid + 7}) {{shape=[2, {sq}, 16]}} : f32[2, {sq}, 16]{at}",
              f'  %{nid + 9} = param {{name="out_proj.weight"}} : f32[16, 16]{at}',
              f"  %{nid + 10} = matmul(%{nid + 8}, %{nid + 9}) : f32[2, {sq}, 16]{at}",
              f"  return %{nid + 10}"]
    return "graph cross {\n" + "\n".join(lines) + "\n}\n"


@pytest.mark.parametrize("variant", ["case", "sq6", "no_bias"])
def test_cross_attention_packs_attention_and_the_block_refuses_naming_the_inputs(capsys, tmp_path, variant):
    src = {"case": None, "sq6": lambda: _cross(6, True), "no_bias": lambda: _cross(3, False)}[variant]
    path = next(CASES.glob("n3-09-*.rlx"))
    if src is not None:
        path = tmp_path / "g.ir"
        path.write_text(src())
    g = parse_ir(path.read_text())
    t = equal_numbers(g)
    assert ops(t.final).get("attention") == 1 and "FusedAttentionBlock" not in ops(t.final)
    assert check_fusion(t).ok and not [m for m in missed_fusions(t) if m.pattern.startswith("fuse_attention_block")]
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0, out
    assert "self_attention [the model's own term]: Q and K/V come from different inputs" in out
    assert "hidden_states" in out and "encoder_hidden_states" in out
    assert "had no candidate here" not in out


# -- an f16 / bf16 RMSNorm wrapped in its f32 casts ---------------------------------------------------

def _rms_casts(dtype: str = "f16", gamma_first: bool = True, residual: bool = True, eps: str = "1e-06",
               extra_reader: bool = False) -> str:
    """HF LlamaRMSNorm in a half-precision model: cast to f32, statistics and normalization in f32, cast back,
    times the half-precision weight."""
    at = " @model.layers.0.post_attention_layernorm"
    x = "%2" if residual else "%0"
    mul = "mul(%11, %10)" if gamma_first else "mul(%10, %11)"
    lines = [f'  %0 = input {{name="hidden_states"}} : {dtype}[2, 4, 32]',
             f'  %1 = input {{name="residual"}} : {dtype}[2, 4, 32]',
             f"  %2 = add(%0, %1) : {dtype}[2, 4, 32]{at}",
             f'  %3 = cast({x}) {{dtype="f32"}} : f32[2, 4, 32]{at}',
             f"  %4 = mul(%3, %3) : f32[2, 4, 32]{at}",
             f"  %5 = reduce_mean(%4) {{axes=[2], keepdims=true}} : f32[2, 4, 1]{at}",
             f"  %6 = const {{value={eps}}} : f32[]{at}",
             f"  %7 = add(%5, %6) : f32[2, 4, 1]{at}",
             f"  %8 = rsqrt(%7) : f32[2, 4, 1]{at}",
             f"  %9 = mul(%3, %8) : f32[2, 4, 32]{at}",
             f'  %10 = cast(%9) {{dtype="{dtype}"}} : {dtype}[2, 4, 32]{at}',
             f'  %11 = param {{name="post_attention_layernorm.weight"}} : {dtype}[32]{at}',
             f"  %12 = {mul} : {dtype}[2, 4, 32]{at}"]
    out = "%12"
    if extra_reader:
        lines.append(f"  %13 = neg(%10) : {dtype}[2, 4, 32]{at}")
        out += ", %13"
    return "graph rms_casts {\n" + "\n".join(lines) + f"\n  return {out}\n}}\n"


def _half_numbers(g: Graph, t, scale: float = 1.0):
    """Every version within f16/bf16 tolerance of the unfused graph on reference and MLX (inputs times `scale`)."""
    rng = np.random.default_rng(1)
    feeds = {n.name: (scale * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.inputs}
    w = {n.name: (1.0 + 0.2 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    ref = run_reference(g, feeds, w)
    tol = 1e-2 if "bf16" in str(g.inputs[0].dtype) else 2e-3
    for label, v in t.versions()[1:]:
        for run in (run_reference, run_mlx):
            for a, b in zip(ref, run(v, feeds, w), strict=True):
                np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64), rtol=tol,
                                           atol=tol, err_msg=f"{label} on {run.__name__}")


@pytest.mark.parametrize("source", ["case", "bf16_x_times_w", "f16_no_residual"])
def test_half_rmsnorm_casts_absorbed_with_f32_statistics(source):
    src = {"case": None, "bf16_x_times_w": _rms_casts("bf16", gamma_first=False),
           "f16_no_residual": _rms_casts("f16", residual=False)}[source]
    g = case("16-f16-rmsnorm-casts") if src is None else parse_ir(src)
    t = Pipeline.canonical().run(g)
    assert not [s.error for s in t.steps if s.error]
    assert "cast" not in ops(t.final) and "mul" not in ops(t.final)  # both casts and the gamma multiply absorbed
    want = "FusedResidualRmsNorm" if source != "f16_no_residual" else "rms_norm"
    assert ops(t.final).get(want) == 1, ops(t.final)
    norm = next(n for n in t.final if n.op.value == want)
    assert norm.dtype == g.inputs[0].dtype  # in x's dtype: the kernel keeps the statistics in f32
    assert any(m.rule == "canonicalize_norm.rms_norm_casts" for s in t.steps for m in s.matches)
    for scale in (1.0, 300.0):  # large magnitudes: the squares overflow f16, the f32 statistics do not
        _half_numbers(g, t, scale)


@pytest.mark.parametrize("kw, fragment", [({"extra_reader": True}, "has another reader"),
                                          ({"eps": "1e-09"}, "rounds to 0 in f16")])
def test_half_rmsnorm_casts_left_are_named(capsys, tmp_path, kw, fragment):
    path = tmp_path / "g.ir"
    path.write_text(_rms_casts("f16", **kw))
    g = parse_ir(path.read_text())
    t = Pipeline.canonical().run(g)
    (r,) = [r for s in t.steps for r in s.rejections if r.guard == "casts_absorbable"]
    assert fragment in r.message and "wrapped in casts that stay" in r.message
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 1 and "casts_absorbable" in out and fragment in out
    _half_numbers(g, t)


# -- RoPE on the heads, QK-norm: named refusals, no false blame -------------------------------------------

def _rope_variant(k_only: bool = False, concat_order: str = "neg_first") -> str:
    """n3-01 with the rotation on K only (Q plain), or rotate_half written with the other operand order of the
    add (`rot * sin + q * cos`)."""
    src = next(CASES.glob("n3-01-*.rlx")).read_text()
    if k_only:  # Q's scores operand is the plain head split (%21)
        src = src.replace("  %41 = matmul(%28, %40)", "  %41 = matmul(%21, %40)")
    if concat_order == "sum_swapped":
        src = src.replace("  %28 = add(%22, %27)", "  %28 = add(%27, %22)").replace("  %37 = add(%31, %36)",
                                                                                     "  %37 = add(%36, %31)")
    return src


@pytest.mark.parametrize("variant", ["case", "k_only", "sum_swapped"])
def test_rope_on_heads_is_recognized_and_the_numbers_kept(capsys, tmp_path, variant):
    """n3-01: the rotation becomes the rope op (fuse_sdpa.rope_heads) and the block's rope; on K only, the attention
    packs reading the rotated K and the block refuses naming it (tests/test_rope_heads.py has the other forms)."""
    path = next(CASES.glob("n3-01-*.rlx"))
    if variant != "case":
        path = tmp_path / "g.ir"
        path.write_text(_rope_variant(k_only=variant == "k_only",
                                      concat_order="sum_swapped" if variant == "sum_swapped" else "neg_first"))
    g = parse_ir(path.read_text())
    t = equal_numbers(g)
    assert any(m.rule == "fuse_sdpa.rope_heads" for s in t.steps for m in s.matches)
    assert not [r for r in t.rejections if r.guard == "rope_on_heads"]
    code, out, _ = cli_run(capsys, "explain", path)
    if variant == "k_only":
        assert ops(t.final).get("attention") == 1 and ops(t.final).get("rope") == 1
        # no change to the model keeps its numbers: a gap in rlxviz's ops (the block rotates Q and K together)
        assert code == 0 and "rotates K only" in out, out
        assert ("rlxviz's ops lack: FusedAttentionBlock with RoPE on Q or K alone (fuse_attention_block."
                "qkv_attention_out: rope_q_and_k)") in out
    else:
        (blk,) = [n for n in t.final if n.op == Op.FUSED_ATTENTION_BLOCK]
        assert blk.attrs["has_rope"] and code == 0, out


def test_case_01c_rope_op_becomes_the_blocks_rope_without_false_blame(capsys):
    t = equal_numbers(case("01c-rope-op-control"))
    (blk,) = [n for n in t.final if n.op == Op.FUSED_ATTENTION_BLOCK]
    assert blk.attrs["has_rope"]
    code, out, _ = cli_run(capsys, "explain", next(CASES.glob("n3-01c-*.rlx")))
    assert code == 0 and "1/1 layer(s) fused as expected" in out and "had no candidate here" not in out


@pytest.mark.parametrize("where", ["case", "k_only"])
def test_case_04b_qk_norm_packs_attention_and_names_the_norm_without_false_blame(capsys, tmp_path, where):
    path = next(CASES.glob("n3-04b-*.rlx"))
    if where == "k_only":  # the norm on K only: Q reads the projection directly
        path = tmp_path / "g.ir"
        path.write_text(path_text := next(CASES.glob("n3-04b-*.rlx")).read_text().replace(
            "  %30 = reshape(%21)", "  %30 = reshape(%9)"))
        assert "reshape(%9)" in path_text
    t = equal_numbers(parse_ir(path.read_text()))
    assert ops(t.final).get("attention") == 1  # packed attention reading the normed Q/K
    code, out, _ = cli_run(capsys, "explain", path)
    assert "rms_norm (node" in out and "qkv_packed" in out
    assert "had no candidate here" not in out


def test_folded_heads_bias_of_lower_rank_keeps_its_numbers():
    """A bias shared by every (batch, head) pair, `[S, S]`, broadcast over the folded batch: lifted as an operand
    (the lift adds node ids, never reads one as a number), numbers equal."""
    src = next(CASES.glob("n3-08w-*.rlx")).read_text()
    src = src.replace('{name="position_bias"} : f32[4, 4, 4]', '{name="position_bias"} : f32[4, 4]')
    t = equal_numbers(parse_ir(src))
    assert ops(t.final).get("attention") == 1
