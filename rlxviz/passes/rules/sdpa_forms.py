"""Near misses `fuse_sdpa.hf_attention` names in front of its scores' pattern: RoPE written on the heads that
`fuse_sdpa.rope_heads` / `fuse_sdpa.rope_pairs` did not rewrite (quoting their own refusal, `engine.refusal`), and
multi-head latent attention (DeepSeek MLA). Readers only: nothing here rewrites.
"""

from __future__ import annotations

from ...ir import Graph, Node, Op
from ..engine import refusal
from ..guard import NOT_RECOGNIZED, Ctx
from ..pattern import is_const
from ..rope_forms import interleaved_rope, rotate_half_rope
from ..rule import Fail, Rule, reports
from ..search import attempt
from .rope_heads import ROPE_HEADS
from .rope_pairs import ROPE_PAIRS


def _scores_matmul(g: Graph, softmax: Node) -> Node | None:
    """The `Q @ K^T` matmul under a softmax, through at most three mask adds / scale muls or divs."""
    todo = [(softmax.inputs[0], 0)]
    while todo:
        i, d = todo.pop()
        n = g[i]
        if n.op == Op.MATMUL and n.rank == 4:
            return n
        if d < 3 and n.op in (Op.ADD, Op.MUL, Op.DIV, Op.WHERE):
            todo += [(j, d + 1) for j in n.inputs]
    return None


def _under(g: Graph, n: Node) -> list[Node]:
    """`n` and what a rotation reaches the scores through: a transpose, a cast (a half-precision model's rotation in
    float32), a scalar-constant scale, the rotated part of a partial-rotary `concat(rot, pass)` (up to three steps)."""
    out = [n]
    for _ in range(3):
        if n.op in (Op.TRANSPOSE, Op.CAST) or (n.op == Op.CONCAT and len(n.inputs) == 2):
            n = g[n.inputs[0]]
        elif n.op in (Op.MUL, Op.DIV) and len(n.inputs) == 2 and sum(is_const(g[i]) for i in n.inputs) == 1:
            n = g[next(i for i in n.inputs if not is_const(g[i]))]
        else:
            break
        out.append(n)
    return out


def _score_operands(g: Graph, softmax: Node) -> list[tuple[str, Node]]:
    """The nodes under Q ("Q") and K ("K", past its transpose) that feed the scores matmul of `softmax` (`_under`),
    [] when the scores are no matmul the pattern reads."""
    mm = _scores_matmul(g, softmax)
    if mm is None:
        return []
    k = g[mm.inputs[1]]
    k = g[k.inputs[0]] if k.op == Op.TRANSPOSE else k
    return [(who, m) for who, n in (("Q", g[mm.inputs[0]]), ("K", k)) for m in _under(g, n)]


def _stage_off(c: Ctx, what: str, add: int, stage: Rule) -> Fail | None:
    """The refusal when `stage` (a stage of fuse_sdpa that rewrites the rotation `what` at node `add`) matches there
    now: it did not run before fuse_sdpa, so the pipeline skips it (`Pipeline.disable`). Nothing in the model is
    wrong and no op is missing: the fix is the stage switched back on, so the refusal names no compiler fix (it
    counts as a near-miss, not a gap in rlxviz's ops). None when the stage refuses the form (its own words say
    why)."""
    if attempt(stage, c.graph, add, c.params)[1]:
        return None
    step = stage.name.replace(".", "/", 1)
    return Fail("guard", "rope_on_heads",
                f"{what}; {stage.name} rewrites it here, but it did not run before fuse_sdpa: this pipeline skips "
                f"the {step} stage", (add,), (),
                f"nothing to change in the model: switch the {step} stage back on (it rewrites this form)",
                subject=add, kind=NOT_RECOGNIZED)


@reports("rope_on_heads", reads=("softmax",))
def rope_on_heads(c: Ctx) -> Fail | None:
    """Name RoPE written on the heads (`q * cos + rotate_half(q) * sin` after the head split) in front of the
    scores: the HF pattern takes Q and K straight from the head split, so the rotation is what blocks it."""
    g = c.graph
    operands = _score_operands(g, c["softmax"])
    if not operands:
        return None
    twos = [(who, r) for who, n in operands if (r := interleaved_rope(g, n)) is not None]
    if twos:
        who, (add, cat) = twos[0]
        both = " and K" if len({w for w, _ in twos}) == 2 else ""
        what = (f"{who}{both} rotated by RoPE written interleaved (rotate_every_two, GPT-J): {c.name_of(add)} = "
                f"h * cos + rotate_every_two(h) * sin")
        if (off := _stage_off(c, what, add, ROPE_PAIRS)) is not None:
            return off
        return Fail("guard", "rope_on_heads",
                    f"{who}{both} rotated by RoPE written interleaved (rotate_every_two, GPT-J): {c.name_of(add)} = "
                    f"h * cos + rotate_every_two(h) * sin (pairs h[2i], h[2i+1]: {c.name_of(cat)}); the rope op "
                    f"rotates them with rope(interleaved=True), but fuse_sdpa.rope_pairs did not rewrite it: "
                    f"{refusal(ROPE_PAIRS, g, add) or 'a product of the form is read elsewhere'}", (add,), (),
                    "nothing to change in the model: an interleaved rotation keeps its attention as primitives",
                    subject=add, kind=NOT_RECOGNIZED,
                    fix="fuse_sdpa.rope_pairs rewrites h * cos + rotate_every_two(h) * sin with neighbour-equal "
                        "[S, d] tables whose values are known and no other reader of its products; teach it this "
                        "form")
    found = [(who, rotate_half_rope(g, n)) for who, n in operands]
    found = [(who, r) for who, r in found if r is not None]
    if not found:
        return None
    who, (add, cat) = found[0]
    both = " and K" if len({w for w, _ in found}) == 2 else ""
    what = f"{who}{both} rotated by RoPE written on the heads: {c.name_of(add)} = h * cos + rotate_half(h) * sin"
    if (off := _stage_off(c, what, add, ROPE_HEADS)) is not None:
        return off
    why = refusal(ROPE_HEADS, g, add)
    return Fail("guard", "rope_on_heads",
                f"{who}{both} rotated by RoPE written on the heads: {c.name_of(add)} = h * cos + rotate_half(h) * sin "
                f"(rotate_half: {c.name_of(cat)}); the attention pattern takes Q and K straight from the head split"
                + (f"; fuse_sdpa.rope_heads did not rewrite it: {why}" if why else ""),
                (add,), (), "apply the rope op to the Q/K projections before the head split (rlxviz's rope op, "
                "NeoX half split), so the attention packs", subject=add, kind=NOT_RECOGNIZED,
                fix="fuse_sdpa.rope_heads rewrites h * cos + rotate_half(h) * sin with cos = concat(t, t) of an "
                    "[S, d/2] table and no other reader of its products; teach it this form")


@reports("latent_heads", reads=("softmax",))
def latent_heads(c: Ctx) -> Fail | None:
    """Name multi-head latent attention (DeepSeek-V2/V3's MLA) in front of the scores: Q (and K) reach the score
    matmul as a concat along head_dim of a part without RoPE and a rotated part (`q = concat(q_nope, q_rope)`, K's
    rotated part shared by every head), not as the head split of one projection the pattern reads."""
    g = c.graph
    operands = _score_operands(g, c["softmax"])

    def rotated(i: int) -> bool:
        """A RoPE as the patterns read it, or rotation-shaped: `x * cos + cat(-x2, x1) * sin` with any tables."""
        n = g[i]
        while n.op == Op.TRANSPOSE:  # a rope op on the packed values, back in the head layout
            n = g[n.inputs[0]]
        if n.op == Op.RESHAPE and g[n.inputs[0]].op == Op.ROPE:
            return True
        if n.op == Op.ROPE or rotate_half_rope(g, n) is not None or interleaved_rope(g, n) is not None:
            return True
        return n.op == Op.ADD and any(
            g[m].op == Op.MUL and any(g[j].op == Op.CONCAT and any(g[t].op == Op.NEG for t in g[j].inputs)
                                      for j in g[m].inputs) for m in n.inputs)

    # MLA's order: (the part without RoPE, the rotated part); a partial rotary (GPT-NeoX, Phi) is (rotated, pass)
    cats = [(who, m) for who, m in operands
            if m.op == Op.CONCAT and m.rank == 4 and int(m.attrs.get("axis", -1)) % 4 == 3 and len(m.inputs) == 2
            and rotated(m.inputs[1]) and not rotated(m.inputs[0])]
    if not cats:
        return None
    who, cat = cats[0]
    d1, d2 = (g[i].shape[-1] for i in cat.inputs)
    both = " and K" if len({w for w, _ in cats}) == 2 else ""
    return Fail("guard", "latent_heads",
                f"multi-head latent attention (DeepSeek MLA): {who}{both} = concat(part without RoPE [{d1}], rotated "
                f"part [{d2}]) along head_dim at {c.name_of(cat.id)} (head_dim {d1 + d2}); the attention pattern "
                f"reads Q and K as the head split of one projection, so these scores stay as primitives",
                (cat.id,), (), "nothing to change in the model: the latent attention's heads are its own design",
                subject=cat.id, kind=NOT_RECOGNIZED,
                fix="an attention pattern for heads concatenated along head_dim (fuse_sdpa reading them as one head "
                    "split: q . k sums over both parts, exact)")

__all__ = ["latent_heads", "rope_on_heads"]
