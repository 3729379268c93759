"""RoPE written on the heads (issue 21, case n3-01): Hugging Face's `q * cos + rotate_half(q) * sin` after the head
split is rewritten to the rope op on the projection (`fuse_sdpa.rope_heads`, bit-exact on the reference), so the
attention packs and FusedAttentionBlock takes the rotation (`has_rope=True`) as for the rope-op control (n3-01c);
partial rotary becomes `rope(n_rot=r)` and the block refuses it by name, as a rotation of K alone; tables gathered
by position ids are rewritten too (exact for any ids); a table whose halves differ is no rotation and stays named
(`rope_on_heads`). Every version keeps the numbers on every input
set of the battery, on the reference and on MLX."""

from pathlib import Path

import numpy as np
import pytest
from clirun import run as cli_run
from test_unwritten_forms import equal_numbers, ops, random_feeds

from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.rules.rope_heads import RULE, rope_heads
from rlxviz.runtime import run_reference
from rlxviz.runtime.battery import battery
from rlxviz.runtime.executor import run_mlx
from rlxviz.session.status import check_fusion

CASES = Path(__file__).parent / "data" / "cases"
AT = " @model.layers.0.self_attn"


def rope_attention(n_rot: int = 16, k_only: bool = False, swapped: bool = False, gathered: bool = False,
                   table_rank: int = 4, duplicated: bool = True, interleaved: bool = False,
                   two_tables: bool = False) -> str:
    """One LLaMA-style attention (4 heads of 16, S = 8, a padding keep mask) with RoPE written on the heads over
    the first `n_rot` dims of each head; `swapped`: every product and the sum in the other operand order;
    `gathered`: the tables read by `gather(table, position_ids)`; `table_rank`: the duplicated table's view;
    `duplicated=False`: a full `[S, n_rot]` table whose halves differ (not a rotation: no rope op computes it);
    `interleaved`: GPT-J's rotate_every_two (pairs h[2i], h[2i+1]) with full `[S, d]` tables; `two_tables`: K rotated
    by a cos/sin pair of its own (params `rotary_emb_k.*`): two tables, which the block's RoPE cannot take."""
    half = n_rot // 2
    lines = ['  %0 = input {name="hidden_states"} : f32[2, 8, 64]', '  %1 = input {name="attention_mask"} : i64[2, 8]']
    if gathered:
        lines.append('  %2 = input {name="position_ids"} : i64[8]')
    nid = [3]

    def emit(text: str) -> str:
        ref = f"%{nid[0]}"
        lines.append(f"  {ref} = {text}{AT}")
        nid[0] += 1
        return ref

    c = emit('cast(%1) {dtype="f32"} : f32[2, 8]')
    one = emit("const {value=1.0} : f32[]")
    inv = emit(f"sub({one}, {c}) : f32[2, 8]")
    fill = emit("const {value=-3.4028234663852886e+38} : f32[]")
    ext = emit(f"mul({inv}, {fill}) : f32[2, 8]")
    mask = emit(f"reshape({ext}) {{shape=[2, 1, 1, 8]}} : f32[2, 1, 1, 8]")
    proj = {}
    for t in "qkv":
        w = emit(f'param {{name="{t}_proj.weight"}} : f32[64, 64]')
        proj[t] = emit(f"matmul(%0, {w}) : f32[2, 8, 64]")
    def make_tables(prefix: str) -> dict[str, str]:
        tables = {}
        for name in ("cos", "sin"):
            if gathered:
                full = emit(f'param {{name="{prefix}.{name}_cached"}} : f32[32, {half}]')
                tab = emit(f"gather({full}, %2) {{axis=0}} : f32[8, {half}]")
            else:
                tab = emit(f'param {{name="{prefix}.{name}_cached"}} : f32[8, {half}]')
            dup = (emit(f"concat({tab}, {tab}) {{axis=1}} : f32[8, {n_rot}]") if duplicated and not interleaved
                   else emit(f'param {{name="{prefix}.{name}_full"}} : f32[8, {n_rot}]'))
            view = [1, 1, 8, n_rot] if table_rank == 4 else [1, 8, n_rot]
            tables[name] = emit(f"reshape({dup}) {{shape={view}}} : f32{view}")
        return tables

    q_tables = make_tables("rotary_emb")
    k_tables = make_tables("rotary_emb_k") if two_tables else q_tables

    def heads(t: str) -> str:
        r = emit(f"reshape({proj[t]}) {{shape=[2, 8, 4, 16]}} : f32[2, 8, 4, 16]")
        return emit(f"transpose({r}) {{perm=[0, 2, 1, 3]}} : f32[2, 4, 8, 16]")

    def rotate(h: str, tables: dict[str, str]) -> str:
        part = h if n_rot == 16 else emit(f"narrow({h}) {{axis=3, start=0, length={n_rot}}} : f32[2, 4, 8, {n_rot}]")
        ty = f"f32[2, 4, 8, {n_rot}]"
        a = f"mul({tables['cos']}, {part})" if swapped else f"mul({part}, {tables['cos']})"
        plain = emit(f"{a} : {ty}")
        if interleaved:  # rotate_every_two: reshape to pairs, (-x2, x1) per pair, back
            pairs = emit(f"reshape({part}) {{shape=[2, 4, 8, {half}, 2]}} : f32[2, 4, 8, {half}, 2]")
            x1 = emit(f"narrow({pairs}) {{axis=4, start=0, length=1}} : f32[2, 4, 8, {half}, 1]")
            x2 = emit(f"narrow({pairs}) {{axis=4, start=1, length=1}} : f32[2, 4, 8, {half}, 1]")
            neg = emit(f"neg({x2}) : f32[2, 4, 8, {half}, 1]")
            both = emit(f"concat({neg}, {x1}) {{axis=4}} : f32[2, 4, 8, {half}, 2]")
            cat = emit(f"reshape({both}) {{shape=[2, 4, 8, {n_rot}]}} : {ty}")
        else:
            lo = emit(f"narrow({part}) {{axis=3, start=0, length={half}}} : f32[2, 4, 8, {half}]")
            hi = emit(f"narrow({part}) {{axis=3, start={half}, length={half}}} : f32[2, 4, 8, {half}]")
            neg = emit(f"neg({hi}) : f32[2, 4, 8, {half}]")
            cat = emit(f"concat({neg}, {lo}) {{axis=3}} : {ty}")
        b = f"mul({tables['sin']}, {cat})" if swapped else f"mul({cat}, {tables['sin']})"
        rot = emit(f"{b} : {ty}")
        out = emit(f"add({rot}, {plain}) : {ty}" if swapped else f"add({plain}, {rot}) : {ty}")
        if n_rot == 16:
            return out
        rest = emit(f"narrow({h}) {{axis=3, start={n_rot}, length={16 - n_rot}}} : f32[2, 4, 8, {16 - n_rot}]")
        return emit(f"concat({out}, {rest}) {{axis=3}} : f32[2, 4, 8, 16]")

    q = heads("q") if k_only else rotate(heads("q"), q_tables)
    k = rotate(heads("k"), k_tables)
    v = heads("v")
    kt = emit(f"transpose({k}) {{perm=[0, 1, 3, 2]}} : f32[2, 4, 16, 8]")
    s = emit(f"matmul({q}, {kt}) : f32[2, 4, 8, 8]")
    four = emit("const {value=4.0} : f32[]")
    s = emit(f"div({s}, {four}) : f32[2, 4, 8, 8]")
    s = emit(f"add({s}, {mask}) : f32[2, 4, 8, 8]")
    p = emit(f"softmax({s}) {{axis=-1}} : f32[2, 4, 8, 8]")
    o = emit(f"matmul({p}, {v}) : f32[2, 4, 8, 16]")
    o = emit(f"transpose({o}) {{perm=[0, 2, 1, 3]}} : f32[2, 8, 4, 16]")
    o = emit(f"reshape({o}) {{shape=[2, 8, 64]}} : f32[2, 8, 64]")
    w = emit('param {name="o_proj.weight"} : f32[64, 64]')
    out = emit(f"matmul({o}, {w}) : f32[2, 8, 64]")
    return "graph rope_heads {\n" + "\n".join(lines) + f"\n  return {out}\n}}\n"


def _feeds(g: Graph) -> tuple[dict, dict]:
    rng = np.random.default_rng(5)
    feeds = random_feeds(g, rng)
    if "position_ids" in feeds:
        feeds["position_ids"] = np.arange(8, dtype=np.int64)
    w = {n.name: (0.2 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    return feeds, w


def _battery_numbers(g: Graph, t) -> None:
    """Every version equals the unfused graph on every input set of the battery (reference and MLX)."""
    feeds, w = _feeds(g)
    for s in battery(g, feeds).sets:
        ref = run_reference(g, s.feeds, w)
        for label, v in t.versions()[1:]:
            for run in (run_reference, run_mlx):
                for a, b in zip(ref, run(v, s.feeds, w), strict=True):
                    np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64), rtol=2e-4,
                                               atol=2e-4 * max(1.0, float(np.abs(a).max())),
                                               err_msg=f"{label} on {run.__name__}, input set {s.name}")


def _block(t) -> Graph:
    (blk,) = [n for n in t.final if n.op == Op.FUSED_ATTENTION_BLOCK]
    return blk


@pytest.mark.parametrize("source", ["case", "swapped", "rank3_tables"])
def test_rope_on_heads_becomes_the_blocks_rope(capsys, tmp_path, source):
    path = next(CASES.glob("n3-01-*.rlx"))
    if source != "case":
        path = tmp_path / "g.ir"
        path.write_text(rope_attention(swapped=source == "swapped", table_rank=3 if source == "rank3_tables" else 4))
    g = parse_ir(path.read_text())
    t = Pipeline.canonical().run(g)
    assert sum(m.rule == RULE for s in t.steps for m in s.matches) == 2  # Q and K
    assert _block(t).attrs["has_rope"] is True
    assert not any(n.op in (Op.NEG, Op.SOFTMAX) for n in t.final)
    assert check_fusion(t).ok
    _battery_numbers(g, t)
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0 and "FusedAttentionBlock" in out and "rope_on_heads" not in out


def test_the_rope_op_control_becomes_the_blocks_rope_too():
    g = parse_ir(next(CASES.glob("n3-01c-*.rlx")).read_text())
    t = equal_numbers(g)
    assert _block(t).attrs["has_rope"] is True and ops(t.final).get("rope") is None


@pytest.mark.parametrize("source", ["case", "swapped", "partial"])
def test_the_rewrite_is_bit_exact(source):
    src = next(CASES.glob("n3-01-*.rlx")).read_text() if source == "case" else rope_attention(
        swapped=source == "swapped", n_rot=8 if source == "partial" else 16)
    g = parse_ir(src)
    h, matches = rope_heads(g)
    assert len(matches) == 2 and not any(n.op == Op.NEG for n in h)
    feeds, w = _feeds(g)
    for a, b in zip(run_reference(g, feeds, w), run_reference(h, feeds, w), strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("variant, guard, fragment", [
    ("partial", "rope_full_rotary",
     "and k_rope (node 61, model.layers.0.self_attn) rotate 8 of 16 dims per head (partial rotary)"),
    ("k_only", "rope_q_and_k", "rotates K only")])
def test_a_rotation_the_block_cannot_take_packs_the_attention_and_is_named(capsys, tmp_path, variant, guard,
                                                                           fragment):
    path = tmp_path / "g.ir"
    path.write_text(rope_attention(n_rot=8 if variant == "partial" else 16, k_only=variant == "k_only"))
    g = parse_ir(path.read_text())
    t = Pipeline.canonical().run(g)
    (a,) = [n for n in t.final if n.op == Op.ATTENTION]
    ropes = [n for n in t.final if n.op == Op.ROPE]
    assert len(ropes) == (1 if variant == "k_only" else 2)
    assert all(r.attrs["n_rot"] == (8 if variant == "partial" else 16) for r in ropes)
    (r,) = [r for r in t.rejections if r.guard == guard]
    assert fragment in r.message and r.pass_name == "fuse_attention_block"
    # every rotation that fails is named and highlighted, Q's and K's both when both rotate part of each head
    assert set(r.offending) == ({n.id for n in ropes} if variant == "partial" else {r.subject})
    _battery_numbers(g, t)
    code, out, _ = cli_run(capsys, "explain", path)
    assert guard in out and fragment in out and "had no candidate here" not in out


def test_tables_gathered_by_position_ids_are_rewritten_exactly():
    """The rope op reads row p of its table at position p; a gathered `[S, d/2]` table is that table (any ids)."""
    g = parse_ir(rope_attention(gathered=True))
    h, matches = rope_heads(g)
    assert len(matches) == 2
    feeds, w = _feeds(g)
    feeds["position_ids"] = np.array([3, 9, 0, 31, 7, 7, 12, 2], np.int64)
    for a, b in zip(run_reference(g, feeds, w), run_reference(h, feeds, w), strict=True):
        assert np.array_equal(a, b)
    t = equal_numbers(g)
    assert _block(t).attrs["has_rope"] is True


def test_a_table_whose_halves_differ_is_not_a_rotation_and_stays_named(capsys, tmp_path):
    path = tmp_path / "g.ir"
    path.write_text(rope_attention(duplicated=False))
    g = parse_ir(path.read_text())
    assert rope_heads(g)[1] == []
    t = equal_numbers(g)
    (r,) = [r for r in t.rejections if r.guard == "rope_on_heads" and r.headline]
    assert "rotate_half" in r.message
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 1 and "rope_on_heads" in out


@pytest.mark.parametrize("k_only", [False, True])
def test_interleaved_rope_is_named_not_dropped(capsys, tmp_path, k_only):
    """GPT-J's rotate_every_two rotates pairs (h[2i], h[2i+1]); the rope op rotates halves: not rewritten, the
    attention stays primitives and `rope_on_heads` names the interleaved rotation; the layer kind says RoPE."""
    path = tmp_path / "g.ir"
    path.write_text(rope_attention(interleaved=True, k_only=k_only))
    g = parse_ir(path.read_text())
    assert rope_heads(g)[1] == []
    t = equal_numbers(g)
    (r,) = [r for r in t.rejections if r.guard == "rope_on_heads" and r.headline]
    assert "interleaved (rotate_every_two" in r.message and ("K rotated" if k_only else "Q and K rotated") in r.message
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 1 and "rope_on_heads" in out and "RoPE" in out


@pytest.mark.parametrize("source, stem", [("falcon", "falcon"), ("gpt-neox.legacy-sdpa", "gpt-neox.legacy-sdpa")])
def test_real_exports_with_full_width_constant_tables_are_rewritten(source, stem):
    """Falcon's Q and K (K through a gather of the fused QKV), GPT-NeoX's partial rotary on its per-head [q, k, v]
    layout, both with full-width [1, 1, S, r] constant tables: the importer maps them one to one, the pass checks
    their halves on the values and the rope op takes them; Falcon's attention packs (one broadcast K/V head read as
    num_kv_heads=1)."""
    from rlxviz.models.onnx import load_onnx

    cases = Path(__file__).parent / "fixtures" / "onnx" / "cases"
    io = dict(np.load(cases / f"{stem}_io.npz"))
    feeds = {k: v for k, v in io.items() if not k.startswith("out:")}
    m = load_onnx(cases / f"{source}.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    t = Pipeline.canonical().run(m.graph)
    assert sum(m_.rule == RULE for s in t.steps for m_ in s.matches) == 4  # Q and K of both layers: a pass, not import
    assert not any(r.guard == "rope_on_heads" for r in t.rejections)
    if source == "falcon":  # one table pair for Q and K (one narrow each, tests/test_rope_shared_table.py): the block
        assert sum(n.op == Op.FUSED_ATTENTION_BLOCK and n.attrs["has_rope"] for n in t.final) == 2
    want = [v for k, v in io.items() if k.startswith("out:")][0]
    for v in (m.graph, t.final):
        assert np.max(np.abs(run_reference(v, feeds, m.weights)[0] - want)) <= 1e-5
        assert np.max(np.abs(np.asarray(run_mlx(v, feeds, m.weights)[0]) - want)) <= 1e-5


def _full_tables(g: Graph, n_rot: int, equal: bool) -> Graph:
    """`g` (from `rope_attention(duplicated=False)`) carrying values for its full-width `[S, n_rot]` tables: true
    cos/sin tables (`concat(f, f)` of the LLaMA frequencies) or, with `equal=False`, one entry changed."""
    pos = np.arange(8, dtype=np.float32)[:, None]
    freqs = pos / (10000.0 ** (np.arange(0, n_rot, 2, dtype=np.float32) / n_rot))
    values = {"rotary_emb.cos_full": np.cos(np.concatenate([freqs, freqs], -1)),
              "rotary_emb.sin_full": np.sin(np.concatenate([freqs, freqs], -1))}
    if not equal:
        values["rotary_emb.sin_full"][5, n_rot - 1] += 0.25
    return g.with_values(values)


@pytest.mark.parametrize("n_rot", [16, 8, 4, 2])
def test_a_full_width_constant_table_with_equal_halves_is_rewritten_exactly(n_rot):
    """The rope op reads the first half of the table (`narrow`); with equal halves every element is the same
    product as the form's (bit for bit on the reference), for full and partial rotary."""
    g = _full_tables(parse_ir(rope_attention(n_rot=n_rot, duplicated=False)), n_rot, equal=True)
    h, matches = rope_heads(g)
    assert len(matches) == 2 and not any(n.op == Op.NEG for n in h)
    assert all(n.attrs["n_rot"] == n_rot for n in h if n.op == Op.ROPE)
    feeds, w = _feeds(g)
    w.update(g.values)
    for a, b in zip(run_reference(g, feeds, w), run_reference(h, feeds, w), strict=True):
        assert np.array_equal(a, b)
    t = Pipeline.canonical().run(g)
    assert any(n.op in (Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK) for n in t.final)
    for a, b in zip(run_reference(g, feeds, w), run_mlx(t.final, feeds, w), strict=True):
        np.testing.assert_allclose(np.asarray(b), a, rtol=1e-5, atol=1e-5)


def test_a_full_width_table_whose_halves_differ_is_refused_with_the_entry():
    g = _full_tables(parse_ir(rope_attention(n_rot=8, duplicated=False)), 8, equal=False)
    h, matches = rope_heads(g)
    assert matches == []
    t = Pipeline.canonical().run(g)
    (r,) = [r for r in t.rejections if r.guard == "rope_on_heads" and r.headline]
    assert "its sin table: the two halves of param 'rotary_emb.sin_full' [8, 8] differ (at [5, 3] the first holds" \
        in r.message


def test_a_full_width_table_whose_values_are_not_known_is_named(capsys, tmp_path):
    """IR text carries no param values: the halves are not known to be equal, and explain says so. The stage that
    rewrites RoPE runs before the attention pattern (`fuse_sdpa.rope_heads`, then `hf_attention`): its refusal is the
    first, the attention's refusal of the unrewritten RoPE is listed after it, naming it."""
    path = tmp_path / "g.ir"
    path.write_text(rope_attention(n_rot=8, duplicated=False))
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 1 and "first rejection: fuse_sdpa.rope_heads" in out and "guard cos_table" in out
    assert "are not known to the pass" in out and "guard scores_form" not in out
    assert "also rejected: fuse_sdpa.hf_attention: rope_on_heads" in out
    code, out, _ = cli_run(capsys, "explain", path, "-v")
    assert "Q and K rotated" in out and out.index("fuse_sdpa.rope_heads") < out.index("fuse_sdpa.hf_attention")


@pytest.mark.parametrize("rows", [(2, 1, 8, 8), (2, 8, 8)])
def test_tables_that_differ_by_batch_row_are_rewritten_to_per_row_tables_exactly(rows):
    """Position ids that differ by row (optimum's position_ids input, left padding's cumsum) give `[B, 1, S, r]`
    tables: the rope op reads them as one `[B, S, r/2]` table per batch row (issue 37; this form was refused
    before), bit for bit on the reference, and the attention packs. Halves that differ are still refused by name."""
    t = rope_attention(n_rot=8, duplicated=False)
    for w in ("cos", "sin"):
        t = t.replace(f'rotary_emb.{w}_full"}} : f32[8, 8]', f'rotary_emb.{w}_full"}} : f32{list(rows)}')
    g = parse_ir(t.replace("{shape=[1, 1, 8, 8]} : f32[1, 1, 8, 8]", "{shape=[2, 1, 8, 8]} : f32[2, 1, 8, 8]"))
    pos = np.stack([np.arange(8), np.arange(8) + 3]).astype(np.float32)[:, :, None]  # row 1 starts at position 3
    freqs = pos / (10000.0 ** (np.arange(0, 8, 2, dtype=np.float32) / 8))
    full = {w: fn(np.concatenate([freqs, freqs], -1)).reshape(rows) for w, fn in (("cos", np.cos), ("sin", np.sin))}
    g = g.with_values({f"rotary_emb.{w}_full": v for w, v in full.items()})
    h, matches = rope_heads(g)
    assert len(matches) == 2
    assert all(h[n.inputs[1]].shape == (2, 8, 4) for n in h if n.op == Op.ROPE)
    feeds, w = _feeds(g)
    w.update(g.values)
    for a, b in zip(run_reference(g, feeds, w), run_reference(h, feeds, w), strict=True):
        assert np.array_equal(a, b)
    tr = Pipeline.canonical().run(g)
    assert any(n.op in (Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK) for n in tr.final)
    for a, b in zip(run_reference(g, feeds, w), run_mlx(tr.final, feeds, w), strict=True):
        np.testing.assert_allclose(np.asarray(b), a, rtol=1e-5, atol=1e-5)
    full["sin"] = full["sin"].copy()
    full["sin"][1, ..., 5, 7] += 0.25
    bad = g.with_values({f"rotary_emb.{w}_full": v for w, v in full.items()})
    assert rope_heads(bad)[1] == []
    (r,) = [r for r in Pipeline.canonical().run(bad).rejections if r.guard == "rope_on_heads" and r.headline]
    assert "its sin table: the two halves of param 'rotary_emb.sin_full'" in r.message
