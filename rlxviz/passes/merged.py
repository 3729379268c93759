"""A refusal caused by rlxviz's own shared-input merge: the one wording of its fix, whatever view prints it.

`fuse_shared_input_matmul` packs the projections of one input into one matmul and slices each back with a `narrow`.
When it packs another projection with Q/K/V (GPT-J's, Phi's, CodeGen's parallel block: the MLP's `fc_in` reads the
same normed input), the packed projection is wider than Q/K/V and that projection's slice is one more reader of it,
so `fuse_attention_block` refuses it (`qkv_split`, `qkv_user_count`). Both were worded as the model's fault ("split
Q/K/V at 0/H/2H", "none in the model: narrow (node 226) reads qkv ... removing or rerouting it changes the model's
outputs") while the slice and the extra width are rlxviz's. `merged_advice` rewords such a refusal where it is made
(`search.attempt`), so `explain` (-v, --json), the app's inspector and Why tab and the Model Explorer export all read
the same `hint` and `fix`: nothing to change in the model, and a compiler fix that names the merge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..ir import Graph, Node, Op
from .refusal_kinds import COMPILER_ONLY, NOTHING_TO_CHANGE

MERGE_PASS = "fuse_shared_input_matmul"
"""The pass whose slices (`narrow`s of its packed projection) a refusal may blame."""

MERGED_HINT = (NOTHING_TO_CHANGE + ": {who} {verb} rlxviz's own, not the model's: its " + MERGE_PASS + " merged {members} "
               "into this projection")
"""The fix line (`Rejection.hint`) of a refusal whose readers are all slices of rlxviz's merge (`merge_slices`)."""

MERGED_FIX = ("rlxviz's " + MERGE_PASS + " merged {members} into this projection: leave {it} out of the merge (or "
              "split the merge back) before {pass_name}")
"""The compiler fix (`Rejection.fix`) of such a refusal: undo rlxviz's own packing, not a multi-output op."""


def merge_slices(g: Graph, readers: Sequence[int]) -> tuple[int, ...]:
    """`readers` when every one is a `narrow` that `fuse_shared_input_matmul` made (a slice of its packed projection,
    `Node.pass_name`), else (): a refusal blames rlxviz's merge only when nothing else is in its way."""
    nodes = [g[i] for i in readers if i in g]
    if not nodes or len(nodes) != len(readers):
        return ()
    if all(n.op == Op.NARROW and n.pass_name == MERGE_PASS for n in nodes):
        return tuple(readers)
    return ()


def merged_member(g: Graph, s: Node) -> str:
    """What the slice `s` (a `narrow` of a packed projection) stands for: the path of the member weight whose columns
    it takes in the merge's `concat` of weights (`model.h.0.mlp.fc_in`), else "another projection of the same
    input"."""
    src = g[s.inputs[0]]
    w = g[src.inputs[1]] if src.op in (Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT) and len(src.inputs) > 1 else None
    start, length = s.attrs.get("start"), s.attrs.get("length")
    if w is not None and w.op == Op.CONCAT and w.pass_name == MERGE_PASS and isinstance(start, int):
        at = 0
        for j in w.inputs:
            width = g[j].shape[-1] if g[j].shape else 0
            if at == start and width == length:
                n = g[j]
                return n.path or n.name or f"node {j}"
            at += width
    return "another projection of the same input"


def merged_advice(g: Graph, readers: Sequence[int], name_of: Callable[[int], str], pass_name: str
                  ) -> tuple[str, str, str] | None:
    """`(remedy, hint, fix)` of a refusal by `pass_name` whose `readers` (its offending nodes, or the unbound readers
    of its subject) are all slices of rlxviz's own merge (`merge_slices`): `COMPILER_ONLY`, `MERGED_HINT` and
    `MERGED_FIX`, naming each slice (`name_of`) and the projection merged in (`merged_member`); None otherwise."""
    slices = merge_slices(g, readers)
    if not slices:
        return None
    members = ", ".join(dict.fromkeys(merged_member(g, g[i]) for i in slices))
    one = len(slices) == 1
    who = ", ".join(name_of(i) for i in slices[:3]) + (f" and {len(slices) - 3} more" if len(slices) > 3 else "")
    hint = MERGED_HINT.format(who=who, verb="is" if one else "are", members=members)
    return COMPILER_ONLY, hint, MERGED_FIX.format(members=members, it="it" if one else "them", pass_name=pass_name)


__all__ = ["MERGED_FIX", "MERGED_HINT", "MERGE_PASS", "merge_slices", "merged_advice", "merged_member"]
