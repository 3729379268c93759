// rlxviz's float32 GEMM with a fused bias + activation + residual epilogue: see gemm.h.
//
// Blocking (BLIS's loop order, without the outer N loop since B is packed whole once; gemm_core.h): a work
// item is a block of rows (a multiple of kMR) times a block of packed panels (all of them unless threads need
// more items); per item, for each block of the reduction axis (at most kc_block(): 256, or 384 with AVX-512
// and a 48 KB L1d), the item's rows of A are packed kMR-interleaved (so each step of the micro-kernel reads
// kMR consecutive floats), then every panel of the block runs the micro-kernel over every row group, with the
// panel's kc x kNR slice of B (16 KB with AVX2, 32 or 48 KB with AVX-512) staying in L1 or streaming from L2.
// The items go to the pool (rlxviz/kernels/src/pool.h).
//
// Numerics: each output is a float32 sum of K products in the order k = 0, 1, ..., K-1, fused multiply-adds
// (-ffp-contract=fast), so it differs from BLAS's order; both are within K * eps * sum_k |a[m,k] b[k,n]| of
// the exact product. The epilogue's transcendentals are vmath.h's (the bias_act kernel's).
#include "gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common.h"
#include "gemm_core.h"
#include "mlx/backend/cpu/encoder.h"

namespace rlxviz {

using namespace gemm_core;

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
                dst = out.data<float>(), keep = inputs]() { pack_panels(wp, s0, s1, k, n, dst); });
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
  auto& enc = encode_all(stream(), inputs, out);
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

bool Gemm::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Gemm&>(other);
  return n_ == o.n_ && act_ == o.act_ && has_bias_ == o.has_bias_ && has_residual_ == o.has_residual_;
}

}  // namespace rlxviz
