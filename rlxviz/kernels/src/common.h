// Helpers shared by rlxviz's kernels: argument checks, activations by name, row-contiguous views.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.h"
#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/utils.h"
#include "vmath.h"

namespace rlxviz {

inline void check_cpu(const mx::Stream& s, const char* what) {
  if (s.device != mx::Device::cpu) throw std::invalid_argument(std::string("[rlxviz.") + what + "] CPU only");
}

inline void check_f32(const mx::array& a, const char* what) {
  if (a.dtype() != mx::float32) throw std::invalid_argument(std::string("[rlxviz.") + what + "] float32 only");
}

// "none", "gelu", "gelu_tanh", "silu", "relu", "relu2" -> Act; anything else throws, naming `what`.
inline Act parse_act(const std::string& act, const char* what) {
  if (act == "none") return Act::none;
  if (act == "gelu") return Act::gelu;
  if (act == "gelu_tanh") return Act::gelu_tanh;
  if (act == "silu") return Act::silu;
  if (act == "relu") return Act::relu;
  if (act == "relu2") return Act::relu2;
  throw std::invalid_argument(std::string("[rlxviz.") + what + "] unknown activation " + act);
}

// A row-contiguous float32 view of `in`: `in` itself, or a buffer allocated here that `fill()` (run on
// the stream's thread, when the input is computed) fills from the strided view.
struct Rows {
  mx::array arr;
  bool copy = false;
  const float* data() const { return arr.data<float>(); }
};

inline Rows contiguous_rows(const mx::array& in) {
  if (in.flags().row_contiguous) return {in, false};
  mx::array c(in.shape(), in.dtype(), nullptr, {});
  c.set_data(mx::allocator::malloc(c.nbytes()));
  return {c, true};
}

// `out`'s buffer allocated, and every input and `out` registered with stream `s`'s CPU encoder, which is returned
// for the kernel's dispatch.
inline mx::cpu::CommandEncoder& encode_all(const mx::Stream& s, const std::vector<mx::array>& inputs,
                                           mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(s);
  for (auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(out);
  return enc;
}

inline void fill(const mx::array& in, const Rows& rows) {
  if (!rows.copy) return;
  const float* src = in.data<float>();
  float* dst = const_cast<float*>(rows.data());
  for (size_t i = 0; i < in.size(); ++i)
    dst[i] = src[mx::elem_to_loc(static_cast<int64_t>(i), in.shape(), in.strides())];
}

}  // namespace rlxviz
