// Float32 transcendentals written branch-free so that loops calling them vectorize (g++ -O3, the ISA
// of the machine that builds them). The formulas, constants and error bounds are those of
// rlxviz/runtime/fast.py (checked there against float64): exp max relative error 2e-7, erf max
// absolute error 4.2e-7, tanh 3.6e-7. NaN propagates through every function.
#pragma once

#include <bit>
#include <cstdint>

namespace rlxviz::vm {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2Hi = 0.693145751953125f;  // Cody-Waite split of ln 2
constexpr float kLn2Lo = 1.428606765330187e-06f;
constexpr float kExpLo = -87.33f, kExpHi = 88.75f;
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: (v + kRound) - kRound rounds |v| < 2^22 to an integer

inline float clampf(float x, float lo, float hi) {
  x = x < lo ? lo : x;  // comparisons are false for NaN: NaN passes through
  return x > hi ? hi : x;
}

// c[0] x^(N-1) + c[1] x^(N-2) + ... + c[N-1] by Horner's rule, highest power first (p = p * x + c[i]: one
// multiply-add a coefficient, in the order the rational fits below list them).
template <int N>
inline float horner(float x, const float (&c)[N]) {
  float p = c[0];
#pragma GCC unroll 16
  for (int i = 1; i < N; ++i) p = p * x + c[i];
  return p;
}

// e^x: x = k ln2 + r, degree-7 Taylor polynomial of e^r (Estrin), 2^k from its exponent bits.
// Below -87.33 the result is ~1e-38 (not a denormal or 0); above 88.375 it is inf.
inline float exp(float x) {
  x = clampf(x, kExpLo, kExpHi);
  float k = (x * kLog2e + kRound) - kRound;
  float r = x - k * kLn2Hi - k * kLn2Lo;
  float r2 = r * r;
  float e = ((1.0f + 1.0f * r) + r2 * (0.5f + (1.0f / 6) * r)) +
            (r2 * r2) * (((1.0f / 24) + (1.0f / 120) * r) + r2 * ((1.0f / 720) + (1.0f / 5040) * r));
  int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  return e * std::bit_cast<float>(bits);
}

// erf(x) = x P(x^2) / Q(x^2) on x clipped to [-4, 4] (rational minimax fit, as in Eigen / XLA).
inline float erf(float x) {
  x = clampf(x, -4.0f, 4.0f);
  const float x2 = x * x;
  constexpr float p[] = {-2.72614225801306e-10f, 2.77068142495902e-08f, -2.10102402082508e-06f,
                         -5.69250639462346e-05f, -7.34990630326855e-04f, -2.95459980854025e-03f,
                         -1.60960333262415e-02f};
  constexpr float q[] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f,
                         -7.37332916720468e-03f, -1.42647390514189e-02f};
  return x * horner(x2, p) / horner(x2, q);
}

// tanh(x) = x P(x^2) / Q(x^2) on x clipped to +-7.9053 (rational minimax fit, as in Eigen).
inline float tanh(float x) {
  x = clampf(x, -7.90531110763549805f, 7.90531110763549805f);
  const float x2 = x * x;
  constexpr float p[] = {-2.76076847742355e-16f, 2.00018790482477e-13f, -8.60467152213735e-11f,
                         5.12229709037114e-08f,  1.48572235717979e-05f, 6.37261928875436e-04f,
                         4.89352455891786e-03f};
  constexpr float q[] = {1.19825839466702e-06f, 1.18534705686654e-04f, 2.26843463243900e-03f,
                         4.89352518554385e-03f};
  return x * horner(x2, p) / horner(x2, q);
}

inline float gelu(float x) { return 0.5f * x * (1.0f + erf(x * 0.7071067811865476f)); }

inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

inline float silu(float x) { return x * (1.0f / (1.0f + exp(-x))); }

inline float relu(float x) { return x < 0.0f ? 0.0f : x; }

// Squared ReLU (Primer, Nemotron): r * r with r = relu(x), the IR's relu2 exactly.
inline float relu2(float x) {
  const float r = relu(x);
  return r * r;
}

}  // namespace rlxviz::vm
