"""The graph views' names, defined once (the View control, the state's drawing and the panes use these).

* `AUTO`: `FULL` for small models, `COLLAPSED` for big ones (`AppState.resolved_view`);
* `FULL`: every node;
* `COLLAPSED`: one box per layer, a clicked layer drawn open in place;
* `FOCUS`: the selected layer only.
"""

from __future__ import annotations

AUTO = "auto"
FULL = "full"
COLLAPSED = "collapsed"
FOCUS = "focus"
VIEWS = (AUTO, FULL, COLLAPSED, FOCUS)
"""Every view, in the order the View control lists them."""

__all__ = ["AUTO", "COLLAPSED", "FOCUS", "FULL", "VIEWS"]
