// Weights.h — named float32 weights for a Net, taken from a torch-free loaded state dict.
//
// get() checks a tensor's shape against what the layer expects, so a checkpoint from another
// architecture fails with a message naming the tensor and both shapes instead of running on
// wrong data, then returns its elements as contiguous float32: a contiguous, aligned float32
// tensor is viewed in place in the loaded file (no copy — a network builder copies it into its
// packed layout anyway); any other dtype or layout is materialized once into a copy the Weights
// object owns. Spans stay valid while both the StateDict and the Weights live. unused() lists
// what no layer asked for.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/ptload/StateDict.h"

namespace crucible::runtime {

class Weights {
 public:
  explicit Weights(const ptload::StateDict& sd) : sd_(&sd) {}

  Result<std::span<const float>> get(std::string_view name, std::span<const std::int64_t> shape);
  Result<std::span<const float>> get(std::string_view name,
                                     std::initializer_list<std::int64_t> shape) {
    return get(name, std::span<const std::int64_t>(shape.begin(), shape.size()));
  }
  Result<std::vector<std::int64_t>> shape_of(std::string_view name) const;
  bool contains(std::string_view name) const { return sd_->find(name) != nullptr; }
  std::vector<std::string> unused() const;

 private:
  const ptload::StateDict* sd_;
  std::map<std::string, std::vector<float>, std::less<>> cache_;  // materialized copies
  std::set<std::string, std::less<>> used_;
};

}  // namespace crucible::runtime
