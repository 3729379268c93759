"""What a merge the tool's own cost test declined would cost, as data (`merge_keeps_fusions`, `rules.shared_input`).

The rule records each left-out member's cost on its refusal (`trace.Rejection.costs`), and every view words it
from that record: the refusal's own message (`MergeCosts.message`), `explain`'s message in context, which names what
holds a protected attention block back (`report.block_cost_in_context`), which the chip item says whole
(`why.places.own_item`). None of them reads the words back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    """What merging one member of a shared-input group would cost.

    Attributes:
        member: the member matmul left out (node id of the graph the pass saw).
        label: the member as messages name it (`matmul with W (node 69, PATH)`, `pattern.describe`).
        epilogue: the allow-listed activation `fuse_matmul_bias_act` would absorb into the member (node id), or None.
        epilogue_op: that activation's op name (`gelu`); "" without one.
        attention: the attention whose block the member's merge would cost (node id; its Q/K/V are merged alone),
            or None.
        attention_label: that attention as messages name it (`attention (node 233, PATH)`); "" without one.
        width: the packed projection's output width with the member (Q/K/V's plus the member's), in columns.
        qkv_width: Q/K/V's packed width alone, in columns; 0 without an attention.
    """

    member: int
    label: str
    epilogue: int | None = None
    epilogue_op: str = ""
    attention: int | None = None
    attention_label: str = ""
    width: int = 0
    qkv_width: int = 0

    @property
    def packed(self) -> str:
        """Why the attention block is lost: `Q/K/V packed with it would be 192 wide instead of 64`."""
        return f"Q/K/V packed with it would be {self.width} wide instead of {self.qkv_width}"

    def block(self) -> str:
        """The attention block the merge would cost, as the record words it: `the attention block at attention
        (node 233, PATH) (Q/K/V packed with it would be 192 wide instead of 64)`; "" without an attention."""
        return f"the attention block at {self.attention_label} ({self.packed})" if self.attention is not None else ""

    def words(self, block: str | None = None) -> str:
        """`it would cost its gelu epilogue (gelu node 46) and the attention block at ...`: each fusion lost, the
        attention block worded `block` where given (in context: what holds it back), else `Cost.block`."""
        parts = [f"its {self.epilogue_op} epilogue ({self.epilogue_op} node {self.epilogue})"
                 if self.epilogue is not None else "",
                 (self.block() if block is None else block) if self.attention is not None else ""]
        return "it would cost " + " and ".join(p for p in parts if p)


@dataclass(frozen=True)
class MergeCosts:
    """A refusal of the cost test: the members it left out, each with its cost, and the members it merged.

    Attributes:
        costs: one `Cost` per left-out member, in the group's order.
        kept: the labels of the members it merged (fewer than 2: nothing merged, the refusal is hard).
    """

    costs: tuple[Cost, ...]
    kept: tuple[str, ...] = ()

    def message(self, block: Callable[[Cost], str | None] = lambda c: None) -> str:
        """The refusal's message: `LABEL is not merged: it would cost ...` for each left-out member, then `; merged:
        KEPT`, or `; fewer than 2 matmuls would be left to merge (only LABEL)` when fewer than two are kept. `block`
        words a member's attention block (None: as recorded, `Cost.block`)."""
        why = "; ".join(f"{c.label} is not merged: {c.words(block(c))}" for c in self.costs)
        if len(self.kept) >= 2:
            return f"{why}; merged: {', '.join(self.kept)}"
        left = f" (only {self.kept[0]})" if self.kept else ""
        return f"{why}; fewer than 2 matmuls would be left to merge{left}"

    def reason(self, block: Callable[[Cost], str | None] = lambda c: None) -> str:
        """Why the members were left out, each member's `it would cost ...` joined by "; " (`message` less the
        labels and the merged members)."""
        return "; ".join(c.words(block(c)) for c in self.costs)


__all__ = ["Cost", "MergeCosts"]
