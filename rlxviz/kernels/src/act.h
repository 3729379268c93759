// The activations rlxviz's kernels apply in their epilogues, in vmath.h's formulas.
#pragma once

#include "vmath.h"

namespace rlxviz {

// Activation applied by bias_act / gemm, by name in Python ("none", "gelu", "gelu_tanh", "silu", "relu", "relu2");
// the names are `rlxviz.runtime.lowering.KERNEL_ACTS` plus none (tests/test_epilogue_forms.py checks both lists).
enum class Act { none, gelu, gelu_tanh, silu, relu, relu2 };

template <Act A>
inline float act(float x) {
  if constexpr (A == Act::gelu) return vm::gelu(x);
  else if constexpr (A == Act::gelu_tanh) return vm::gelu_tanh(x);
  else if constexpr (A == Act::silu) return vm::silu(x);
  else if constexpr (A == Act::relu) return vm::relu(x);
  else if constexpr (A == Act::relu2) return vm::relu2(x);
  else return x;
}

}  // namespace rlxviz
