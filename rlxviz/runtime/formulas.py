"""Array formulas written once for both array libraries: the NumPy reference and the MLX lowering.

Each function uses only what NumPy and MLX arrays share (`reshape`, `transpose`, basic slicing,
`*`, `+`, `-`) and takes the library's `concatenate` where it needs one, so the oracle and the
MLX kernel compute a primitive op with the same expression.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

A = TypeVar("A")


def split_heads(x: A, heads: int) -> A:
    """Packed `[B, S, heads*D]` -> `[B, heads, S, D]`."""
    b, s, _ = x.shape  # type: ignore[attr-defined]
    return x.reshape(b, s, heads, -1).transpose(0, 2, 1, 3)  # type: ignore[attr-defined]


def merge_heads(x: A) -> A:
    """`[B, heads, S, D]` -> packed `[B, S, heads*D]` (inverse of `split_heads`)."""
    b, h, s, d = x.shape  # type: ignore[attr-defined]
    return x.transpose(0, 2, 1, 3).reshape(b, s, h * d)  # type: ignore[attr-defined]


def rope(x: A, cos: A, sin: A, head_dim: int, n_rot: int, concatenate: Callable[[Sequence[Any], int], A],
         interleaved: bool = False) -> A:
    """Rotary embedding (Su et al. 2021) of packed `[B, S, heads*head_dim]`.

    In each head the first `n_rot` dims hold `n_rot/2` pairs `(x1_i, x2_i)`, each rotated by angle i:
    `(x1 c - x2 s, x2 c + x1 s)`; dims beyond `n_rot` pass through. NeoX (default) pairs the halves,
    `x1 = x[:n_rot/2]`, `x2 = x[n_rot/2:n_rot]`; `interleaved` (GPT-J's rotate_every_two, MLX `traditional`)
    pairs neighbours, `x1 = x[0:n_rot:2]`, `x2 = x[1:n_rot:2]`, and writes each pair back in place. `cos`/`sin`
    are `[max_pos, >= n_rot/2]` tables indexed by sequence position 0..S-1, or `[B or 1, >= S, >= n_rot/2]`: one
    table per batch row (RoPE at `position_ids` that differ by row). Returns `x`'s shape.
    """
    b, s, hd = x.shape  # type: ignore[attr-defined]
    xh = x.reshape(b, s, hd // head_dim, head_dim)  # type: ignore[attr-defined]
    half = n_rot // 2
    if len(cos.shape) == 3:  # type: ignore[attr-defined]
        c = cos[:, :s, :half][:, :, None, :]  # type: ignore[index]
        sn = sin[:, :s, :half][:, :, None, :]  # type: ignore[index]
    else:
        c = cos[:s, :half][None, :, None, :]  # type: ignore[index]
        sn = sin[:s, :half][None, :, None, :]  # type: ignore[index]
    if interleaved:
        pairs = xh[..., :n_rot].reshape(b, s, hd // head_dim, half, 2)  # type: ignore[attr-defined]
        x1, x2 = pairs[..., 0], pairs[..., 1]
        out = [(x1 * c - x2 * sn)[..., None], (x2 * c + x1 * sn)[..., None]]
        parts = [concatenate(out, -1).reshape(b, s, hd // head_dim, n_rot)]  # type: ignore[attr-defined]
        if n_rot < head_dim:
            parts.append(xh[..., n_rot:])
        return concatenate(parts, -1).reshape(b, s, hd)  # type: ignore[attr-defined]
    x1, x2 = xh[..., :half], xh[..., half:n_rot]
    parts = [x1 * c - x2 * sn, x2 * c + x1 * sn]
    if n_rot < head_dim:
        parts.append(xh[..., n_rot:])
    return concatenate(parts, -1).reshape(b, s, hd)  # type: ignore[attr-defined]
