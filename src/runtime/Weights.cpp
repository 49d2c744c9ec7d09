// Weights.cpp — shape-checked float32 weights from a loaded state dict.
#include "crucible/runtime/Weights.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "crucible/core/ShapeText.h"

namespace crucible::runtime {
Result<std::vector<std::int64_t>> Weights::shape_of(std::string_view name) const {
  const ptload::TensorView* t = sd_->find(name);
  if (t == nullptr) {
    return invalid_input("weights: no tensor named '" + std::string(name) + "' in the state dict",
                         "check the module path (crucible pt ls FILE lists the names)");
  }
  return std::vector<std::int64_t>(t->sizes().begin(), t->sizes().end());
}

Result<std::span<const float>> Weights::get(std::string_view name,
                                            std::span<const std::int64_t> shape) {
  const ptload::TensorView* t = sd_->find(name);
  if (t == nullptr) {
    return invalid_input("weights: no tensor named '" + std::string(name) + "' in the state dict",
                         "check the module path (crucible pt ls FILE lists the names)");
  }
  if (!std::equal(t->sizes().begin(), t->sizes().end(), shape.begin(), shape.end())) {
    return invalid_input("weights: '" + std::string(name) + "' has shape " +
                             shape_text(t->sizes()) + ", the layer expects " + shape_text(shape),
                         "the checkpoint was saved from a different architecture; build the "
                         "network with the sizes it was trained with");
  }
  if (!used_.contains(name)) used_.emplace(name);
  constexpr std::int8_t kFloat32 = 6;  // c10::ScalarType::Float
  if (t->dtype() == kFloat32 && t->is_contiguous() &&
      reinterpret_cast<std::uintptr_t>(t->data()) % alignof(float) == 0) {
    return std::span<const float>(reinterpret_cast<const float*>(t->data()),
                                  static_cast<std::size_t>(t->numel()));
  }
  auto it = cache_.find(name);
  if (it == cache_.end()) {
    it = cache_.emplace(std::string(name), t->materialize_f32()).first;
  }
  return std::span<const float>(it->second);
}

std::vector<std::string> Weights::unused() const {
  std::vector<std::string> out;
  for (const ptload::NamedTensor& nt : sd_->tensors()) {
    // BatchNorm's num_batches_tracked is bookkeeping for training, never a weight.
    const std::string_view n = nt.name;
    if (n.size() >= 19 && n.substr(n.size() - 19) == "num_batches_tracked") continue;
    if (!used_.contains(nt.name)) out.push_back(nt.name);
  }
  return out;
}

}  // namespace crucible::runtime
