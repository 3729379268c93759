"""The Panel app: `AppState` (no Panel import) and the views in `controls`, `panels`, `main`."""

from .state import VARIANT_LABELS, AppState

__all__ = ["VARIANT_LABELS", "AppState"]
