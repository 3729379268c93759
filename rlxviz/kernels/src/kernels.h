// rlxviz's CPU kernels as MLX primitives: fused attention, bias + activation, softmax (float32).
//
// Each op builds an array whose primitive evaluates on the CPU stream only (eval_gpu throws): the
// Python side (rlxviz/kernels) uses them for fused ops lowered on the CPU and keeps MLX's own
// kernels everywhere else. The math each kernel computes is the fused op's decomposition in
// rlxviz/ir/fused.py; the transcendental formulas are those of rlxviz/runtime/fast.py.
#pragma once

#include <optional>
#include <string>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "act.h"

namespace rlxviz {

namespace mx = mlx::core;


// Attention on packed heads: q [B, Sq, heads*head_dim], k/v [B, Sk, kv_heads*head_dim], bias broadcast
// to [B, heads, Sq, Sk] (additive, any strides) or none -> [B, Sq, heads*head_dim]. Query head h reads
// kv head h / (heads / kv_heads). Per (batch, head, query block) one pass over K/V tiles (online softmax).
mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v,
                    const std::optional<mx::array>& bias, int heads, int kv_heads, int head_dim, float scale);

// act(x + bias) over the last axis of x (bias [N] or none) -> x's shape.
mx::array bias_act(const mx::array& x, const std::optional<mx::array>& bias, const std::string& act);

// Softmax over the last axis.
mx::array softmax(const mx::array& x);

// norm(x + residual [+ bias]) * gamma [+ beta] over the last axis: LayerNorm (rms=false) or RMSNorm (rms=true).
// x and residual [..., N] of one shape; bias, gamma, beta [N].
mx::array residual_norm(const mx::array& x, const mx::array& residual, const std::optional<mx::array>& bias,
                        const mx::array& gamma, const std::optional<mx::array>& beta, float eps, bool rms);

// Worker threads the kernels use (the calling thread included); n < 1 means the CPUs this process may use.
void set_threads(int n);
int threads();

// A primitive with a CPU kernel only: each subclass defines eval_cpu; eval_gpu throws
// "[rlxviz.<op>] has no GPU kernel" followed by `gpu_note` (where rlxviz lowers the op on the GPU instead, or "").
class CpuPrimitive : public mx::Primitive {
 public:
  CpuPrimitive(mx::Stream s, const char* op, const char* gpu_note = "")
      : mx::Primitive(s), op_(op), gpu_note_(gpu_note) {}
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) final;

 private:
  const char* op_;
  const char* gpu_note_;
};

class Attention : public CpuPrimitive {
 public:
  Attention(mx::Stream s, int heads, int kv_heads, int head_dim, float scale, bool has_bias)
      : CpuPrimitive(s, "attention", " (rlxviz lowers attention with MLX's there)"),
        heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), scale_(scale), has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "RlxvizAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int heads_, kv_heads_, head_dim_;
  float scale_;
  bool has_bias_;
};

class BiasAct : public CpuPrimitive {
 public:
  BiasAct(mx::Stream s, Act act, bool has_bias) : CpuPrimitive(s, "bias_act"), act_(act), has_bias_(has_bias) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "RlxvizBiasAct"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  Act act_;
  bool has_bias_;
};

class ResidualNorm : public CpuPrimitive {
 public:
  ResidualNorm(mx::Stream s, float eps, bool rms, bool has_bias, bool has_beta)
      : CpuPrimitive(s, "residual_norm"), eps_(eps), rms_(rms), has_bias_(has_bias), has_beta_(has_beta) {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return rms_ ? "RlxvizResidualRmsNorm" : "RlxvizResidualLayerNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  float eps_;
  bool rms_, has_bias_, has_beta_;
};

class Softmax : public CpuPrimitive {
 public:
  explicit Softmax(mx::Stream s) : CpuPrimitive(s, "softmax") {}
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "RlxvizSoftmax"; }
  bool is_equivalent(const mx::Primitive& other) const override { return true; }
};

}  // namespace rlxviz
