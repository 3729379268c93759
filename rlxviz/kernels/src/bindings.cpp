// Python bindings of rlxviz's CPU kernels (module _rlxviz_kernels), in nanobind's "mlx" domain so that
// mlx.core's array type is shared with this module.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "gemm.h"
#include "kernels.h"
#include "tape.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// The vector ISA this build was compiled for (what -march=native enabled), for the timing header.
const char* isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__)
  return "avx2";
#elif defined(__ARM_NEON)
  return "neon";
#else
  return "baseline";
#endif
}

}  // namespace

NB_MODULE(_rlxviz_kernels, m) {
  m.doc() = "rlxviz's float32 CPU kernels as MLX primitives (rlxviz/kernels/src).";
  m.def("attention", &rlxviz::attention, "q"_a, "k"_a, "v"_a, "bias"_a.none(), "heads"_a, "kv_heads"_a,
        "head_dim"_a, "scale"_a,
        "Fused attention: q [B, Sq, heads*head_dim], k/v [B, Sk, kv_heads*head_dim], additive bias "
        "broadcastable to [B, heads, Sq, Sk] or None -> [B, Sq, heads*head_dim] (float32, CPU stream).");
  m.def("bias_act", &rlxviz::bias_act, "x"_a, "bias"_a.none(), "act"_a,
        "act(x + bias) over the last axis: bias [N] or None; act one of none, gelu, gelu_tanh, silu, relu, relu2.");
  m.def("residual_norm", &rlxviz::residual_norm, "x"_a, "residual"_a, "bias"_a.none(), "gamma"_a, "beta"_a.none(),
        "eps"_a, "rms"_a,
        "norm(x + residual [+ bias]) * gamma [+ beta] over the last axis: LayerNorm, or RMSNorm when rms.");
  m.def("pack_weights", &rlxviz::pack_weights, "w"_a,
        "w [K, N] float32 -> packed column panels [ceil(N / nr), K, nr] for gemm (pack a constant once).");
  m.def("gemm", &rlxviz::gemm, "x"_a, "packed"_a, "n"_a, "bias"_a.none(), "residual"_a.none(), "act"_a,
        "act(x @ w + bias) + residual, w given as pack_weights(w) with n columns: x [..., K], bias [n] or None, "
        "residual x.shape[:-1] + [n] or None; act one of none, gelu, gelu_tanh, silu, relu, relu2.");
  m.def("gemm_tile", &rlxviz::gemm_tile, "The micro-kernel's tile (rows, columns) in this build.");
  m.def("softmax", &rlxviz::softmax, "x"_a, "Softmax over the last axis (float32, CPU stream).");
  m.def("set_threads", &rlxviz::set_threads, "n"_a, "Threads the kernels use; n < 1: the CPUs this process may use.");
  m.def("threads", &rlxviz::threads, "Threads the kernels use.");
  m.def("program_tape", &rlxviz::program_tape, "outputs"_a,
        "MLX's unevaluated graph of `outputs`: [(primitive, [(id, shape, dtype, nbytes) per input], [... per "
        "output])], inputs before readers; arrays without a primitive are leaves (not listed).");
  m.def("isa", &isa, "The vector instruction set this build was compiled for.");
}
