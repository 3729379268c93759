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

MERGED_HINT = (NOTHING_TO_CHANGE + ": {who} {verb} rlxviz's own, not the model's: its " + MERGE_PASS
               + " merged {members} into this projection")
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
    """What the slice `s` (a `narrow` of a packed projection's last axis) stands for: the path of the member weight
    whose columns it takes in the merge's `concat` of weights (`model.h.0.mlp.fc_in`), followed through the transposes
    and column gathers later rewrites put in front of it (`fuse_attention_block.qkv_columns`' permutation of CodeGen's
    Q/K/V block); "another projection of the same input" when it cannot be followed."""
    src = g[s.inputs[0]]
    start, length = s.attrs.get("start"), s.attrs.get("length")
    if src.op not in (Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT) or len(src.inputs) < 2 or not isinstance(start, int):
        return OTHER
    member = _member_at(g, src.inputs[1], len(g[src.inputs[1]].shape) - 1, list(range(start, start + length)))
    return (member.path or member.name or f"node {member.id}") if member is not None else OTHER


OTHER = "another projection of the same input"
"""`merged_member`'s words for a member it cannot name."""


def _member_at(g: Graph, w: int, axis: int, cols: list[int]) -> Node | None:
    """The member weight of the merge's `concat` (`MERGE_PASS`) that holds all of `cols` of node `w`'s `axis`, through
    `transpose`s and `gather`s by a constant index on that axis; None when another node is in the way or the columns
    span several members."""
    for _ in range(16):
        n = g[w]
        if n.op == Op.CONCAT and n.pass_name == MERGE_PASS and n.attrs.get("axis") in (axis, axis - len(n.shape)):
            at = 0
            for j in n.inputs:
                width = g[j].shape[axis] if len(g[j].shape) > axis else 0
                if all(at <= c < at + width for c in cols):
                    return g[j]
                at += width
            return None
        if n.op == Op.TRANSPOSE and len(n.attrs.get("perm", ())) > axis:
            axis, w = n.attrs["perm"][axis], n.inputs[0]
        elif n.op == Op.GATHER and n.attrs.get("axis", 0) == axis and g[n.inputs[1]].op == Op.CONST:
            index = g[n.inputs[1]].attrs.get("value")
            if not isinstance(index, (tuple, list)) or any(c >= len(index) for c in cols):
                return None
            cols, w = [int(index[c]) for c in cols], n.inputs[0]
        else:
            return None
    return None


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


__all__ = ["MERGED_FIX", "MERGED_HINT", "MERGE_PASS", "OTHER", "merge_slices", "merged_advice", "merged_member"]
