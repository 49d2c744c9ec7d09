// Linear.h — y = x W^T + b (float32) with the activation fused into the epilogue.
//
// Few rows (inference on one sample) make this a matrix-vector product bound by reading W once:
// an AVX2 dot-product kernel does it. From kBlasRows rows on, OpenBLAS's sgemm wins (it packs
// W into cache-sized panels and reuses them across rows), so it is called instead; the epilogue
// runs afterwards.
//
// Note [Lazy OpenBLAS]: OpenBLAS is dlopen()ed the first time a GEMM-sized call needs it, not
// linked: loading it starts its thread pool and costs about 3.7 MB of resident memory (measured
// on this project's machine), more than the whole of a small CNN's inference. A host that only
// runs batch-1 inference never pays that. If the library cannot be loaded, the own kernel runs
// every row instead and blas_status() says why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <span>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/runtime/Cpu.h"

namespace crucible::runtime {

class PackedLinear {
 public:
  static constexpr std::int64_t kBlasRows = 16;

  // weight: [out_features, in_features] contiguous; bias: empty or [out_features].
  static Result<PackedLinear> make(std::int64_t in_features, std::int64_t out_features,
                                   std::span<const float> weight, std::span<const float> bias,
                                   Activation act = Activation::None);

  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  Activation activation() const { return act_; }
  std::size_t bytes() const { return (weight_->size() + bias_->size()) * sizeof(float); }
  // A copy with another epilogue activation (weights shared).
  PackedLinear with_activation(Activation act) const;
  // x: [rows, in_features]; y: [rows, out_features]; disjoint.
  void run(const float* x, std::int64_t rows, float* y) const;

 private:
  std::int64_t in_ = 0, out_ = 0;
  Activation act_ = Activation::None;
  std::shared_ptr<const std::vector<float>> weight_, bias_;  // bias_ zero-filled when absent
};

// Whether OpenBLAS is loaded (after the first GEMM-sized call tried): "not loaded yet",
// "loaded from <path>", or the dlopen error.
std::string blas_status();

}  // namespace crucible::runtime
