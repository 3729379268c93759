// rlxviz's float32 GEMM with a fused bias + activation + residual epilogue: see gemm.h.
//
// Blocking (BLIS's loop order, without the outer N loop since B is packed whole once): a work item is a
// block of rows (a multiple of kMR) times a block of packed panels; per item, for each block of the reduction
// axis (at most kKC), the item's rows of A are packed kMR-interleaved (so each step of the micro-kernel reads
// kMR consecutive floats), then every panel of the block runs the micro-kernel over every row group, with the
// panel's kKC x kNR slice of B (16-32 KB) staying in L1. The items go to the pool (rlxviz/kernels/src/pool.h).
//
// Numerics: each output is a float32 sum of K products in the order k = 0, 1, ..., K-1, fused multiply-adds
// (-ffp-contract=fast), so it differs from BLAS's order; both are within K * eps * sum_k |a[m,k] b[k,n]| of
// the exact product. The epilogue's transcendentals are vmath.h's (the bias_act kernel's).
#include "gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common.h"
#include "mlx/backend/cpu/encoder.h"
#include "pool.h"

namespace rlxviz {

namespace {

constexpr int kMR = kGemmMR, kNR = kGemmNR, kVec = kGemmVec;
constexpr int kKC = 256;        // reduction block: kKC * kNR * 4 bytes of B per panel slice
constexpr int kMC = 16 * kMR;   // rows per work item at most (A block kMC x kKC in L2)
constexpr int kPanels = 8;      // packed panels per work item at most

typedef float vec __attribute__((vector_size(kVec * sizeof(float))));
typedef float vecu __attribute__((vector_size(kVec * sizeof(float)), aligned(sizeof(float))));
inline vec vload(const float* p) { return *reinterpret_cast<const vecu*>(p); }
inline void vstore(float* p, vec v) { *reinterpret_cast<vecu*>(p) = v; }

// c[i][0:kNR] (+)= sum_k a[k][i] * b[k][0:kNR], i < kMR: a is kMR-interleaved [kc][kMR], b one panel slice
// [kc][kNR], c row stride ldc. The accumulators live in registers (the loops over i unroll fully).
inline void micro_kernel(const float* __restrict a, const float* __restrict b, int kc, float* __restrict c,
                         int64_t ldc, bool accumulate) {
  vec acc0[kMR], acc1[kMR];
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i) {
    acc0[i] = accumulate ? vload(c + i * ldc) : vec{};
    acc1[i] = accumulate ? vload(c + i * ldc + kVec) : vec{};
  }
  for (int k = 0; k < kc; ++k) {
    const vec b0 = vload(b + k * kNR), b1 = vload(b + k * kNR + kVec);
    const float* ak = a + k * kMR;
#pragma GCC unroll 16
    for (int i = 0; i < kMR; ++i) {
      acc0[i] += ak[i] * b0;
      acc1[i] += ak[i] * b1;
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i) {
    vstore(c + i * ldc, acc0[i]);
    vstore(c + i * ldc + kVec, acc1[i]);
  }
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
    case Act::none: return epilogue_row<Act::none>(y, bias, res, n);
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
void gemm_item(const GemmArgs& g, int m0, int m1, int p0, int p1) {
  thread_local std::vector<float> apack;
  const int rows = m1 - m0, groups = (rows + kMR - 1) / kMR;
  const int kblocks = (g.k + kKC - 1) / kKC, kc_max = (g.k + kblocks - 1) / kblocks;
  apack.resize(static_cast<size_t>(groups) * kMR * kc_max);
  float tile[kMR * kNR];
  for (int kb = 0; kb < kblocks; ++kb) {
    const int k0 = static_cast<int>(static_cast<int64_t>(g.k) * kb / kblocks);
    const int kc = static_cast<int>(static_cast<int64_t>(g.k) * (kb + 1) / kblocks) - k0;
    const bool first = kb == 0, last = kb == kblocks - 1;
    for (int gi = 0; gi < groups; ++gi) {  // pack A[m0 + gi*kMR .., k0 .. k0+kc) kMR-interleaved, zero rows past m1
      float* dst = apack.data() + static_cast<size_t>(gi) * kMR * kc;
      for (int i = 0; i < kMR; ++i) {
        const int r = m0 + gi * kMR + i;
        if (r < m1) {
          const float* src = g.a + r * g.rs + k0 * g.cs;
          if (g.cs == 1) {
            for (int kk = 0; kk < kc; ++kk) dst[kk * kMR + i] = src[kk];
          } else {
            for (int kk = 0; kk < kc; ++kk) dst[kk * kMR + i] = src[kk * g.cs];
          }
        } else {
          for (int kk = 0; kk < kc; ++kk) dst[kk * kMR + i] = 0.0f;
        }
      }
    }
    for (int p = p0; p < p1; ++p) {
      const float* bp = g.b + (static_cast<int64_t>(p) * g.k + k0) * kNR;
      const int j0 = p * kNR, nv = std::min(kNR, g.n - j0);
      for (int gi = 0; gi < groups; ++gi) {
        const int r0 = m0 + gi * kMR, mv = std::min(kMR, m1 - r0);
        const float* ap = apack.data() + static_cast<size_t>(gi) * kMR * kc;
        float* c = g.out + static_cast<int64_t>(r0) * g.n + j0;
        if (mv == kMR && nv == kNR) {
          micro_kernel(ap, bp, kc, c, g.n, !first);
        } else {  // an edge tile: through a full-size scratch tile, only the valid part copied back
          if (!first)
            for (int i = 0; i < mv; ++i) std::memcpy(tile + i * kNR, c + static_cast<int64_t>(i) * g.n, nv * sizeof(float));
          micro_kernel(ap, bp, kc, tile, kNR, !first);
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

void run_gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // an empty sum: the epilogue on zeros
    std::fill(g.out, g.out + static_cast<int64_t>(g.m) * g.n, 0.0f);
    for (int i = 0; i < g.m; ++i) {
      const int64_t row = static_cast<int64_t>(i) * g.n;
      epilogue_row(g.act, g.out + row, g.bias, g.res ? g.res + row : nullptr, g.n);
    }
    return;
  }
  // Work items: row blocks (balanced, multiples of kMR, at most kMC) x panel blocks (at most kPanels), and
  // more panel blocks while there are fewer than 2 items per thread.
  const int threads = Pool::get().threads();
  const int rblocks = (g.m + kMC - 1) / kMC;
  const int mc = (((g.m + rblocks - 1) / rblocks) + kMR - 1) / kMR * kMR;
  const int rb = (g.m + mc - 1) / mc;
  int pblocks = (g.panels + kPanels - 1) / kPanels;
  while (rb * pblocks < 2 * threads && pblocks < g.panels) ++pblocks;
  Pool::get().parallel_for(rb * pblocks, [&](int it) {
    const int r = it / pblocks, p = it % pblocks;
    gemm_item(g, r * mc, std::min(g.m, (r + 1) * mc), g.panels * p / pblocks, g.panels * (p + 1) / pblocks);
  });
}

}  // namespace

// ---- packing -------------------------------------------------------------------------------------------
mx::array pack_weights(const mx::array& w) {
  check_f32(w, "pack_weights");
  if (w.ndim() != 2) throw std::invalid_argument("[rlxviz.pack_weights] w must be [K, N]");
  auto s = mx::to_stream({});
  check_cpu(s, "pack_weights");
  const int panels = (w.shape(1) + kNR - 1) / kNR;
  return mx::array({panels, w.shape(0), kNR}, mx::float32, std::make_shared<PackWeights>(s), {w});
}

void PackWeights::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(inputs[0]);
  enc.set_output_array(out);
  const auto& w = inputs[0];
  enc.dispatch([wp = w.data<float>(), s0 = w.strides(0), s1 = w.strides(1), k = w.shape(0), n = w.shape(1),
                panels = out.shape(0), dst = out.data<float>(), keep = inputs]() {
    for (int p = 0; p < panels; ++p)
      for (int kk = 0; kk < k; ++kk) {
        float* row = dst + (static_cast<int64_t>(p) * k + kk) * kNR;
        for (int j = 0; j < kNR; ++j) {
          const int col = p * kNR + j;
          row[j] = col < n ? wp[kk * s0 + col * s1] : 0.0f;
        }
      }
  });
}

void PackWeights::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("[rlxviz.pack_weights] has no GPU kernel");
}

// ---- gemm ----------------------------------------------------------------------------------------------
mx::array gemm(const mx::array& x, const mx::array& packed, int n, const std::optional<mx::array>& bias,
               const std::optional<mx::array>& residual, const std::string& act) {
  const Act a = parse_act(act, "gemm");
  check_f32(x, "gemm");
  check_f32(packed, "gemm");
  if (x.ndim() < 1) throw std::invalid_argument("[rlxviz.gemm] x must be [..., K]");
  if (packed.ndim() != 3 || packed.shape(2) != kNR || packed.shape(1) != x.shape(-1) || n < 1 ||
      (n + kNR - 1) / kNR != packed.shape(0))
    throw std::invalid_argument("[rlxviz.gemm] packed must be pack_weights(w) of a w [K, n] with K = x.shape[-1]");
  auto s = mx::to_stream({});
  check_cpu(s, "gemm");
  mx::Shape shape = x.shape();
  shape.back() = n;
  std::vector<mx::array> inputs = {x, packed};
  if (bias) {
    check_f32(*bias, "gemm");
    if (bias->ndim() > 1 || (bias->ndim() == 1 && bias->shape(0) != n && bias->shape(0) != 1))
      throw std::invalid_argument("[rlxviz.gemm] bias must be [N]");
    inputs.push_back(mx::broadcast_to(*bias, {n}, s));
  }
  if (residual) {
    check_f32(*residual, "gemm");
    if (residual->shape() != shape) throw std::invalid_argument("[rlxviz.gemm] residual must have the output's shape");
    inputs.push_back(*residual);
  }
  return mx::array(shape, mx::float32, std::make_shared<Gemm>(s, n, a, bias.has_value(), residual.has_value()),
                   inputs);
}

// x as rows: (rs, cs) strides of element (m, k) when its leading axes collapse into one, else a row copy.
static Rows gemm_rows(const mx::array& x, int64_t& rs, int64_t& cs) {
  const int nd = x.ndim();
  cs = x.strides(nd - 1);
  rs = nd >= 2 ? x.strides(nd - 2) : 0;
  bool collapses = true;
  for (int i = 0; i + 2 < nd; ++i)
    if (x.shape(i) != 1 && x.strides(i) != x.strides(i + 1) * x.shape(i + 1)) collapses = false;
  for (int i = 0; i + 1 < nd; ++i)  // a broadcast (stride 0) row axis is not collapsible either
    if (x.shape(i) != 1 && x.strides(i) == 0) collapses = false;
  if (collapses) return {x, false};
  Rows r = contiguous_rows(x);
  rs = x.shape(nd - 1);
  cs = 1;
  return r;
}

void Gemm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  const auto& x = inputs[0];
  int64_t rs, cs;
  Rows xr = gemm_rows(x, rs, cs);
  size_t i = 2;
  Rows bias = has_bias_ ? contiguous_rows(inputs[i++]) : xr;
  Rows res = has_residual_ ? contiguous_rows(inputs[i]) : xr;
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  GemmArgs g{};
  g.b = inputs[1].data<float>();
  g.out = out.data<float>();
  g.rs = rs;
  g.cs = cs;
  g.k = x.shape(-1);
  g.n = n_;
  g.m = g.k ? static_cast<int>(x.size() / g.k) : static_cast<int>(out.size() / std::max(n_, 1));
  g.panels = inputs[1].shape(0);
  g.act = act_;
  enc.dispatch([g, xr, bias, res, inputs, has_bias = has_bias_, has_res = has_residual_]() mutable {
    fill(inputs[0], xr);
    if (has_bias) fill(inputs[2], bias);
    if (has_res) fill(inputs[has_bias ? 3 : 2], res);
    g.a = xr.data();
    g.bias = has_bias ? bias.data() : nullptr;
    g.res = has_res ? res.data() : nullptr;
    run_gemm(g);
  });
}

void Gemm::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("[rlxviz.gemm] has no GPU kernel (rlxviz lowers dense layers with MLX's there)");
}

bool Gemm::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Gemm&>(other);
  return n_ == o.n_ && act_ == o.act_ && has_bias_ == o.has_bias_ && has_residual_ == o.has_residual_;
}

}  // namespace rlxviz
