"""Multi-output rewrites: a rule whose fused node also produces an absorbed value read outside the match
(`Rule.outputs`, `Rewriter.fuse_packed`), and the two-output residual norm (`FusedResidualLN(with_sum=True)`)."""

import numpy as np
import pytest

from rlxviz.ir import Builder, DType, Op, format_graph, lint, parse_ir
from rlxviz.ir.infer import ShapeError, TensorType, infer
from rlxviz.passes import run_passes
from rlxviz.passes.engine import apply, find, rule_pass
from rlxviz.passes.guard import RuleError, same_shape
from rlxviz.passes.pattern import P
from rlxviz.passes.rule import Rule
from rlxviz.runtime.reference import run_reference
from rlxviz.session import classify

NORMS = {Op.LAYER_NORM: Op.FUSED_RESIDUAL_LN, Op.RMS_NORM: Op.FUSED_RESIDUAL_RMS_NORM}


def pre_ln(shape=(2, 5, 8), dtype=DType.f32, norm=Op.LAYER_NORM, sum_is_output=False):
    """h = x + r; y = norm(h); out = h + gelu(y): the residual sum read by the norm and by the next residual add."""
    b = Builder("pre_ln")
    x, r = b.input("x", shape, dtype), b.input("r", shape, dtype)
    h = b.add(x, r)
    g, be = b.param("g", shape[-1:], dtype), b.param("b", shape[-1:], dtype)
    y = b.layer_norm(h, g, be) if norm == Op.LAYER_NORM else b.rms_norm(h, g, be)
    out = b.add(h, b.gelu(y))
    b.output(out, h) if sum_is_output else b.output(out)
    return b.build()


def two_output_rule(norm=Op.LAYER_NORM, outputs=("sum",), absorb=("sum", "norm"), with_sum=True, **kw):
    return Rule(f"two_output.{norm.value}",
                P(norm, P(Op.ADD, P.var("x"), P.var("residual"), name="sum"), P.var("gamma"), P.var("beta"),
                  name="norm"),
                steps=(same_shape("x", "residual", "residual_same_shape", "a residual add has equal shapes"),),
                result="norm", outputs=outputs, absorb=absorb,
                build=lambda c: (NORMS[norm], [c.id(r) for r in ("x", "residual", "gamma", "beta")],
                                 {"eps": c["norm"].attrs["eps"], "with_sum": with_sum}), **kw)


def feeds(g, seed=0):
    rng = np.random.default_rng(seed)
    return {n.attrs["name"]: rng.standard_normal(n.shape).astype(n.dtype.numpy) for n in g if n.op in (Op.INPUT,
                                                                                                           Op.PARAM)}


@pytest.mark.parametrize("norm", [Op.LAYER_NORM, Op.RMS_NORM])
@pytest.mark.parametrize(("shape", "dtype"), [((2, 5, 8), DType.f32), ((7, 16), DType.f32), ((1, 3, 4), DType.f16)])
@pytest.mark.parametrize("sum_is_output", [False, True])
def test_two_output_norm_fuses_and_keeps_every_number(norm, shape, dtype, sum_is_output):
    g = pre_ln(shape, dtype, norm, sum_is_output)
    step = run_passes(g, [rule_pass("two", [two_output_rule(norm)])]).steps[0]
    assert not step.error and len(step.matches) == 1 and not step.rejections
    out = lint(step.after)
    fused = out[step.matches[0].fused]
    assert fused.op == NORMS[norm] and fused.attrs["with_sum"] and fused.shape == (*shape[:-1], 2 * shape[-1])
    assert out.op_counts().get("add", 0) == 1 and norm.value not in out.op_counts()  # the sum is computed once
    narrows = out.users(fused.id)
    assert [(n.op, n.attrs["start"], n.attrs["length"]) for n in narrows] == [(Op.NARROW, 0, shape[-1]),
                                                                              (Op.NARROW, shape[-1], shape[-1])]
    f = {k: v for k, v in feeds(g).items()}
    ins = {k: v for k, v in f.items() if k in ("x", "r")}
    w = {k: v for k, v in f.items() if k not in ins}
    want, got = run_reference(g, ins, w), run_reference(out, ins, w)
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert parse_ir(format_graph(out)).op_counts() == out.op_counts()  # the attribute prints and parses


def test_two_output_norm_runs_on_mlx_and_in_onnx_runtime():
    import onnxruntime as ort

    from rlxviz.models.onnx.export import export_onnx
    from rlxviz.runtime.executor import run_mlx

    g = pre_ln()
    out = run_passes(g, [rule_pass("two", [two_output_rule()])]).final
    f = feeds(g, 3)
    ins = {k: f[k] for k in ("x", "r")}
    w = {k: v for k, v in f.items() if k not in ins}
    want = run_reference(g, ins, w)[0]
    assert np.abs(run_mlx(out, ins, w)[0] - want).max() < 1e-5
    sess = ort.InferenceSession(export_onnx(out, w).SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.abs(sess.run(None, ins)[0] - want).max() < 1e-5


def test_without_outputs_the_engine_refuses_the_escaping_sum():
    g = pre_ln()
    rule = two_output_rule(outputs=(), with_sum=False)
    step = run_passes(g, [rule_pass("one", [rule])]).steps[0]
    assert not step.matches
    assert [(r.guard, r.kind) for r in step.rejections] == [("absorbed_escape", "illegal")]
    assert "also read by" in step.rejections[0].message


def test_the_packed_type_is_checked_before_rewriting():
    """A rule declaring an output whose op does not pack it (with_sum=False) is refused by fused_types."""
    step = run_passes(pre_ln(), [rule_pass("bad", [two_output_rule(with_sum=False)])]).steps[0]
    assert not step.matches and [(r.guard, r.kind) for r in step.rejections] == [("fused_types", "illegal")]
    assert "packed outputs" in step.rejections[0].message and "f32[2, 5, 16]" in step.rejections[0].message


def test_outputs_must_be_absorbed_roles():
    with pytest.raises(RuleError, match=r"outputs \['sum'\] must be absorbed roles"):
        two_output_rule(absorb=("norm",))
    with pytest.raises(RuleError, match="reads role 'summ'"):
        two_output_rule(outputs=("summ",), absorb=("sum", "norm", "summ"))


def test_a_custom_rewrite_must_replace_each_output():
    def rewrite(c, rw):  # fuses the norm but forgets to give the sum's readers a value
        return rw.fuse(Op.FUSED_RESIDUAL_LN, [c.id(r) for r in ("x", "residual", "gamma", "beta")],
                       {"eps": 1e-5}, absorbed=[c.id("norm")], result=c.id("norm"))

    rule = Rule("forgets.sum", two_output_rule().anchor, steps=(), result="norm", outputs=("sum",),
                absorb=("sum", "norm"), rewrite=rewrite)
    g = pre_ln()
    found, _ = find(g, "forgets", [rule], {})
    assert len(found) == 1
    with pytest.raises(RuleError, match=r"did not replace the outputs \['sum'\]"):
        apply(g, "forgets", found)


def test_fuse_packed_refuses_a_type_that_is_not_the_packed_results():
    from rlxviz.ir import Rewriter
    from rlxviz.ir.rewrite import RewriteError

    g = pre_ln()
    s = next(n.id for n in g if n.op == Op.ADD)
    y = next(n.id for n in g if n.op == Op.LAYER_NORM)
    rw = Rewriter(g, "t")
    x, r, ga, be = (*g[s].inputs, *g[y].inputs[1:])
    with pytest.raises(RewriteError, match="not the results"):
        rw.fuse_packed(Op.FUSED_RESIDUAL_LN, [x, r, ga, be], {"eps": 1e-5}, absorbed=[s, y], results=[y, s])
    with pytest.raises(RewriteError, match="every result of a multi-output rewrite is absorbed"):
        rw.fuse_packed(Op.FUSED_RESIDUAL_LN, [x, r, ga, be], {"eps": 1e-5, "with_sum": True}, absorbed=[y],
                       results=[y, s])


def test_with_sum_type_rule():
    t = TensorType((2, 3), DType.f32)
    v = TensorType((3,), DType.f32)
    assert infer(Op.FUSED_RESIDUAL_LN, {"eps": 1e-5, "with_sum": True}, (t, t, v, v)) == TensorType((2, 6), DType.f32)
    assert infer(Op.FUSED_RESIDUAL_RMS_NORM, {"eps": 1e-5, "has_bias": True, "with_sum": True},
                 (t, t, v, v, v)).shape == (2, 6)
    with pytest.raises(ShapeError):
        infer(Op.FUSED_RESIDUAL_LN, {"eps": 1e-5, "with_sum": True}, (t, TensorType((1, 3), DType.f32), v, v))


def test_a_returned_sum_reads_as_pre_norm():
    out = run_passes(pre_ln(), [rule_pass("two", [two_output_rule()])]).final
    arch = classify(out, None)  # no attention here: the kind is no_attention, the evidence says pre-norm
    assert any("returned too (pre-norm)" in e for e in arch.evidence), arch
    assert not any("(post-norm)" in e for e in arch.evidence), arch
