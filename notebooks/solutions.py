"""Solutions to the notebooks' exercises (kept out of the notebooks so a student meets the check first).

Each `exNN()` returns what the exercise cell of notebook NN asks for; the last cell of each notebook
(collapsed) runs it through the same check.
"""

from __future__ import annotations

F32 = 4  # bytes per float32 value


def ex01(prims) -> tuple[int, int]:
    """(ideal, executed) bytes saved by FusedResidualLN on x [2, 64, 128] f32.

    Ideal: the sum is written once and read once by the norm: 2 * 65,536 B. Executed: read from MLX, the bytes
    per call of version 1's program minus version 2's (`prims`: `session.version_primitives`). With rlxviz's
    CPU kernels the add and the whole LayerNorm fallback chain become one kernel, so it saves more than the
    ideal count of the one sum; with MLX's own lowering (add, then mx.fast.layer_norm) it saves 0 B.
    """
    nbytes = 2 * 64 * 128 * F32
    return 2 * nbytes, prims[1].program.bytes.total - prims[2].program.bytes.total


def ex02() -> tuple[int, int]:
    """(bytes, launches) fuse_shared_input_matmul saves in all-MiniLM-L6-v2 at batch 1, seq 16.

    Per layer Q, K and V read hidden [1, 16, 384] f32 (24,576 B) three times; merged, once: 2 reads saved
    per layer. Three matmuls become one and three bias adds become one: 4 launches saved per layer (MLX's
    program: 339 -> 315 non-view primitives), 6 layers.
    """
    x = 1 * 16 * 384 * F32
    return 6 * 2 * x, 6 * (2 + 2)


def ex03(text: str) -> str:
    """The IR text with only the model's first output returned (`return %71, %29` -> `return %71`): h1 is
    then an ordinary intermediate with two readers (FFN.1 and the second residual), and the layer fuses."""
    import re

    return re.sub(r"^(\s*return %\w+)(, %\w+)+", r"\1", text, flags=re.MULTILINE)


def ex04a():
    """Notebook 04, exercise A: a pass that puts the later-computed operand of a same-shape `add` first.

    Validity: IEEE-754 addition is commutative (`a + b == b + a` bit for bit, and broadcasting is symmetric),
    so swapping the operands changes no number. The canonical order is "the operand computed later first":
    node ids follow a topological order, and a residual's branch is computed from its skip, so this is the
    branch-first layout RLX's layer fusion expects. Adds whose operands differ in shape (a bias, a mask)
    are left alone, and so are adds already in order (so a second run rewrites nothing: idempotent).
    """
    from rlxviz.ir import Op
    from rlxviz.passes.engine import rule_pass
    from rlxviz.passes.pattern import P
    from rlxviz.passes.rule import QUIET, Rule, reports

    @reports(reads=("a", "b"))
    def needs_swap(c):
        """Not a candidate (QUIET) unless the operands have equal shapes and the later one is second."""
        if c["a"].shape != c["b"].shape or c.id("a") > c.id("b"):
            return QUIET
        return None

    rule = Rule("canonicalize_add.later_operand_first", P(Op.ADD, P.var("a"), P.var("b"), name="add"),
                steps=(needs_swap,), result="add", absorb=("add",),
                build=lambda c: (Op.ADD, [c.id("b"), c.id("a")], {}),
                doc="add(a, b) -> add(b, a) when b was computed after a (same shapes)")
    return rule_pass("canonicalize_add", [rule], "same-shape adds: the operand computed later first")


def ex04b():
    """Notebook 04, exercise B: absorb a `gelu_tanh` that follows `FusedMatMulBiasAct(activation=None)`.

    Validity: `FusedMatMulBiasAct(activation="gelu_tanh")` computes `gelu_tanh(x @ w + bias)`
    (`rlxviz/ir/fused.py`), the same ops in the same order, so the numbers are equal. It is *illegal* when the
    pre-activation value has another reader or is a graph output (the fused node no longer produces it):
    `single_user` and `not_output`. A size gate of kind *not profitable* reads the pipeline parameter
    `epilogue_max_rows` (None, the default: no gate): the rows are every dim of the result but the last.
    """
    import math

    from rlxviz.ir import Op
    from rlxviz.passes.engine import rule_pass
    from rlxviz.passes.guard import not_output, single_user, size_le
    from rlxviz.passes.pattern import P
    from rlxviz.passes.rule import Rule

    fmba = Op.FUSED_MATMUL_BIAS_ACT

    def rows(c):
        lead = c["fc"].shape[:-1]
        return math.prod(lead), "*".join(map(str, lead))

    rule = Rule("fuse_gelu_tanh_epilogue.absorb",
                P(Op.GELU_TANH, P(fmba, P.var("x"), P.var("w"), P.var("bias"), name="fc",
                                  attrs={"activation": None}), name="act"),
                steps=(single_user("fc", "fc_single_user", "the pre-activation value must feed only gelu_tanh"),
                       not_output("fc", "fc_not_output"),
                       size_le("epilogue_max_rows", rows, "rows", "epilogue_size_gate", "fc")),
                result="act", absorb=("fc", "act"),
                build=lambda c: (fmba, [c.id("x"), c.id("w"), c.id("bias")], {"activation": "gelu_tanh"}),
                doc="FusedMatMulBiasAct(None) + gelu_tanh -> FusedMatMulBiasAct(gelu_tanh)")
    return rule_pass("fuse_gelu_tanh_epilogue", [rule], "a gelu_tanh after a fused linear -> its epilogue")


def ex05() -> tuple[int, int, str]:
    """(rlxviz norms, ONNX Runtime norms, guard) for GPT-2's ONNX export (tests/fixtures/onnx/gpt2.onnx).

    Of its 5 LayerNorms only the final `ln_f` reads a residual sum nobody else reads: rlxviz's
    fuse_residual_ln fuses it (1 FusedResidualLN) and ONNX Runtime's graph optimizer fuses it (1
    SkipLayerNormalization). The 4 pre-LN norms read a sum that the next residual add reads too: guard
    `sum_single_user` (illegal for the single-output FusedResidualLN).
    """
    return 1, 1, "sum_single_user"


def ex06():
    """Notebook 06: a two-output residual LayerNorm for pre-LN layers (the sum has another reader).

    `LayerNorm(add(x, residual))` whose sum is also read outside the match -> one
    `FusedResidualLN(x, residual, gamma, beta, with_sum=True)` producing both values, `outputs=("sum",)`: the
    engine lets the sum's other readers stay and reads each value back by a `narrow`.

    Validity: the fused op computes `s = x + residual` and `LayerNorm(s)` with the matched eps, the same ops in the
    same order, and returns `s` itself; so every reader of the sum and of the norm gets the same bits. Guards: x and
    residual have one shape (`residual_same_shape`: a broadcast add is not a residual, and the op's type rule
    demands it); the norm is over the last axis (`norm_last_axis`). A sum with no other reader is not a candidate
    (`QUIET`): the single-output `fuse_residual_ln` takes it, and packing a sum nobody reads would only copy it.
    """
    from rlxviz.ir import Op
    from rlxviz.passes.engine import rule_pass
    from rlxviz.passes.guard import guard, same_shape
    from rlxviz.passes.pattern import P
    from rlxviz.passes.rule import QUIET, Rule, reports

    @reports(reads=("sum", "norm"))
    def sum_read_elsewhere(c):
        """Not a candidate unless the sum has a reader besides the norm (or is a graph output)."""
        others = [u for u in c.users("sum") if u.id != c.id("norm")]
        return None if others or c.graph.is_output(c.id("sum")) else QUIET

    last_axis = guard("norm_last_axis", lambda c: c["norm"].attrs.get("axis", -1) in (-1, c["norm"].rank - 1),
                      lambda c: f"{c.d('norm')} normalizes axis {c['norm'].attrs.get('axis')}; the fused op "
                                "normalizes the last axis", "normalize over the last axis", requires=("norm",),
                      kind="not recognized")
    rule = Rule("fuse_residual_ln_two_outputs.pre_ln",
                P(Op.LAYER_NORM, P(Op.ADD, P.var("x"), P.var("residual"), name="sum"), P.var("gamma"),
                  P.var("beta"), name="norm"),
                steps=(sum_read_elsewhere,
                       same_shape("x", "residual", "residual_same_shape", "a residual add has equal operand shapes"),
                       last_axis),
                result="norm", outputs=("sum",), absorb=("sum", "norm"),
                build=lambda c: (Op.FUSED_RESIDUAL_LN, [c.id(r) for r in ("x", "residual", "gamma", "beta")],
                                 {"eps": c["norm"].attrs["eps"], "with_sum": True}),
                doc="LayerNorm(x + residual), the sum read elsewhere -> FusedResidualLN(with_sum) [norm, sum]")
    return rule_pass("fuse_residual_ln_two_outputs", [rule], "pre-LN residual norm: returns the sum too")
