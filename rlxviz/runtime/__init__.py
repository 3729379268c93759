"""Execution: the NumPy reference interpreter (the oracle) and the MLX runtime."""

from .reference import IMPLS, NumpyEmitter, bind_leaf, run_reference

__all__ = ["IMPLS", "NumpyEmitter", "bind_leaf", "run_reference"]
