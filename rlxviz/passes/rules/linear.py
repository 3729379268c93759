"""Linear-layer fusions: `fuse_matmul_bias_act` and `fuse_shared_input_matmul`.

`fuse_matmul_bias_act` (rlx-notes §2.3.1): `act(matmul(x, w) + bias)` -> `FusedMatMulBiasAct`.
Guards: the matmul is single-use and not a graph output (RLX has no output guard), the bias has
rank <= 1 and the matmul's output width (RLX checks neither length nor outputs), and the activation
is absorbed only from the epilogue allow-list `gelu, silu`. `gelu_tanh` is deliberately not in the
list: the fused epilogue is exact-erf GELU, so a tanh-GELU FFN keeps its activation as a separate
node and the rejection `epilogue_activation` says so.

`fuse_shared_input_matmul` (§2.3.7): matmuls sharing an lhs `x` (Q/K/V) -> one matmul over a
`concat` of the weights + `narrow`s. Weights stay as they are: the concatenation is a new `concat`
node of the original params (so checkpoints load unchanged and every weight keeps its name); the
MLX runtime can constant-fold it. Unlike RLX, biases are merged too: when every matmul's single
user is `add(matmul, bias[N_i])`, the biases are concatenated and one `add` follows the merged
matmul, so Hugging Face Q/K/V (which all have biases) reach RLX's packed-QKV form and later the
attention-block and layer fusions. This is why our pipeline runs this pass *before*
`fuse_matmul_bias_act` (RLX runs it after, so biased Q/K/V never merge).
"""

from __future__ import annotations

from ...ir import Op, Rewriter
from ..engine import rule_pass
from ..guard import EPILOGUE_ACTIVATIONS, Ctx, guard, not_output, rank_le, single_user
from ..pattern import P
from ..rule import QUIET, Fail, Rule, Soft, reports

# -- fuse_matmul_bias_act ------------------------------------------------------------------------

LINEAR = P(Op.ADD, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), P.var("bias"), name="add", commutative=True)


@reports()
def _not_residual(c: Ctx) -> Fail | None:
    """An add of two full-size tensors is a residual, not a bias: not a candidate (quiet)."""
    return QUIET if c["bias"].shape == c["mm"].shape else None


def _bias_len_ok(c: Ctx) -> bool:
    return c["bias"].shape in ((), (1,), (c["mm"].shape[-1],))


@reports("epilogue_activation", "add_not_output")
def _epilogue(c: Ctx) -> Fail | None:
    """Absorb the add's activation user when allowed; otherwise say why not (soft)."""
    users = c.users("add")
    if len(users) != 1 or users[0].op.value not in {a.value for a in _ACTS}:
        return QUIET  # no activation epilogue to absorb: not a near-miss
    act = users[0]
    if act.op.value not in EPILOGUE_ACTIVATIONS:
        return Fail("guard", "epilogue_activation",
                    f"{c.d('add')} feeds {act.op.value} (node {act.id}); the epilogue allow-list is "
                    f"{', '.join(EPILOGUE_ACTIVATIONS)}, so the linear is fused without activation",
                    (act.id,), ((c.id("add"), act.id),), "use exact GELU (gelu) or silu to fuse the activation")
    if c.graph.is_output(c.id("add")):
        return Fail("guard", "add_not_output",
                    f"{c.d('add')} is a graph output, so {act.op.value} (node {act.id}) is not absorbed",
                    (c.id("add"),), (), "do not return the pre-activation value")
    c.bindings["act"] = act.id
    return None


_ACTS = frozenset({Op.GELU, Op.GELU_TANH, Op.SILU, Op.RELU, Op.SIGMOID, Op.TANH})


def _fmba(c: Ctx) -> tuple[Op, list[int], dict]:
    act = c["act"].op.value if "act" in c else None
    return Op.FUSED_MATMUL_BIAS_ACT, [c.id("x"), c.id("w"), c.id("bias")], {"activation": act}


def _fmba_rewrite(c: Ctx, rw: Rewriter) -> int:
    op, ins, attrs = _fmba(c)
    roles = ["mm", "add"] + (["act"] if "act" in c else [])
    return rw.fuse(op, ins, attrs, absorbed=[c.id(r) for r in roles], result=c.id(roles[-1]))


BIAS_ACT = Rule(
    "fuse_matmul_bias_act.bias_act", LINEAR,
    steps=(
        _not_residual,
        single_user("mm", "mm_single_user", "make the matmul feed only its bias add"),
        not_output("mm", "mm_not_output"),
        rank_le("bias", 1, "bias_rank", "a bias must be a scalar or a vector [N]"),
        guard("bias_length", _bias_len_ok,
              lambda c: f"{c.d('bias')} has shape {list(c['bias'].shape)}; needs [] , [1] or "
                        f"[{c['mm'].shape[-1]}] (the matmul's output width)", requires=("bias", "mm")),
        Soft(_epilogue),
    ),
    result=("act", "add"), absorb=("mm", "add", "act"), rewrite=_fmba_rewrite,
    doc="act(x @ w + bias) -> FusedMatMulBiasAct (activation from the allow-list gelu, silu)")

fuse_matmul_bias_act = rule_pass("fuse_matmul_bias_act", [BIAS_ACT],
                                 "matmul + bias (+ gelu/silu) -> FusedMatMulBiasAct")

# -- fuse_shared_input_matmul --------------------------------------------------------------------


@reports()
def _group(c: Ctx) -> Fail | None:
    """Bind mm0..mmK: the plain matmuls reading x as their lhs; the anchor must be the first of them."""
    x = c.id("x")
    group = [u for u in c.graph.users(x) if u.op == Op.MATMUL and u.inputs[0] == x and u.inputs[1] != x]
    if len(group) < 2 or group[0].id != c.id("mm0"):
        return QUIET
    for i, m in enumerate(group):
        c.bindings[f"mm{i}"] = m.id
        c.bindings[f"w{i}"] = m.inputs[1]
    c.data["n"] = len(group)
    return None


def _members(c: Ctx) -> list[str]:
    return [f"mm{i}" for i in range(c.data["n"])]


def _weights_rank2(c: Ctx) -> bool:
    return all(c[f"w{i}"].rank == 2 for i in range(c.data["n"]))


def _explain_rank2(c: Ctx) -> str:
    bad = next(i for i in range(c.data["n"]) if c[f"w{i}"].rank != 2)
    return f"{c.d(f'w{bad}')} has shape {list(c[f'w{bad}'].shape)}; every weight must be rank 2 [K, N_i]"


def _same_dtype(c: Ctx) -> bool:
    return len({c[f"w{i}"].dtype for i in range(c.data["n"])}) == 1


@reports("biases_mergeable")
def _biases(c: Ctx) -> Fail | None:
    """Merge biases when every matmul's only user is `add(mm, bias[N_i])` (soft: else merge matmuls only)."""
    adds = []
    for r in _members(c):
        users = c.users(r)
        mm = c[r]
        why = None
        if len(users) != 1 or c.graph.is_output(mm.id):
            why = f"{c.d(r)} has {len(users)} users"
        elif users[0].op != Op.ADD:
            why = f"{c.d(r)} feeds {users[0].op.value}, not a bias add"
        else:
            add = users[0]
            other = add.inputs[1] if add.inputs[0] == mm.id else add.inputs[0]
            if add.inputs.count(mm.id) != 1 or c.graph[other].shape != (mm.shape[-1],):
                why = f"{c.d(r)}'s add (node {add.id}) has no bias of shape [{mm.shape[-1]}]"
            else:
                adds.append((add.id, other))
        if why:
            if r == "mm0" and not any(u.op == Op.ADD for u in users):
                return QUIET  # bias-free group (LLaMA-style): nothing to say
            return Fail("guard", "biases_mergeable", f"biases not merged: {why}; the matmuls are merged alone",
                        (mm.id,), (), "give every projection a vector bias, or none")
    for i, (a, b) in enumerate(adds):
        c.bindings[f"add{i}"] = a
        c.bindings[f"b{i}"] = b
    return None


def _shared_rewrite(c: Ctx, rw: Rewriter) -> int:
    n = c.data["n"]
    mms = [c.id(f"mm{i}") for i in range(n)]
    biased = "add0" in c
    adds = [c.id(f"add{i}") for i in range(n)] if biased else []
    with rw.provenance(mms + adds):
        wcat = rw.concat([c.id(f"w{i}") for i in range(n)], axis=1)
        y = rw.matmul(c.id("x"), wcat)
        if biased:
            y = rw.add(y, rw.concat([c.id(f"b{i}") for i in range(n)], axis=0))
        axis, off = len(rw.shape_of(y)) - 1, 0
        for i in range(n):
            width = c[f"mm{i}"].shape[-1]
            part = rw.narrow(y, axis, off, width)
            off += width
            rw.replace(adds[i] if biased else mms[i], part)
    if biased:
        rw.remove(mms)
    return y


SHARED = Rule(
    "fuse_shared_input_matmul.concat_weights", P(Op.MATMUL, P.var("x"), P.var("w0"), name="mm0"),
    steps=(
        _group,
        guard("weights_rank2", _weights_rank2, _explain_rank2, "use [K, N] weights"),
        guard("weights_same_dtype", _same_dtype,
              lambda c: "weights have dtypes " + ", ".join(str(c[f'w{i}'].dtype) for i in range(c.data['n']))
                        + "; needs one dtype"),
        guard("not_outputs", lambda c: not any(c.graph.is_output(c.id(r)) for r in _members(c)),
              lambda c: "one of the matmuls is a graph output; merged outputs would change meaning"),
        Soft(_biases),
    ),
    result="mm0", absorb=(), rewrite=_shared_rewrite,
    doc="matmuls sharing an input -> one matmul over concat(weights) (+ concat(biases)) + narrows")

fuse_shared_input_matmul = rule_pass("fuse_shared_input_matmul", [SHARED],
                                     "Q/K/V projections of one input -> one matmul + narrows (biases merged)")

__all__ = ["BIAS_ACT", "SHARED", "fuse_matmul_bias_act", "fuse_shared_input_matmul"]
