"""What the cost test's recorded costs say in context, for tests that check a message is made from them."""

from __future__ import annotations

from rlxviz.passes.report import block_in_context, name_users_nodes
from rlxviz.passes.trace import Rejection, Trace


def cost_reason(trace: Trace, r: Rejection) -> str:
    """Each member's `it would cost ...` of the cost test's refusal `r` of `trace`, from the costs it recorded
    (`r.costs`, `merge_costs.MergeCosts.reason`) in context (`report.block_in_context`, `report.name_users_nodes`),
    joined by "; "; "" for a refusal that records no costs. The part of the message (`places.own_item`,
    `report.block_cost_in_context`) the costs make; the product words the whole message, never this part alone."""
    if r.costs is None:
        return ""
    return name_users_nodes(trace, r.costs.reason(lambda c: block_in_context(trace, c)))
