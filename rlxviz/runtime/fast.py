"""Fast float32 formulations of transcendentals for MLX's CPU backend.

MLX's CPU kernels for `erf`, `exp`, `tanh` and `sigmoid` evaluate element by element through
scalar libm-style code; mul/add/div/clip/shift vectorize (floor does not: MLX builds its compiled
CPU kernels with `g++ -O3` for baseline x86-64, without SSE4.1's rounding). Measured on 2 AMD EPYC cores
(MLX 0.32.4, `[1024, 1536]` f32, `benchmarks/bench_runtime.py --micro`): erf-GELU 42 ms with
`mx.erf` vs 7 ms with `erf` below; `mx.exp` 12 ms vs 6 ms; softmax over `[8,12,128,128]` 19 ms
vs 10 ms. Each function states its approximation and its maximum error, measured against
float64 NumPy/SciPy on a dense grid (`tests/test_runtime_lowering.py` checks them).

All functions take and return float32 `mx.array`s of any shape and are plain `mx` expressions,
so they trace into `mx.compile`.
"""

from __future__ import annotations

from ..kernels.mlx_backend import mx

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 split for Cody-Waite range reduction (hi has 12 trailing zero bits)
_LN2_LO = 1.428606765330187e-06
_EXP_LO, _EXP_HI = -87.33, 88.75
_ROUND = 12582912.0  # 1.5 * 2^23: (v + _ROUND) - _ROUND rounds a float32 |v| < 2^22 to the nearest integer
_EXP_POLY = (1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 0.5, 1.0, 1.0)  # Taylor, Horner order

# erf(x) = x * P(x^2) / Q(x^2) on [-4, 4] (rational minimax fit, the form used by Eigen and XLA);
# |erf(x)| rounds to 1 in float32 beyond |x| = 3.92.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)

# tanh(x) = x * P(x^2) / Q(x^2) on [-7.9053, 7.9053] (rational minimax fit, as in Eigen);
# beyond that tanh rounds to +-1 in float32.
_TANH_CLAMP = 7.90531110763549805
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
           1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)

_SQRT_HALF = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654


def _horner(x: mx.array, coeffs: tuple[float, ...]) -> mx.array:
    p = mx.array(coeffs[0], dtype=x.dtype)
    for c in coeffs[1:]:
        p = p * x + c
    return p


def _estrin7(r: mx.array) -> mx.array:
    """The degree-7 Taylor polynomial of `e^r` in Estrin's scheme: 4 levels of dependent ops where
    Horner's rule has 14. MLX's CPU compiler stops fusing a chain at a depth of 11 ops, so the shallower
    form keeps the exp in fewer kernels, i.e. fewer passes over memory (fast softmax
    `[8,12,128,128]`, with `exp_nonpositive`: 13.1 -> 10.0 ms CPU time, 2 EPYC cores, load 5)."""
    c7, c6, c5, c4, c3, c2, c1, c0 = _EXP_POLY
    r2 = r * r
    return ((c0 + c1 * r) + r2 * (c2 + c3 * r)) + (r2 * r2) * ((c4 + c5 * r) + r2 * (c6 + c7 * r))


def _exp_reduced(x: mx.array) -> mx.array:
    """`e^x` for `x` already clamped to [-87.33, 88.75]: `k = round(x log2 e)`, `r = x - k ln2`, `2^k e^r`."""
    v = x * _LOG2E
    k = (v + _ROUND) - _ROUND if x.dtype == mx.float32 else mx.floor(v + 0.5)  # 1.5*2^23 overflows f16
    r = x - k * _LN2_HI - k * _LN2_LO
    two_k = mx.left_shift(k.astype(mx.int32) + 127, 23).view(mx.float32)
    return _estrin7(r) * two_k


def exp(x: mx.array) -> mx.array:
    """`e^x`: range reduction `x = k ln2 + r`, `|r| <= ln2/2`, degree-7 Taylor polynomial for
    `e^r` (Estrin's scheme, `_estrin7`), and `2^k` built from its exponent bits (`(k + 127) << 23`
    viewed as float32).

    `k` is `x log2(e)` rounded to the nearest integer by adding and subtracting 1.5 * 2^23 (exact
    for |x log2 e| < 2^22; here <= 128.1), not by `floor(v + 0.5)`: MLX's compiled CPU kernels are
    plain C++ loops built with `g++ -O3` for baseline x86-64, where `floor` is a libm call per element
    and the add/subtract vectorizes (measured on 2 EPYC cores under load, CPU time of a compiled
    `exp` over `[8,12,128,128]`: 12-18 ms with floor, 9.5-10 ms with this). The two roundings differ
    only at exact ties `v = n + 1/2`, where either `k` leaves `|r| = ln2/2`, inside the polynomial's range.
    Other float dtypes keep `floor(v + 0.5)` (the constant is not representable in float16).

    Max relative error 2e-7 (~2 ulp) for `x` in [-87.3, 88.3]. Inputs below -87.33 are clamped
    (result ~1e-38 instead of a denormal or 0: absolute error < 1.2e-38); inputs above 88.375
    return inf (true overflow starts at 88.72). NaN propagates.
    """
    return _exp_reduced(mx.clip(x, _EXP_LO, _EXP_HI))


def exp_nonpositive(x: mx.array) -> mx.array:
    """`exp(x)` for `x <= 0` (a softmax's shifted scores): the same numbers as `exp` there, without
    the upper clamp it cannot need (one op less in the fused chain)."""
    return _exp_reduced(mx.maximum(x, _EXP_LO))


def erf(x: mx.array) -> mx.array:
    """Error function: odd rational approximation `x P(x^2) / Q(x^2)` on `x` clipped to [-4, 4].

    Max absolute error 4.2e-7 (float32 rounding level) over the real line; relative error < 1e-6
    near 0 because the form is odd in `x`.
    """
    x = mx.clip(x, -4.0, 4.0)
    x2 = x * x
    return x * _horner(x2, _ERF_P) / _horner(x2, _ERF_Q)


def tanh(x: mx.array) -> mx.array:
    """Hyperbolic tangent: odd rational approximation `x P(x^2) / Q(x^2)` on `x` clipped to ±7.905.

    Max absolute error 3.6e-7 over the real line; relative error < 1e-6 near 0.
    """
    x = mx.clip(x, -_TANH_CLAMP, _TANH_CLAMP)
    x2 = x * x
    return x * _horner(x2, _TANH_P) / _horner(x2, _TANH_Q)


def sigmoid(x: mx.array) -> mx.array:
    """`1 / (1 + e^-x)` with the fast `exp`: relative error < 2e-7 wherever the result is a
    normal float32; 0 (not a denormal) below x = -88.4, 1 above x = 17."""
    return 1.0 / (1.0 + exp(-x))


def gelu(x: mx.array) -> mx.array:
    """Exact (erf) GELU `0.5 x (1 + erf(x / sqrt 2))` with the rational `erf`: absolute error
    <= 2e-7 * |x| (measured max 1.4e-6 on [-20, 20])."""
    return 0.5 * x * (1.0 + erf(x * _SQRT_HALF))


def gelu_tanh(x: mx.array) -> mx.array:
    """Tanh GELU `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` with the rational `tanh`:
    absolute error <= 2e-7 * |x| (measured max 1e-6 on [-20, 20])."""
    return 0.5 * x * (1.0 + tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


def silu(x: mx.array) -> mx.array:
    """`x * sigmoid(x)` with the fast sigmoid (relative error < 2e-7)."""
    return x * sigmoid(x)


def softmax(x: mx.array, axis: int = -1) -> mx.array:
    """Softmax along `axis`: `e^(x - max) / sum`, with the fast `exp`.

    Max absolute error 2e-6 against float64 (the same as `mx.softmax` on CPU). A masked score of
    `finfo(float32).min` gives ~1e-38 instead of 0. A fully masked row gives the uniform
    distribution, as in the NumPy reference.
    """
    e = exp_nonpositive(x - mx.max(x, axis=axis, keepdims=True))  # x - max <= 0 (NaN stays NaN)
    return e * mx.reciprocal(mx.sum(e, axis=axis, keepdims=True))
