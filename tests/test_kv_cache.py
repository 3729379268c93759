"""A decode step with a KV cache (issue 21): this step's K/V heads appended to the cache on the sequence axis
(`concat(past, heads(k), axis=2)`) is read as the head split of a packed concat (`fuse_sdpa.pack_cache`,
bit-exact), so the attention packs with Sq queries against P + Sq keys; FusedAttentionBlock is not expected (it
projects K and V from the hidden states) and its `kv_cache` refusal is the model's own structure, a line of
`explain`, never a miss. Numbers equal in every version, on the reference and on MLX."""

import numpy as np
import pytest
from clirun import run as cli_run
from test_unwritten_forms import equal_numbers, random_feeds

from rlxviz.ir import Op, parse_ir
from rlxviz.passes.architecture import classify_layer
from rlxviz.passes.rules.kv_cache import RULE, pack_cache
from rlxviz.runtime import run_reference
from rlxviz.session.status import check_fusion


def decode(mask: bool = True, bias: bool = False, sq: int = 1, out_cache: bool = True, past: int = 7) -> str:
    """One attention layer of a decode step: `sq` new tokens against a cache of `past` (4 heads of 16), an optional
    padding keep mask over the past + sq keys, projection biases, the present key/value returned or not."""
    at = " @model.layers.0.self_attn"
    S = past + sq
    L = [f'  %0 = input {{name="hidden_states"}} : f32[2, {sq}, 64]',
         f'  %1 = input {{name="past_key"}} : f32[2, 4, {past}, 16]',
         f'  %2 = input {{name="past_value"}} : f32[2, 4, {past}, 16]',
         f'  %3 = input {{name="attention_mask"}} : i64[2, {S}]']
    n = [4]

    def e(t):
        r = f"%{n[0]}"
        L.append(f"  {r} = {t}{at}")
        n[0] += 1
        return r
    c = e(f'cast(%3) {{dtype="f32"}} : f32[2, {S}]')
    one = e("const {value=1.0} : f32[]")
    inv = e(f"sub({one}, {c}) : f32[2, {S}]")
    fill = e("const {value=-3.4028234663852886e+38} : f32[]")
    ext = e(f"mul({inv}, {fill}) : f32[2, {S}]")
    m = e(f"reshape({ext}) {{shape=[2, 1, 1, {S}]}} : f32[2, 1, 1, {S}]")
    heads = {}
    for t in "qkv":
        w = e(f'param {{name="{t}_proj.weight"}} : f32[64, 64]')
        p = e(f"matmul(%0, {w}) : f32[2, {sq}, 64]")
        if bias:
            b = e(f'param {{name="{t}_proj.bias"}} : f32[64]')
            p = e(f"add({p}, {b}) : f32[2, {sq}, 64]")
        r = e(f"reshape({p}) {{shape=[2, {sq}, 4, 16]}} : f32[2, {sq}, 4, 16]")
        heads[t] = e(f"transpose({r}) {{perm=[0, 2, 1, 3]}} : f32[2, 4, {sq}, 16]")
    k = e(f"concat(%1, {heads['k']}) {{axis=2}} : f32[2, 4, {S}, 16]")
    v = e(f"concat(%2, {heads['v']}) {{axis=2}} : f32[2, 4, {S}, 16]")
    kt = e(f"transpose({k}) {{perm=[0, 1, 3, 2]}} : f32[2, 4, 16, {S}]")
    s = e(f"matmul({heads['q']}, {kt}) : f32[2, 4, {sq}, {S}]")
    f = e("const {value=4.0} : f32[]")
    s = e(f"div({s}, {f}) : f32[2, 4, {sq}, {S}]")
    if mask:
        s = e(f"add({s}, {m}) : f32[2, 4, {sq}, {S}]")
    p = e(f"softmax({s}) {{axis=-1}} : f32[2, 4, {sq}, {S}]")
    o = e(f"matmul({p}, {v}) : f32[2, 4, {sq}, 16]")
    o = e(f"transpose({o}) {{perm=[0, 2, 1, 3]}} : f32[2, {sq}, 4, 16]")
    o = e(f"reshape({o}) {{shape=[2, {sq}, 64]}} : f32[2, {sq}, 64]")
    w = e('param {name="o_proj.weight"} : f32[64, 64]')
    out = e(f"matmul({o}, {w}) : f32[2, {sq}, 64]")
    rets = f"{out}, {k}, {v}" if out_cache else out
    return "graph decode {\n" + "\n".join(L) + f"\n  return {rets}\n}}\n"


VARIANTS = {"cache_returned": {}, "bias_cache_dropped": {"bias": True, "out_cache": False},
            "no_mask": {"mask": False}, "two_new_tokens": {"sq": 2, "bias": True}}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_decode_step_packs_its_attention_and_the_block_is_not_expected(capsys, tmp_path, name):
    path = tmp_path / "g.ir"
    path.write_text(decode(**VARIANTS[name]))
    g = parse_ir(path.read_text())
    arch = classify_layer(g, 0)
    assert arch.kv_cache and "FusedAttentionBlock" not in arch.expected()
    t = equal_numbers(g)
    (a,) = [n for n in t.final if n.op == Op.ATTENTION]
    sq = VARIANTS[name].get("sq", 1)
    assert a.shape[1] == sq and t.final[a.inputs[1]].shape[1] == 7 + sq
    assert a.attrs["mask"] == ("keep" if VARIANTS[name].get("mask", True) else "none")
    assert not any(n.op == Op.SOFTMAX for n in t.final)
    assert check_fusion(t).ok
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0, out
    # the workload named from the query length (issue 39): two new tokens are no decode step
    assert ("KV cache (decode step of 1 token after 7 cached)" if sq == 1 else
            f"KV cache (prefill of {sq} tokens after 7 cached)") in out
    if VARIANTS[name].get("mask", True):  # a keep mask would have made the block expected
        assert "kv_cache [the model's own term]" in out and "past_key" in out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_reading_the_cache_packed_is_bit_exact(name):
    g = parse_ir(decode(**VARIANTS[name]))
    h, matches = pack_cache(g)
    assert len(matches) == 2 and {m.rule for m in matches} == {RULE}
    rng = np.random.default_rng(7)
    feeds = random_feeds(g, rng)
    w = {n.name: (0.2 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    for a, b in zip(run_reference(g, feeds, w), run_reference(h, feeds, w), strict=True):
        assert np.array_equal(a, b)


def test_a_concat_on_the_heads_axis_or_of_a_non_split_is_not_a_cache():
    src = """graph not_cache {
  %0 = input {name="x"} : f32[2, 1, 64]
  %1 = input {name="past"} : f32[2, 4, 7, 16]
  %2 = reshape(%0) {shape=[2, 1, 4, 16]} : f32[2, 1, 4, 16]
  %3 = transpose(%2) {perm=[0, 2, 1, 3]} : f32[2, 4, 1, 16]
  %4 = input {name="other"} : f32[2, 4, 1, 16]
  %5 = concat(%1, %4) {axis=2} : f32[2, 4, 8, 16]
  %6 = input {name="more_heads"} : f32[2, 3, 1, 16]
  %7 = concat(%3, %6) {axis=1} : f32[2, 7, 1, 16]
  return %5, %7
}"""
    g = parse_ir(src)
    assert pack_cache(g)[1] == []  # %5: the new part is no head split; %7: the heads axis, not the sequence


@pytest.mark.parametrize("sq,past", [(16, 1), (16, 7), (4, 12), (1, 1), (1, 30)])
def test_the_workload_is_named_from_the_query_length_not_from_the_cache(capsys, tmp_path, sq, past):
    """Issue 39: a model with KV-cache inputs fed 16 new tokens is a prefill (a chunk after 7 cached), not a decode
    step; one new token is. One wording (`kv_cache.kv_workload`) in the layer kind (`explain`'s text and JSON, the
    app's Why tab), its evidence and the block's `kv_cache` refusal. (An empty cache, `[2, 4, 0, 16]`, is refused by
    the IR's lint: the wording's own test covers 0 cached.)"""
    import json

    from rlxviz.passes.rules.kv_cache import kv_workload

    assert kv_workload(16, 0) == "prefill of 16 tokens after 0 cached"
    assert kv_workload(1, 0) == "decode step of 1 token after 0 cached"

    path = tmp_path / "g.ir"
    path.write_text(decode(sq=sq, past=past))
    arch = classify_layer(parse_ir(path.read_text()), 0)
    want = (f"decode step of 1 token after {past} cached" if sq == 1 else
            f"prefill of {sq} tokens after {past} cached")
    assert arch.kv_cache and arch.description.endswith(f"KV cache ({want})")
    assert any(want in e for e in arch.evidence)
    code, out, _ = cli_run(capsys, "explain", path)
    assert code == 0, out
    assert ("decode step" in out) == (sq == 1) and ("prefill" in out) == (sq > 1)
    assert f"this step's K (a {want} with a KV cache, {sq} quer" in out
    code, out, _ = cli_run(capsys, "explain", path, "--json")
    assert code == 0 and want in out and ("decode step" in out) == (sq == 1)
    json.loads(out)
