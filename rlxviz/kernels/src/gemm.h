// rlxviz's float32 GEMM with a fused epilogue, for the dense layers of fused ops on the CPU:
//   out[m, n] = act(sum_k a[m, k] * b[k, n] + bias[n]) + residual[m, n]
// (bias and residual optional). B is a constant (a weight): `pack_weights` lays it out once in column
// panels of kNR (zero-padded); `gemm` reads the packed panels. A register-blocked kMR x kNR micro-kernel
// (chosen at build time from the ISA -march=native enables) accumulates in registers over blocks of kc_block() of
// the reduction axis; the epilogue runs on each tile while it is in L1, right after its last block.
#pragma once

#include <optional>
#include <string>

#include "gemm_core.h"
#include "kernels.h"

namespace rlxviz {


// w [K, N] (any strides) -> packed [ceil(N / kNR), K, kNR] float32, columns past N zero.
mx::array pack_weights(const mx::array& w);

// act(x @ w + bias) + residual with w given packed (`pack_weights`) and its column count n:
// x [..., K] (any strides), bias [n] or none, residual x.shape[:-1] + [n] or none -> x.shape[:-1] + [n].
mx::array gemm(const mx::array& x, const mx::array& packed, int n, const std::optional<mx::array>& bias,
               const std::optional<mx::array>& residual, const std::string& act);

// The tile the micro-kernel computes: (rows, columns).
inline std::pair<int, int> gemm_tile() { return {gemm_core::kGemmMR, gemm_core::kGemmNR}; }

class PackWeights : public CpuPrimitive {
 public:
  explicit PackWeights(mx::Stream s) : CpuPrimitive(s, "pack_weights") {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "RlxvizPackWeights"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

class Gemm : public CpuPrimitive {
 public:
  Gemm(mx::Stream s, int n, Act act, bool has_bias, bool has_residual)
      : CpuPrimitive(s, "gemm", " (rlxviz lowers dense layers with MLX's there)"),
        n_(n), act_(act), has_bias_(has_bias), has_residual_(has_residual) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "RlxvizGemm"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int n_;
  Act act_;
  bool has_bias_, has_residual_;
};

}  // namespace rlxviz
