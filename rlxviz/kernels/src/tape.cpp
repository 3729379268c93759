// The lazy graph MLX will execute for a set of output arrays, as records: one per primitive, with the
// shape, dtype and nbytes of every input and output array, in the order a depth-first walk from the
// outputs reaches them (inputs before their readers, as mx.export_to_dot writes them). Nothing is
// evaluated. An array without a primitive (an evaluated argument, a constant) is a leaf.
#include "tape.h"

#include <functional>
#include <unordered_set>

namespace rlxviz {

namespace {

nb::tuple array_record(const mx::array& a) {
  nb::list shape;
  for (auto d : a.shape()) shape.append(nb::int_(d));
  std::ostringstream dt;
  dt << a.dtype();
  return nb::make_tuple(static_cast<std::uint64_t>(a.id()), shape, dt.str(),
                        static_cast<std::uint64_t>(a.nbytes()));
}

}  // namespace

nb::list program_tape(const std::vector<mx::array>& outputs) {
  nb::list records;
  // array ids already recorded (a primitive's outputs all at once). Not primitive ids: mx.compile reuses one
  // Primitive object for every call of a compiled function, so six layers share their primitives' pointers.
  std::unordered_set<std::uintptr_t> seen;
  std::function<void(const mx::array&)> visit = [&](const mx::array& a) {
    if (!a.has_primitive() || seen.count(a.id())) return;
    for (const auto& out : a.outputs()) seen.insert(out.id());
    for (const auto& in : a.inputs()) visit(in);
    nb::list ins, outs;
    for (const auto& in : a.inputs()) ins.append(array_record(in));
    for (const auto& out : a.outputs()) outs.append(array_record(out));
    records.append(nb::make_tuple(std::string(a.primitive().name()), ins, outs));
  };
  for (const auto& o : outputs) visit(o);
  return records;
}

}  // namespace rlxviz
