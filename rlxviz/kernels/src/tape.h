// program_tape: MLX's lazy graph as Python records (see tape.cpp).
#pragma once

#include <sstream>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "mlx/array.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace rlxviz {

namespace mx = mlx::core;
namespace nb = nanobind;

// [(primitive name, [(array id, shape, dtype, nbytes) per input], [(...) per output]), ...] for the
// unevaluated graph of `outputs`, inputs before readers; a primitive with several outputs appears once.
nb::list program_tape(const std::vector<mx::array>& outputs);

}  // namespace rlxviz
