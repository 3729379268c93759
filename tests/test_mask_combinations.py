"""Every mask combination `fuse_sdpa` accepts keeps the unfused numbers, fully masked rows and left padding included
(issue 38, case n4-03: Llama 4's chunked attention, a bool `where` after the padding-mask add).

The rewrite of `where(cond, s + bias, fill)` used to emit the operand `bias + where(cond, 0, fill)`, which adds the
padding mask's `finfo.min` to the where's `finfo.min` and overflows to -inf (0.45 off on a fully masked row); it now
emits `where(cond, bias, fill)` (`where_mask.biased_operand`). The combinations: an additive padding mask (Hugging
Face's `(1 - m) * fill`, fill finfo.min or -1e4), an additive band (sliding window), both summed, each alone or
before a bool `where` whose condition is per key, causal, chunked (block-diagonal causal), per head, or a `[B, 1, S,
S]` input; f32 and f16. Inputs: fully masked rows, left padding, holes. In f16, s + finfo(f16).min rounds to the
fill only for |s| < 16, so a where becomes an additive operand only where no row can be fully masked (guard
`where_mask_rows`); the other f16 combinations stay primitives, with their numbers.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from clirun import run
from hypothesis import given, settings
from hypothesis import strategies as st

from rlxviz.ir import Builder, DType, Graph, Op, format_graph, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions

CASES = Path(__file__).parent / "data" / "cases"
N403 = CASES / "n4-03-chunked-attn-llama4.rlx"
B, S, H, NH = 2, 8, 16, 2
DH = H // NH
NP = {"f32": np.float32, "f16": np.float16}

_causal = np.tril(np.ones((S, S), bool))
_chunk = _causal & (np.arange(S)[:, None] // 4 == np.arange(S)[None, :] // 4)  # Llama 4: chunks of 4 tokens
_window = _causal & (np.arange(S)[:, None] - np.arange(S)[None, :] < 3)  # a sliding window of 3
CONDS = {
    "per_key": None,  # the padding mask itself as a bool [B, 1, 1, S]
    "causal": _causal[None, None],
    "chunked": _chunk[None, None],
    "per_head": np.stack([_causal, _window])[None],
    "input": None,  # a bool [B, 1, S, S] input (causal and padding combined)
    "empty_row": (_causal & (np.arange(S)[:, None] != 3))[None, None],  # a constant table whose query 3 keeps no key
}
MASKS = {
    "fully_masked": np.array([[0] * S, [0, 0, 0, 0, 0, 1, 1, 1]]),
    "left_padding": np.array([[1] * S, [0, 0, 0, 0, 0, 1, 1, 1]]),
    "holes": np.array([[1, 0, 1, 0, 0, 1, 0, 1], [0, 1, 1, 0, 1, 0, 0, 0]]),
}


def lowest(dtype: str) -> float:
    return float(np.finfo(NP[dtype]).min)


def chunked_attention(dtype: str = "f32", pad: str | None = "hf", band: bool = False, cond: str | None = "chunked",
                      pad_fill: float | None = None) -> Graph:
    """softmax(where(cond, q k^T / sqrt(d) + bias, finfo.min)) @ v with heads [B, NH, S, DH] in `dtype`.

    `pad`: None, "hf" (Hugging Face's `reshape((1 - cast(m)) * pad_fill, [B, 1, 1, S])`, pad_fill default the
    dtype's finfo.min) or "where" (torch.onnx's `+ where(keep, 0, finfo.min)`, added after the band: T5's
    `(s + band) + where(...)`, `canonicalize_exported.bias_then_mask`); `band`: a constant additive sliding-window
    band `[1, 1, S, S]` (0 / finfo.min) added too; `cond`: None (no where: the additive terms alone) or a `CONDS`
    key."""
    dt, low = DType(dtype), lowest(dtype)
    b = Builder(f"masks_{dtype}_{pad}_{band}_{cond}")
    x = b.input("x", (B, S, H), dt)
    m = b.input("attention_mask", (B, S), DType.i64)

    def heads(name: str) -> int:
        t = b.matmul(x, b.param(f"{name}.weight", (H, H), dt))
        return b.transpose(b.reshape(t, (B, S, NH, DH)), (0, 2, 1, 3))

    q, k, v = heads("q"), heads("k"), heads("v")
    s = b.div(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), b.const(float(np.sqrt(DH)), dt))
    terms = []
    if pad == "hf":
        fill = b.const(low if pad_fill is None else pad_fill, dt)
        terms.append(b.reshape(b.mul(b.sub(b.const(1.0, dt), b.cast(m, dt)), fill), (B, 1, 1, S)))
    if band:
        terms.append(b.const(np.where(_window, 0.0, low)[None, None].tolist(), dt))
    if pad == "where":  # torch.onnx's padding mask, after the band when there is one: (s + band) + where(...)
        keep = b.reshape(b.cast(m, DType.bool), (B, 1, 1, S))
        for t in terms:
            s = b.add(s, t)
        s = b.add(s, b.where(keep, b.const(0.0, dt), b.const(low, dt)))
    else:
        bias = terms[0] if len(terms) == 1 else b.add(terms[0], terms[1]) if terms else None
        if bias is not None:
            s = b.add(s, bias)
    if cond is not None:
        if cond == "per_key":
            c = b.reshape(b.cast(m, DType.bool), (B, 1, 1, S))
        elif cond == "input":
            c = b.input("keep4", (B, 1, S, S), DType.bool)
        else:
            c = b.const(CONDS[cond].tolist(), DType.bool)
        s = b.where(c, s, b.const(low, dt))
    ctx = b.reshape(b.transpose(b.matmul(b.softmax(s, -1), v), (0, 2, 1, 3)), (B, S, H))
    b.output(b.matmul(ctx, b.param("o.weight", (H, H), dt)))
    return b.build()


def feeds_for(g: Graph, mask: np.ndarray, rng: np.random.Generator, magnitude: float = 1.0) -> dict[str, np.ndarray]:
    """x ~ N(0, magnitude) in the graph's dtype; `keep4` (when an input) the causal table and the padding mask."""
    dt = NP[g.inputs[0].dtype.value]
    f = {"x": (rng.standard_normal((B, S, H)) * magnitude).astype(dt), "attention_mask": mask.astype(np.int64)}
    if any(n.name == "keep4" for n in g.inputs):
        f["keep4"] = _causal[None, None] & (mask[:, None, None, :] > 0)
    return f


def weights_for(g: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {p.name: (rng.standard_normal(p.shape) / np.sqrt(p.shape[0])).astype(NP[p.dtype.value]) for p in g.params}


def assert_versions_equal(g: Graph, feeds: dict[str, np.ndarray], w: dict[str, np.ndarray], mlx: bool = False) -> None:
    """Every pipeline version's outputs equal the unfused graph's (NaN where it is NaN), on the reference
    interpreter and, with `mlx`, on MLX's sdpa and composed attention against the unfused graph on MLX."""
    tol = 1e-5 if g.inputs[0].dtype == DType.f32 else 1e-2  # f16: `rlxviz time`'s same-dtype tolerance
    with np.errstate(all="ignore"):
        want = run_reference(g, feeds, w)[0]
        versions = Pipeline.canonical().run(g).versions()[1:]
        for label, v in versions:
            np.testing.assert_allclose(run_reference(v, feeds, w)[0].astype(np.float64), want.astype(np.float64),
                                       rtol=tol, atol=tol, err_msg=f"{g.name} {label} (reference)")
    if mlx:
        for opts in (LoweringOptions(attention="sdpa", fast_math=False), LoweringOptions(attention="composed")):
            base = np.asarray(MlxExecutor(opts).run(g, feeds, w)[0]).astype(np.float64)
            got = np.asarray(MlxExecutor(opts).run(versions[-1][1], feeds, w)[0]).astype(np.float64)
            np.testing.assert_allclose(got, base, rtol=5 * tol, atol=5 * tol,
                                       err_msg=f"{g.name} {versions[-1][0]} (MLX {opts.attention})")


def packs(dtype: str, pad: str | None, band: bool, cond: str | None) -> bool:
    """Whether fuse_sdpa packs the combination (else the numbers are kept by leaving it as primitives):
    canonicalize_exported rewrites torch.onnx's (s + band) + where(keep, 0, min) for f32 scores only (scores_f32);
    in f16 a where becomes an additive operand only where no row can be fully masked (where_mask_rows: no term
    before it and a constant condition keeping a key in every row); f32's s + where(keep, 0, min) under a where
    becomes two nested wheres (where_bias), one additive operand (where_mask.nested_operand)."""
    if (dtype, pad, band) == ("f16", "where", True):
        return False
    if dtype == "f16" and cond is not None:
        return not (pad or band) and cond not in ("input", "empty_row")
    return True


COMBOS = [(d, p, bd, c) for d, p, bd, c in itertools.product(("f32", "f16"), (None, "hf", "where"), (False, True),
                                                              (None, *CONDS)) if p or bd or c]


@pytest.mark.parametrize("dtype, pad, band, cond", COMBOS)
def test_every_mask_combination_packs_and_keeps_the_numbers(dtype, pad, band, cond):
    """The attention packs (one attention op) and every version equals the unfused graph on a fully masked row,
    left padding and holes, on the reference and on MLX."""
    g = chunked_attention(dtype, pad, band, cond)
    fused = dict(Pipeline.canonical().run(g).versions())["after fuse_sdpa"]
    packed = [n.op for n in fused if n.op == Op.ATTENTION] == [Op.ATTENTION]
    assert packed == packs(dtype, pad, band, cond)
    rng = np.random.default_rng(7)
    w = weights_for(g, rng)
    for name, mask in MASKS.items():
        assert_versions_equal(g, feeds_for(g, mask, rng), w, mlx=name == "fully_masked")


def test_padding_plus_where_operand_never_sums_two_fills():
    """The operand of where(cond, s + pad, fill) is where(cond, pad, fill): finite everywhere, so a fully masked row
    is uniform (the mean of V) as in the unfused graph, not NaN or a row over other keys."""
    g = chunked_attention()
    (att,) = [n for n in Pipeline(["fuse_sdpa"]).run(g).final if n.op == Op.ATTENTION]
    fused = Pipeline(["fuse_sdpa"]).run(g).final
    operand = fused[att.inputs[3]]
    assert att.attrs["mask"] == "additive" and operand.op == Op.WHERE
    rng = np.random.default_rng(0)
    f, w = feeds_for(g, MASKS["fully_masked"], rng), weights_for(g, rng)
    want = run_reference(g, f, w)[0]
    assert np.isfinite(want).all()
    np.testing.assert_allclose(run_reference(fused, f, w)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fill", [-1e4, -1e9])
def test_other_padding_fills_before_the_where_keep_the_numbers(fill):
    """HF's mask with a fill other than finfo.min (-1e4 as older BERTs, -1e9) before a chunked where."""
    g = chunked_attention("f32", "hf", False, "chunked", pad_fill=fill)
    rng = np.random.default_rng(2)
    w = weights_for(g, rng)
    for mask in MASKS.values():
        assert_versions_equal(g, feeds_for(g, mask, rng, magnitude=3.0), w)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(dtype=st.sampled_from(["f32", "f16"]), pad=st.sampled_from([None, "hf", "where"]), band=st.booleans(),
       cond=st.sampled_from([None, *CONDS]), seed=st.integers(0, 2**16), keep_p=st.floats(0.0, 1.0),
       left=st.integers(0, S), magnitude=st.floats(0.1, 4.0))
def test_random_masks_over_every_combination_keep_the_numbers(dtype, pad, band, cond, seed, keep_p, left, magnitude):
    """Random keep masks (any row may be fully masked) with `left` padded positions in row 1, scores up to std 16
    in f32 and 2.25 in f16 (the scale 1/sqrt(8) rounds in f16 at another step than the unfused div: `rlxviz
    time`'s f16 tolerance)."""
    if not (pad or band or cond):
        cond = "chunked"
    if dtype == "f16":  # f16 scores ~ N(0, magnitude^4): past ~2 the two forms' rounding of the scale alone moves
        magnitude = min(magnitude, 1.5)  # softmax by more than the tolerance (the refusals test large f16 scores)
    g = chunked_attention(dtype, pad, band, cond)
    rng = np.random.default_rng(seed)
    mask = (rng.random((B, S)) < keep_p).astype(np.int64)
    mask[1, :left] = 0
    assert_versions_equal(g, feeds_for(g, mask, rng, magnitude), weights_for(g, rng))


@pytest.mark.parametrize("npz", ["n4-03-masked.npz", "n4-03-leftpad5.npz"])
def test_n4_03_time_shows_every_version_ok(capsys, npz):
    """`rlxviz time` on the handed case with its inputs (and the battery): every version ok, exit 0."""
    import json

    code, out, err = run(capsys, "time", N403, "--inputs", CASES / npz, "--repeat", 1, "--warmup", 0, "--json")
    assert code == 0, out + err
    versions = json.loads(out)["versions"]
    assert [v["label"] for v in versions if v["same_as"] is None and v["ok"] is not True] == []
    assert any(v["label"] == "after fuse_sdpa" and v["same_as"] is None for v in versions)


def test_n4_03_fuses_with_one_additive_operand():
    """The case packs its attention with the padding mask and the chunk table in one additive operand."""
    g = parse_ir(N403.read_text())
    fused = Pipeline(["fuse_sdpa"]).run(g).final
    (att,) = [n for n in fused if n.op == Op.ATTENTION]
    assert att.attrs["mask"] == "additive"
    z = np.load(CASES / "n4-03-masked.npz")
    f = {k: z[k] for k in z.files}
    rng = np.random.default_rng(0)
    w = {p.name: (rng.standard_normal(p.shape) / 8).astype(np.float32) for p in g.params}
    np.testing.assert_allclose(run_reference(fused, f, w)[0], run_reference(g, f, w)[0], rtol=1e-5, atol=1e-6)


def _old_operand(c, rw):
    """The operand before issue 38: bias + where(cond, 0, fill) (sums two finfo.min fills to -inf)."""
    from rlxviz.passes.rules import where_mask

    return rw.emit(Op.ADD, [c.id("bias"), where_mask.additive_operand(c, rw)])


@pytest.fixture
def old_operand(monkeypatch):
    """fuse_sdpa with the old overflowing operand, and no cached pipeline run to hide it."""
    from rlxviz.passes.rules import where_mask
    from rlxviz.session import pipeline as session_pipeline

    monkeypatch.setattr(where_mask, "biased_operand", _old_operand)
    monkeypatch.setattr(session_pipeline, "TRACES", type(session_pipeline.TRACES)(maxsize=4))


def test_explain_fails_naming_the_pass_that_changed_the_numbers(capsys, old_operand):
    """explain runs the fully masked and left-padded rows: a pass whose rewrite is stated exact but changes the
    numbers is a failed check (exit 1) naming the pass, in the text and in --json."""
    import json

    code, out, err = run(capsys, "explain", N403)
    assert code == 1, out + err
    line = next(ln for ln in out.splitlines() if ln.startswith("numbers:"))
    assert "after fuse_sdpa DIFFERS from the unfused graph on fully_masked_row" in line
    assert "fuse_sdpa changed the numbers" in line
    code, out, _ = run(capsys, "explain", N403, "--json")
    got = json.loads(out)["numeric_check"]
    assert code == 1 and not got["ok"] and got["changed"][0]["pass"] == "fuse_sdpa"


def test_explain_checks_the_numbers_of_the_fixed_case(capsys):
    """The case now: exit 0, and --verbose says which versions were compared on which inputs."""
    code, out, err = run(capsys, "explain", N403, "--verbose")
    assert code == 0, out + err
    assert "version(s) equal the unfused graph on fully_masked_row, left_padding" in out


@pytest.mark.parametrize("cond", ["per_head", "input"])
def test_explain_catches_the_old_operand_on_variants(capsys, tmp_path, old_operand, cond):
    """Two more graphs of the kind (padding mask, then a per-head or a [B, 1, S, S] input where): the numeric
    check fails them under the old operand, naming fuse_sdpa."""
    path = tmp_path / f"v-{cond}.rlx"
    path.write_text(format_graph(chunked_attention("f32", "hf", False, cond)))
    code, out, err = run(capsys, "explain", path)
    assert code == 1 and "fuse_sdpa changed the numbers" in out, out + err


def test_nested_where_masks_pack_as_one_operand_and_refuse_another_inner_fill():
    """where(chunk, where(keep, s, fill2), min): one additive operand when fill2 is finfo.min too; with fill2 = -1e4
    (s + -1e4 is not -1e4) the attention is refused by where_mask_fill naming the inner fill."""
    from rlxviz.passes.guard import MODEL_TERM

    def graph(fill2: float) -> Graph:
        b = Builder("nested")
        x = b.input("x", (B, S, H))
        m = b.input("attention_mask", (B, S), DType.i64)

        def heads(name: str) -> int:
            return b.transpose(b.reshape(b.matmul(x, b.param(f"{name}.weight", (H, H))), (B, S, NH, DH)), (0, 2, 1, 3))

        q, k, v = heads("q"), heads("k"), heads("v")
        s = b.div(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), b.const(float(np.sqrt(DH))))
        s = b.where(b.reshape(b.cast(m, DType.bool), (B, 1, 1, S)), s, b.const(fill2))
        s = b.where(b.const(_chunk[None, None].tolist(), DType.bool), s, b.const(lowest("f32")))
        b.output(b.reshape(b.transpose(b.matmul(b.softmax(s, -1), v), (0, 2, 1, 3)), (B, S, H)))
        return b.build()

    g = graph(lowest("f32"))
    trace = Pipeline.canonical().run(g)
    (att,) = [n for n in dict(trace.versions())["after fuse_sdpa"] if n.op == Op.ATTENTION]
    assert att.attrs["mask"] == "additive"
    (note,) = [r for r in trace.rejections if r.rule == "fuse_sdpa.hf_attention"]
    assert note.guard == "where_mask_additive" and note.kind == MODEL_TERM and "two where-masks" in note.message
    rng = np.random.default_rng(4)
    w = weights_for(g, rng)
    for mask in MASKS.values():
        assert_versions_equal(g, feeds_for(g, mask, rng, magnitude=2.0), w, mlx=True)
    g = graph(-1e4)
    trace = Pipeline.canonical().run(g)
    assert not [n for n in trace.final if n.op == Op.ATTENTION]
    (r,) = [r for r in trace.rejections if r.guard == "where_mask_fill"]
    assert "-10000" in r.message and g[r.subject].op == Op.CONST
    for mask in MASKS.values():
        assert_versions_equal(g, feeds_for(g, mask, rng), w)


@pytest.mark.parametrize("pad, cond, subject", [("hf", "chunked", "bias"), (None, "input", "cond"),
                                                (None, "empty_row", "cond")])
def test_f16_where_that_can_mask_a_whole_row_is_refused_naming_why(pad, cond, subject):
    """In f16, s + finfo(f16).min is the fill only for |s| < 16: a where that a padding term, an input condition or an
    empty table row can make fully masked stays primitives (where_mask_rows, illegal), naming the node; large
    scores keep their numbers."""
    g = chunked_attention("f16", pad, False, cond)
    trace = Pipeline.canonical().run(g)
    assert not [n for n in trace.final if n.op == Op.ATTENTION]
    (r,) = [r for r in trace.rejections if r.guard == "where_mask_rows"]
    where = next(n for n in g if n.op == Op.WHERE and g[n.inputs[2]].op == Op.CONST and n.rank == 4)
    want = g[where.inputs[1]].inputs[1] if subject == "bias" else where.inputs[0]
    assert r.subject == want and "|s| < 16" in r.message and f"node {want}" in r.message
    assert r.fix and "nothing to change in the model" in r.hint
    rng = np.random.default_rng(9)
    w = weights_for(g, rng)
    assert_versions_equal(g, feeds_for(g, MASKS["fully_masked"], rng, magnitude=6.0), w)


@pytest.mark.parametrize("attention", ["sdpa", "composed"])
def test_f16_keep_mask_on_mlx_keeps_a_fully_masked_row_uniform_for_large_scores(attention):
    """The keep mask's MLX lowering in f16 selects (a bool mask / where) instead of adding finfo(f16).min, which is the
    fill only for |s| < 16: with scores far past that a fully masked row is the mean of V, as the unfused where."""
    g = chunked_attention("f16", None, False, "per_key")
    fused = Pipeline.canonical().run(g).final
    (att,) = [n for n in dict(Pipeline.canonical().run(g).versions())["after fuse_sdpa"] if n.op == Op.ATTENTION]
    assert att.attrs["mask"] == "keep"
    rng = np.random.default_rng(1)
    w = weights_for(g, rng)
    f = feeds_for(g, MASKS["fully_masked"], rng, magnitude=6.0)
    opts = LoweringOptions(attention=attention, fast_math=False)
    want = np.asarray(MlxExecutor(opts).run(g, f, w)[0]).astype(np.float64)
    got = np.asarray(MlxExecutor(opts).run(fused, f, w)[0]).astype(np.float64)
    np.testing.assert_allclose(got[0], want[0], rtol=2e-3, atol=2e-3)  # row 0: every key masked


@pytest.mark.parametrize("mask", [np.zeros((2, 8), np.int64),  # every row of every batch fully masked
                                  np.array([[0, 0, 0, 0, 0, 0, 0, 1], [1, 0, 1, 0, 0, 0, 0, 1]])])  # left pad 7, holes
def test_n4_03_time_with_more_inputs_of_the_kind(capsys, tmp_path, mask):
    """Two more input files of the case's kind (written here): every version ok under `rlxviz time`, exit 0."""
    import json

    rng = np.random.default_rng(5)
    path = tmp_path / "inputs.npz"
    np.savez(path, hidden_states=(rng.standard_normal((2, 8, 64)) * 3).astype(np.float32), attention_mask=mask)
    code, out, err = run(capsys, "time", N403, "--inputs", path, "--repeat", 1, "--warmup", 0, "--no-battery",
                         "--json")
    assert code == 0, out + err
    assert [v["label"] for v in json.loads(out)["versions"] if v["same_as"] is None and v["ok"] is not True] == []
