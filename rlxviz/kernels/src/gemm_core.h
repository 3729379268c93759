// The GEMM's blocking, micro-kernel and epilogue, free of MLX (gemm.cpp wraps them as primitives), so that they
// can be compiled and timed alone. See gemm.cpp for the loop order and the numerics.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <unistd.h>

#include "act.h"
#include "pool.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace rlxviz {
namespace gemm_core {

#if defined(__AVX512F__)
constexpr int kGemmVec = 16;  // floats per vector register (zmm)
constexpr int kGemmMR = 12;   // 12 x 32 tile: 24 accumulators + 2 B vectors + 1 broadcast of 32 registers
#elif defined(__AVX2__) || defined(__AVX__)
constexpr int kGemmVec = 8;  // ymm
constexpr int kGemmMR = 6;   // 6 x 16 tile: 12 accumulators + 2 B vectors + 1 broadcast of 16 registers
#else
constexpr int kGemmVec = 4;  // xmm / NEON
constexpr int kGemmMR = 6;
#endif
constexpr int kGemmNR = 2 * kGemmVec;  // columns per packed panel


constexpr int kMR = kGemmMR, kNR = kGemmNR, kVec = kGemmVec;
// Block sizes (overridable to tune them with a stand-alone build of this header): kMC 16 groups / all panels per
// item measured best of {8, 16, 32} x {8, all} on 2 AMD EPYC cores (AVX2) at MiniLM's shapes, 1 thread: 59-80
// GFLOP/s with 8 panels per item, 77-86 with all. The reduction block (`kc_block`) follows the L1 data cache:
// a panel slice is kc x kNR floats, reused by every group of a work item. KC 256 measured best of {128, 256,
// 384, 512} on AVX2 with a 32 KB L1d (Zen 1; 16 KB slices); with AVX-512 and a 48 KB L1d (Zen 5) 384 took 5-10%
// less time than 256 at 128 rows in 5 alternated runs of benchmarks/gemm_core_bench.cpp (2026-12-03; MiniLM's
// K = 384 is then one block; within the noise at 1024 rows). AVX-512 machines with a 32 KB L1d (Zen 4,
// Skylake-SP) keep 256, the value they were measured with (2026-12-02), not re-measured with 384.
#ifndef RLXVIZ_GEMM_MC_GROUPS
#define RLXVIZ_GEMM_MC_GROUPS 16
#endif
#ifndef RLXVIZ_GEMM_PANELS
#define RLXVIZ_GEMM_PANELS (1 << 20)
#endif

// The reduction block: RLXVIZ_GEMM_KC when the build sets it; else 384 with AVX-512 and an L1 data cache of at
// least 48 KB (glibc's sysconf; 0 where it does not know), 256 otherwise.
inline int kc_block() {
#ifdef RLXVIZ_GEMM_KC
  return RLXVIZ_GEMM_KC;
#else
  static const int kc = [] {
    const long l1d = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return kVec == 16 && l1d >= 48 * 1024 ? 384 : 256;
  }();
  return kc;
#endif
}
constexpr int kMC = RLXVIZ_GEMM_MC_GROUPS * kMR;     // rows per work item at most (A block kMC x kc_block() in L2)
constexpr int kPanels = RLXVIZ_GEMM_PANELS;          // packed panels per work item at most (all: B streams from L3)

typedef float vec __attribute__((vector_size(kVec * sizeof(float))));
typedef float vecu __attribute__((vector_size(kVec * sizeof(float)), aligned(sizeof(float))));
inline vec vload(const float* p) { return *reinterpret_cast<const vecu*>(p); }
inline void vstore(float* p, vec v) { *reinterpret_cast<vecu*>(p) = v; }

// c[i][0:kNR] (+)= sum_k a[k][i] * b[k][0:kNR], i < R <= kMR: a is kMR-interleaved [kc][kMR], b one panel
// slice [kc][kNR], c row stride ldc. The accumulators live in registers (the loops over i unroll fully). R < kMR
// serves a row block's last, partial group without computing its padding rows (MiniLM's 128 rows at batch 1 are
// 10 groups of 12 and one of 8). `next` (or null): a slice of the same size to prefetch into L2 meanwhile, the
// panel computed next, whose weights would otherwise come from DRAM when a model's weights outgrow the L3.
template <int R = kMR>
inline void micro_kernel(const float* __restrict a, const float* __restrict b, int kc, float* __restrict c,
                         int64_t ldc, bool accumulate, const float* next = nullptr) {
  static_assert(R >= 1 && R <= kMR);
  vec acc0[R], acc1[R];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    acc0[i] = accumulate ? vload(c + i * ldc) : vec{};
    acc1[i] = accumulate ? vload(c + i * ldc + kVec) : vec{};
  }
#pragma GCC unroll 4
  for (int k = 0; k < kc; ++k) {
    const vec b0 = vload(b + k * kNR), b1 = vload(b + k * kNR + kVec);
    if (next)
      for (int j = 0; j < kNR; j += 64 / sizeof(float)) __builtin_prefetch(next + k * kNR + j, 0, 2);
    const float* ak = a + k * kMR;
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      acc0[i] += ak[i] * b0;
      acc1[i] += ak[i] * b1;
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    vstore(c + i * ldc, acc0[i]);
    vstore(c + i * ldc + kVec, acc1[i]);
  }
}

// micro_kernel<rows>, 1 <= rows <= kMR, chosen at run time.
template <int... R>
inline void micro_kernel_rows(int rows, const float* a, const float* b, int kc, float* c, int64_t ldc,
                              bool accumulate, const float* next, std::integer_sequence<int, R...>) {
  using Kernel = void (*)(const float*, const float*, int, float*, int64_t, bool, const float*);
  static constexpr Kernel kernels[] = {&micro_kernel<R + 1>...};
  kernels[rows - 1](a, b, kc, c, ldc, accumulate, next);
}

inline void micro_kernel_rows(int rows, const float* a, const float* b, int kc, float* c, int64_t ldc,
                              bool accumulate, const float* next) {
  if (rows == kMR) return micro_kernel<kMR>(a, b, kc, c, ldc, accumulate, next);
  micro_kernel_rows(rows, a, b, kc, c, ldc, accumulate, next, std::make_integer_sequence<int, kMR>{});
}

// y[0:n] = act(y + bias) + res over one row of a tile (bias / res may be null).
template <Act A>
inline void epilogue_row(float* __restrict y, const float* __restrict bias, const float* __restrict res, int n) {
  if (bias && res) {
#pragma omp simd
    for (int j = 0; j < n; ++j) y[j] = act<A>(y[j] + bias[j]) + res[j];
  } else if (bias) {
#pragma omp simd
    for (int j = 0; j < n; ++j) y[j] = act<A>(y[j] + bias[j]);
  } else if (res) {
#pragma omp simd
    for (int j = 0; j < n; ++j) y[j] = act<A>(y[j]) + res[j];
  } else if constexpr (A != Act::none) {
#pragma omp simd
    for (int j = 0; j < n; ++j) y[j] = act<A>(y[j]);
  }
}

inline void epilogue_row(Act a, float* y, const float* bias, const float* res, int n) {
  switch (a) {
    case Act::gelu: return epilogue_row<Act::gelu>(y, bias, res, n);
    case Act::gelu_tanh: return epilogue_row<Act::gelu_tanh>(y, bias, res, n);
    case Act::silu: return epilogue_row<Act::silu>(y, bias, res, n);
    case Act::relu: return epilogue_row<Act::relu>(y, bias, res, n);
    case Act::relu2: return epilogue_row<Act::relu2>(y, bias, res, n);
    case Act::none: return epilogue_row<Act::none>(y, bias, res, n);
  }
}

// w [k, n] (element (kk, j) at w[kk * s0 + j * s1]) -> panels [ceil(n / kNR)][k][kNR], columns past n zero.
inline void pack_panels(const float* w, int64_t s0, int64_t s1, int k, int n, float* dst) {
  const int panels = (n + kNR - 1) / kNR;
  for (int p = 0; p < panels; ++p)
    for (int kk = 0; kk < k; ++kk) {
      float* row = dst + (static_cast<int64_t>(p) * k + kk) * kNR;
      for (int j = 0; j < kNR; ++j) {
        const int col = p * kNR + j;
        row[j] = col < n ? w[kk * s0 + col * s1] : 0.0f;
      }
    }
}

// One group of A, kMR-interleaved: dst[k * kMR + i] = a[i * rs + k * cs] for k < kc, i < rows (<= kMR), and
// 0 for rows i >= rows. With AVX-512, unit stride and a full group, 16 columns at a time go through a 16 x 16
// register transpose (rows 12-15 zero, 12 lanes stored): the scalar copy is a store per element, and packing
// took 12% of MiniLM's FFN-down GEMM at batch 1 (K = 1536, one thread, `perf`, 2026-12-03, Zen 5).
inline void pack_a_group(const float* __restrict a, int64_t rs, int64_t cs, int rows, int kc, float* __restrict dst) {
  int k0 = 0;
#if defined(__AVX512F__)
  static_assert(kMR == 12);
  if (cs == 1 && rows == kMR) {
    const __mmask16 lanes = 0x0fff;
    for (; k0 + 16 <= kc; k0 += 16) {
      __m512 r[16], t[16];
      for (int i = 0; i < 12; ++i) r[i] = _mm512_loadu_ps(a + i * rs + k0);
      for (int i = 12; i < 16; ++i) r[i] = _mm512_setzero_ps();
      for (int i = 0; i < 16; i += 2) {  // 32-bit interleave of row pairs
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {  // 64-bit interleave of pair pairs
        const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
        const __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
      }
      for (int h = 0; h < 16; h += 8)  // 128-bit lanes, then 256-bit halves
        for (int i = 0; i < 4; ++i) {
          t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
          t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
      for (int i = 0; i < 8; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
      }
      for (int j = 0; j < 16; ++j) _mm512_mask_storeu_ps(dst + (k0 + j) * kMR, lanes, r[j]);
    }
  }
#endif
  for (int i = 0; i < kMR; ++i) {
    float* d = dst + i;
    if (i >= rows) {
      for (int kk = k0; kk < kc; ++kk) d[kk * kMR] = 0.0f;
    } else if (cs == 1) {
      for (int kk = k0; kk < kc; ++kk) d[kk * kMR] = a[i * rs + kk];
    } else {
      for (int kk = k0; kk < kc; ++kk) d[kk * kMR] = a[i * rs + kk * cs];
    }
  }
}

struct GemmArgs {
  const float *a, *b, *bias, *res;  // a: element (m, k) at a[m * rs + k * cs]; b packed; res [M, N] rows
  float* out;                       // [M, N] rows
  int64_t rs, cs;
  int m, n, k, panels;
  Act act;
};

// Rows [m0, m1) x packed panels [p0, p1).
inline void gemm_item(const GemmArgs& g, int m0, int m1, int p0, int p1) {
  thread_local std::vector<float> apack;
  const int rows = m1 - m0, groups = (rows + kMR - 1) / kMR;
  const int kcb = kc_block(), kblocks = (g.k + kcb - 1) / kcb, kc_max = (g.k + kblocks - 1) / kblocks;
  apack.resize(static_cast<size_t>(groups) * kMR * kc_max);
  float tile[kMR * kNR];
  for (int kb = 0; kb < kblocks; ++kb) {
    const int k0 = static_cast<int>(static_cast<int64_t>(g.k) * kb / kblocks);
    const int kc = static_cast<int>(static_cast<int64_t>(g.k) * (kb + 1) / kblocks) - k0;
    const bool first = kb == 0, last = kb == kblocks - 1;
    for (int gi = 0; gi < groups; ++gi) {  // pack A[m0 + gi*kMR .., k0 .. k0+kc), zero rows past m1
      const int r0 = m0 + gi * kMR;
      pack_a_group(g.a + r0 * g.rs + k0 * g.cs, g.rs, g.cs, std::min(kMR, m1 - r0), kc,
                   apack.data() + static_cast<size_t>(gi) * kMR * kc);
    }
    for (int p = p0; p < p1; ++p) {
      const float* bp = g.b + (static_cast<int64_t>(p) * g.k + k0) * kNR;
      const int j0 = p * kNR, nv = std::min(kNR, g.n - j0);
      // The first group's call prefetches the next panel's slice (the same rows of B), read by the next
      // iteration; the last panel's has no next within this k block.
      const float* next = p + 1 < p1 ? bp + static_cast<int64_t>(g.k) * kNR : nullptr;
      for (int gi = 0; gi < groups; ++gi) {
        const int r0 = m0 + gi * kMR, mv = std::min(kMR, m1 - r0);
        const float* ap = apack.data() + static_cast<size_t>(gi) * kMR * kc;
        float* c = g.out + static_cast<int64_t>(r0) * g.n + j0;
        const float* pf = gi == 0 ? next : nullptr;
        if (nv == kNR) {
          micro_kernel_rows(mv, ap, bp, kc, c, g.n, !first, pf);
        } else {  // an edge panel: through a full-size scratch tile, only the valid columns copied back
          if (!first)
            for (int i = 0; i < mv; ++i) std::memcpy(tile + i * kNR, c + static_cast<int64_t>(i) * g.n, nv * sizeof(float));
          micro_kernel_rows(mv, ap, bp, kc, tile, kNR, !first, pf);
          for (int i = 0; i < mv; ++i) std::memcpy(c + static_cast<int64_t>(i) * g.n, tile + i * kNR, nv * sizeof(float));
        }
        if (last && (g.bias || g.res || g.act != Act::none)) {
          for (int i = 0; i < mv; ++i) {
            const int64_t row = static_cast<int64_t>(r0 + i) * g.n;
            epilogue_row(g.act, g.out + row + j0, g.bias ? g.bias + j0 : nullptr, g.res ? g.res + row + j0 : nullptr,
                         nv);
          }
        }
      }
    }
  }
}

inline void run_gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // an empty sum: the epilogue on zeros
    std::fill(g.out, g.out + static_cast<int64_t>(g.m) * g.n, 0.0f);
    for (int i = 0; i < g.m; ++i) {
      const int64_t row = static_cast<int64_t>(i) * g.n;
      epilogue_row(g.act, g.out + row, g.bias, g.res ? g.res + row : nullptr, g.n);
    }
    return;
  }
  // Work items: row blocks (balanced, multiples of kMR, at most kMC, their count a multiple of the threads
  // where there are rows enough) x panel blocks (at most kPanels), and more panel blocks while there are
  // fewer than 2 items per thread.
  const int threads = Pool::get().threads(), groups = (g.m + kMR - 1) / kMR;
  int rblocks = (g.m + kMC - 1) / kMC;
  rblocks = std::min(groups, (rblocks + threads - 1) / threads * threads);
  const int mc = (groups + rblocks - 1) / rblocks * kMR;
  const int rb = (g.m + mc - 1) / mc;
  int pblocks = (g.panels + kPanels - 1) / kPanels;
  while (rb * pblocks < 2 * threads && pblocks < g.panels) ++pblocks;
  Pool::get().parallel_for(rb * pblocks, [&](int it) {
    const int r = it / pblocks, p = it % pblocks;
    gemm_item(g, r * mc, std::min(g.m, (r + 1) * mc), g.panels * p / pblocks, g.panels * (p + 1) / pblocks);
  });
}

}  // namespace gemm_core

}  // namespace rlxviz
