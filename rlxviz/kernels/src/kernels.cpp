// rlxviz's CPU kernels: see kernels.h. Float32 only (the Python side routes other dtypes to MLX).
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/utils.h"
#include "common.h"
#include "gemm_core.h"
#include "pool.h"
#include "vmath.h"

namespace rlxviz {

namespace {

// Query rows per micro-kernel. With AVX-512 8 (8 x 1 zmm accumulators, 8 independent FMA chains): a MiniLM
// attention [1, 128, 12 x 32] 0.28-0.38 vs 0.37-0.44 ms on one Zen 5 core with 4 (3 alternated runs, 2026-12-03).
#if defined(__AVX512F__)
constexpr int kRows = 8;
#else
constexpr int kRows = 4;  // 4 x 2 ymm accumulators (16 registers)
#endif
constexpr int kCols = 16;     // columns per micro-kernel chunk (one AVX-512 / two AVX2 / four SSE registers)
constexpr int kKeyTile = 128;  // keys per score tile (online softmax across tiles)
constexpr int kQueryBlock = 32;  // queries per work item

int round_up(int n, int m) { return (n + m - 1) / m * m; }

// GCC/Clang vector extension at the width of the registers -march allows (kVec floats: one zmm, one ymm, one
// xmm); a chunk of kCols columns is kParts of them. (A kCols-wide vector type is not lowered to registers
// where it is wider than the ISA's: on AVX2 GCC 12 spilled every accumulator to the stack.)
constexpr int kVec = gemm_core::kGemmVec;
constexpr int kParts = kCols / kVec;
static_assert(kCols % kVec == 0, "a chunk is whole registers");
typedef float vf __attribute__((vector_size(kVec * sizeof(float))));
typedef float vfu __attribute__((vector_size(kVec * sizeof(float)), aligned(sizeof(float))));
inline vf load(const float* p) { return *reinterpret_cast<const vfu*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vfu*>(p) = v; }

// c[r][j0:j0+kCols] = init + sum_i a[r][i] * b[i][j0:j0+kCols] for r < kRows and every chunk j0 < ncols (a multiple
// of kCols), the sum in order of i; init is 0, or c's own values with kAccumulate. One register-blocked micro-kernel
// for both products of attention: the scores (Q K^T) and the weighted values (P V).
template <bool kAccumulate>
inline void rows_times_panel(const float* __restrict a, int lda, int inner, const float* __restrict b, int ldb,
                             float* __restrict c, int ldc, int ncols) {
  for (int j0 = 0; j0 < ncols; j0 += kCols) {
    vf acc[kRows][kParts];
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 16
      for (int h = 0; h < kParts; ++h) {
        if constexpr (kAccumulate)
          acc[r][h] = load(c + r * ldc + j0 + h * kVec);
        else
          acc[r][h] = vf{};
      }
    for (int i = 0; i < inner; ++i) {
#pragma GCC unroll 16
      for (int h = 0; h < kParts; ++h) {
        const vf bv = load(b + static_cast<size_t>(i) * ldb + j0 + h * kVec);
#pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) acc[r][h] += a[r * lda + i] * bv;
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 16
      for (int h = 0; h < kParts; ++h) store(c + r * ldc + j0 + h * kVec, acc[r][h]);
  }
}

// s[r][j0:j0+ncols] = sum_c q[r][c] * kt[c][j0 + j], r < kRows; ncols a multiple of kCols.
inline void scores_block(const float* __restrict q, int d, const float* __restrict kt, int ldk,
                         float* __restrict s, int lds, int ncols) {
  rows_times_panel<false>(q, d, d, kt, ldk, s, lds, ncols);
}

// o[r][:dp] += sum_j p[r][j] * v[j][:dp], j < n; dp a multiple of kCols.
inline void pv_block(const float* __restrict p, int ldp, int n, const float* __restrict v, int dp,
                     float* __restrict o) {
  rows_times_panel<true>(p, ldp, n, v, dp, o, dp, dp);
}

struct AttentionArgs {
  const float *q, *k, *v, *bias;
  float* out;
  int64_t qs[3], ks[3], vs[3], bs[4];
  int batch, sq, sk, heads, kv_heads, d;
  float scale;
};

// One work item: batch b, query head h, queries [i0, i1). K^T and V of the head are copied into
// zero-padded buffers; queries go in groups of kRows through every key tile with an online softmax
// (running max m, running sum l, output o rescaled by e^(m_old - m_new)).
void attention_item(const AttentionArgs& a, int b, int h, int i0, int i1) {
  const int d = a.d, dp = round_up(d, kCols), skp = round_up(a.sk, kCols);
  const int hk = h / (a.heads / a.kv_heads);
  thread_local std::vector<float> kt, vb, qb, s, o;
  kt.assign(static_cast<size_t>(d) * skp, 0.0f);
  vb.assign(static_cast<size_t>(skp) * dp, 0.0f);
  const float* kbase = a.k + b * a.ks[0] + static_cast<int64_t>(hk) * d * a.ks[2];
  const float* vbase = a.v + b * a.vs[0] + static_cast<int64_t>(hk) * d * a.vs[2];
  for (int j = 0; j < a.sk; ++j) {
    const float* kr = kbase + j * a.ks[1];
    const float* vr = vbase + j * a.vs[1];
    for (int c = 0; c < d; ++c) {
      kt[static_cast<size_t>(c) * skp + j] = kr[c * a.ks[2]];
      vb[static_cast<size_t>(j) * dp + c] = vr[c * a.vs[2]];
    }
  }
  const int tile = std::min(kKeyTile, skp);
  qb.assign(static_cast<size_t>(kRows) * d, 0.0f);
  s.assign(static_cast<size_t>(kRows) * tile, 0.0f);
  o.assign(static_cast<size_t>(kRows) * dp, 0.0f);
  const float* qbase = a.q + b * a.qs[0] + static_cast<int64_t>(h) * d * a.qs[2];
  const float* bbase = a.bias ? a.bias + b * a.bs[0] + h * a.bs[1] : nullptr;
  const int64_t width = static_cast<int64_t>(a.heads) * d;
  for (int g = i0; g < i1; g += kRows) {
    const int rows = std::min(kRows, i1 - g);
    std::fill(qb.begin(), qb.end(), 0.0f);
    std::fill(o.begin(), o.end(), 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* qr = qbase + (g + r) * a.qs[1];
      for (int c = 0; c < d; ++c) qb[r * d + c] = qr[c * a.qs[2]] * a.scale;
    }
    float m[kRows], l[kRows];
    std::fill(m, m + kRows, -std::numeric_limits<float>::infinity());
    std::fill(l, l + kRows, 0.0f);
    for (int t0 = 0; t0 < a.sk; t0 += tile) {
      const int n = std::min(tile, a.sk - t0), np = round_up(n, kCols);
      scores_block(qb.data(), d, kt.data() + t0, skp, s.data(), tile, np);
      for (int r = 0; r < rows; ++r) {
        float* sr = s.data() + r * tile;
        if (bbase) {
          const float* br = bbase + (g + r) * a.bs[2] + t0 * a.bs[3];
          if (a.bs[3] == 1) {
            for (int j = 0; j < n; ++j) sr[j] += br[j];
          } else {
            for (int j = 0; j < n; ++j) sr[j] += br[j * a.bs[3]];
          }
        }
        float mt = m[r];
        int nan = 0;
#pragma omp simd reduction(max : mt) reduction(| : nan)
        for (int j = 0; j < n; ++j) {
          mt = sr[j] > mt ? sr[j] : mt;
          nan |= sr[j] != sr[j];
        }
        if (nan) mt = std::numeric_limits<float>::quiet_NaN();  // a NaN score makes the row NaN
        const float corr = std::exp(m[r] - mt);  // 0 on the first tile; NaN for a row of -inf (as the reference)
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n; ++j) {
          sr[j] = vm::exp(sr[j] - mt);
          sum += sr[j];
        }
        for (int j = n; j < np; ++j) sr[j] = 0.0f;
        l[r] = l[r] * corr + sum;
        m[r] = mt;
        float* orow = o.data() + r * dp;
        for (int c = 0; c < dp; ++c) orow[c] *= corr;
      }
      pv_block(s.data(), tile, np, vb.data() + static_cast<size_t>(t0) * dp, dp, o.data());
    }
    for (int r = 0; r < rows; ++r) {
      float* dst = a.out + (static_cast<int64_t>(b) * a.sq + g + r) * width + static_cast<int64_t>(h) * d;
      const float inv = 1.0f / l[r];
      for (int c = 0; c < d; ++c) dst[c] = o[r * dp + c] * inv;
    }
  }
}

template <Act A>
void bias_act_rows(const float* __restrict x, const float* __restrict bias, float* __restrict y, int64_t r0,
                   int64_t r1, int64_t n) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    if (bias) {
      for (int64_t j = 0; j < n; ++j) yr[j] = act<A>(xr[j] + bias[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) yr[j] = act<A>(xr[j]);
    }
  }
}

void softmax_rows(const float* __restrict x, float* __restrict y, int64_t r0, int64_t r1, int64_t n) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float m = -std::numeric_limits<float>::infinity();
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t j = 0; j < n; ++j) {
      m = xr[j] > m ? xr[j] : m;
      nan |= xr[j] != xr[j];
    }
    if (nan) m = std::numeric_limits<float>::quiet_NaN();
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      yr[j] = vm::exp(xr[j] - m);
      sum += yr[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) yr[j] *= inv;
  }
}

// One row of norm(x + r [+ b]) * g [+ beta]: the sum is written to y first, its statistics read from there.
void residual_norm_row(const float* __restrict x, const float* __restrict r, const float* __restrict b,
                       const float* __restrict g, const float* __restrict beta, float* __restrict y, int64_t n,
                       float eps, bool rms) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    float v = x[j] + r[j];
    if (b) v += b[j];
    y[j] = v;
    sum += v;
  }
  const float mu = rms ? 0.0f : sum / static_cast<float>(n);
  float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
  for (int64_t j = 0; j < n; ++j) sq += (y[j] - mu) * (y[j] - mu);
  const float inv = 1.0f / std::sqrt(sq / static_cast<float>(n) + eps);
  if (beta) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j] = (y[j] - mu) * inv * g[j] + beta[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j] = (y[j] - mu) * inv * g[j];
  }
}

// Row chunks of a [rows, n] array for the pool: about 4 per thread, at least 16K elements each.
void for_row_chunks(int64_t rows, int64_t n, const std::function<void(int64_t, int64_t)>& f) {
  const int64_t min_rows = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(n, 1));
  const int64_t chunks = std::clamp<int64_t>(rows / min_rows, 1, 4 * Pool::get().threads());
  Pool::get().parallel_for(static_cast<int>(chunks), [&](int c) {
    f(rows * c / chunks, rows * (c + 1) / chunks);
  });
}

// `out` backed by `in`'s buffer when MLX allows (donation: no new allocation), else a new buffer.
void alloc_like(const mx::array& in, mx::array& out) {
  if (in.is_donatable() && in.flags().row_contiguous && in.itemsize() == out.itemsize()) {
    out.copy_shared_buffer(in);
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
}

}  // namespace

void set_threads(int n) { Pool::get().set_threads(n); }
int threads() { return Pool::get().threads(); }

void CpuPrimitive::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error(std::string("[rlxviz.") + op_ + "] has no GPU kernel" + gpu_note_);
}

// ---- attention -----------------------------------------------------------------------------------------
mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v,
                    const std::optional<mx::array>& bias, int heads, int kv_heads, int head_dim, float scale) {
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3)
    throw std::invalid_argument("[rlxviz.attention] q, k, v must be [B, S, heads*head_dim]");
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || head_dim < 1)
    throw std::invalid_argument("[rlxviz.attention] heads must be a positive multiple of kv_heads");
  const int b = q.shape(0), sq = q.shape(1), sk = k.shape(1);
  if (q.shape(2) != heads * head_dim || k.shape(2) != kv_heads * head_dim || v.shape() != k.shape() ||
      k.shape(0) != b)
    throw std::invalid_argument("[rlxviz.attention] q/k/v widths do not match heads * head_dim");
  for (const auto* a : {&q, &k, &v}) check_f32(*a, "attention");
  std::vector<mx::array> inputs = {q, k, v};
  auto s = mx::to_stream({});
  check_cpu(s, "attention");
  if (bias) {
    check_f32(*bias, "attention");
    inputs.push_back(mx::broadcast_to(*bias, {b, heads, sq, sk}, s));
  }
  return mx::array({b, sq, heads * head_dim}, mx::float32,
                   std::make_shared<Attention>(s, heads, kv_heads, head_dim, scale, bias.has_value()), inputs);
}

void Attention::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  auto& enc = encode_all(stream(), inputs, out);
  AttentionArgs a{};
  a.q = inputs[0].data<float>();
  a.k = inputs[1].data<float>();
  a.v = inputs[2].data<float>();
  a.bias = has_bias_ ? inputs[3].data<float>() : nullptr;
  a.out = out.data<float>();
  for (int i = 0; i < 3; ++i) {
    a.qs[i] = inputs[0].strides(i);
    a.ks[i] = inputs[1].strides(i);
    a.vs[i] = inputs[2].strides(i);
  }
  if (has_bias_)
    for (int i = 0; i < 4; ++i) a.bs[i] = inputs[3].strides(i);
  a.batch = inputs[0].shape(0);
  a.sq = inputs[0].shape(1);
  a.sk = inputs[1].shape(1);
  a.heads = heads_;
  a.kv_heads = kv_heads_;
  a.d = head_dim_;
  a.scale = scale_;
  enc.dispatch([a, keep = inputs]() {
    if (a.sk == 0 || a.sq == 0 || a.batch == 0) return;
    // Work items: (batch, head, query block). Whole heads when there are 4+ per thread (K/V of a head are
    // then copied once); else blocks of kQueryBlock queries, so a batch of 1 still fills every thread.
    const int heads = a.batch * a.heads;
    const int block = heads >= 4 * Pool::get().threads() ? a.sq : std::min(a.sq, kQueryBlock);
    const int blocks = (a.sq + block - 1) / block;
    Pool::get().parallel_for(heads * blocks, [&](int it) {
      const int blk = it % blocks, bh = it / blocks;
      const int i0 = blk * block;
      attention_item(a, bh / a.heads, bh % a.heads, i0, std::min(a.sq, i0 + block));
    });
  });
}

bool Attention::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Attention&>(other);
  return heads_ == o.heads_ && kv_heads_ == o.kv_heads_ && head_dim_ == o.head_dim_ && scale_ == o.scale_ &&
         has_bias_ == o.has_bias_;
}

// ---- bias + activation ------------------------------------------------------------------------------------
mx::array bias_act(const mx::array& x, const std::optional<mx::array>& bias, const std::string& act) {
  const Act a = parse_act(act, "bias_act");
  check_f32(x, "bias_act");
  if (x.ndim() < 1) throw std::invalid_argument("[rlxviz.bias_act] x must have at least one axis");
  auto s = mx::to_stream({});
  check_cpu(s, "bias_act");
  std::vector<mx::array> inputs = {x};
  if (bias) {
    check_f32(*bias, "bias_act");
    if (bias->ndim() > 1 || (bias->ndim() == 1 && bias->shape(0) != x.shape(-1) && bias->shape(0) != 1))
      throw std::invalid_argument("[rlxviz.bias_act] bias must be [N] for x [..., N]");
    inputs.push_back(mx::broadcast_to(*bias, {x.shape(-1)}, s));
  }
  return mx::array(x.shape(), mx::float32, std::make_shared<BiasAct>(s, a, bias.has_value()), inputs);
}

void BiasAct::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  Rows x = contiguous_rows(inputs[0]);
  Rows bias = has_bias_ ? contiguous_rows(inputs[1]) : x;
  alloc_like(x.arr, out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  const int64_t n = x.arr.shape(-1), rows = n ? static_cast<int64_t>(x.arr.size()) / n : 0;
  enc.dispatch([x, bias, xp = x.data(), bp = has_bias_ ? bias.data() : nullptr, yp = out.data<float>(), rows, n,
                act = act_, has_bias = has_bias_, inputs]() {
    fill(inputs[0], x);
    if (has_bias) fill(inputs[1], bias);
    for_row_chunks(rows, n, [&](int64_t r0, int64_t r1) {
      switch (act) {
        case Act::gelu: return bias_act_rows<Act::gelu>(xp, bp, yp, r0, r1, n);
        case Act::gelu_tanh: return bias_act_rows<Act::gelu_tanh>(xp, bp, yp, r0, r1, n);
        case Act::silu: return bias_act_rows<Act::silu>(xp, bp, yp, r0, r1, n);
        case Act::relu: return bias_act_rows<Act::relu>(xp, bp, yp, r0, r1, n);
        case Act::relu2: return bias_act_rows<Act::relu2>(xp, bp, yp, r0, r1, n);
        case Act::none: return bias_act_rows<Act::none>(xp, bp, yp, r0, r1, n);
      }
    });
  });
}

bool BiasAct::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const BiasAct&>(other);
  return act_ == o.act_ && has_bias_ == o.has_bias_;
}

// ---- residual + LayerNorm / RMSNorm ---------------------------------------------------------------------------
mx::array residual_norm(const mx::array& x, const mx::array& residual, const std::optional<mx::array>& bias,
                        const mx::array& gamma, const std::optional<mx::array>& beta, float eps, bool rms) {
  if (x.ndim() < 1 || residual.shape() != x.shape())
    throw std::invalid_argument("[rlxviz.residual_norm] x and residual must have one shape [..., N]");
  const int n = x.shape(-1);
  std::vector<mx::array> inputs = {x, residual};
  auto s = mx::to_stream({});
  check_cpu(s, "residual_norm");
  auto vec = [&](const mx::array& a, const char* what) {
    check_f32(a, "residual_norm");
    if (a.ndim() > 1 || (a.ndim() == 1 && a.shape(0) != n && a.shape(0) != 1))
      throw std::invalid_argument(std::string("[rlxviz.residual_norm] ") + what + " must be [N]");
    inputs.push_back(mx::broadcast_to(a, {n}, s));
  };
  check_f32(x, "residual_norm");
  check_f32(residual, "residual_norm");
  if (bias) vec(*bias, "bias");
  vec(gamma, "gamma");
  if (beta) vec(*beta, "beta");
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<ResidualNorm>(s, eps, rms, bias.has_value(), beta.has_value()), inputs);
}

void ResidualNorm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  std::vector<Rows> rows;
  for (const auto& in : inputs) rows.push_back(contiguous_rows(in));
  auto& enc = encode_all(stream(), inputs, out);
  const int64_t n = out.shape(-1), count = n ? static_cast<int64_t>(out.size()) / n : 0;
  enc.dispatch([rows, inputs, yp = out.data<float>(), n, count, eps = eps_, rms = rms_, has_bias = has_bias_,
                has_beta = has_beta_]() {
    for (size_t i = 0; i < inputs.size(); ++i) fill(inputs[i], rows[i]);
    const float* x = rows[0].data();
    const float* r = rows[1].data();
    size_t k = 2;
    const float* b = has_bias ? rows[k++].data() : nullptr;
    const float* g = rows[k++].data();
    const float* beta = has_beta ? rows[k].data() : nullptr;
    for_row_chunks(count, n, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) residual_norm_row(x + i * n, r + i * n, b, g, beta, yp + i * n, n, eps, rms);
    });
  });
}

bool ResidualNorm::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const ResidualNorm&>(other);
  return eps_ == o.eps_ && rms_ == o.rms_ && has_bias_ == o.has_bias_ && has_beta_ == o.has_beta_;
}

// ---- softmax ----------------------------------------------------------------------------------------------
mx::array softmax(const mx::array& x) {
  check_f32(x, "softmax");
  if (x.ndim() < 1) throw std::invalid_argument("[rlxviz.softmax] x must have at least one axis");
  auto s = mx::to_stream({});
  check_cpu(s, "softmax");
  return mx::array(x.shape(), mx::float32, std::make_shared<Softmax>(s), {x});
}

void Softmax::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  Rows x = contiguous_rows(inputs[0]);
  alloc_like(x.arr, out);
  auto& enc = mx::cpu::get_command_encoder(stream());
  enc.set_input_array(inputs[0]);
  enc.set_output_array(out);
  const int64_t n = x.arr.shape(-1), rows = n ? static_cast<int64_t>(x.arr.size()) / n : 0;
  enc.dispatch([x, xp = x.data(), yp = out.data<float>(), rows, n, inputs]() {
    fill(inputs[0], x);
    for_row_chunks(rows, n, [&](int64_t r0, int64_t r1) { softmax_rows(xp, yp, r0, r1, n); });
  });
}

}  // namespace rlxviz
