// Conv2d.h — 2-D convolution (NCHW, float32) with bias and activation fused into the epilogue.
//
// PackedConv2d::make() checks the spec and copies the weights once into the microkernel's layout
// (output channels in blocks of 4, zero-padded); run() is then allocation-free: the caller passes
// a workspace of workspace_floats() floats (Net plans it inside its activation arena).
//
// Note [Implicit GEMM]: a convolution is C[oc][p] = sum_k W[oc][k] * X(k, p) over k = (ic, ky, kx).
// For stride 1 the input is copied once into a zero-padded plane of width Wp, and the output is
// computed on that same width: then X(k, p) = padded[ic][p + ky*dh*Wp + kx*dw] is contiguous in p
// for every k, so the microkernel reads 24 consecutive positions with three vector loads and no
// im2col buffer. The (kw-1)*dw columns per row that this computes beyond the output width are
// dropped when the result is copied out (2% of the work for a 3x3 kernel on a 100-wide plane).
// Strided convolutions use an explicit im2col buffer and the same microkernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/runtime/Cpu.h"

namespace crucible::runtime {

struct Conv2dSpec {
  std::int64_t in_channels = 0, out_channels = 0;
  std::int64_t kernel_h = 1, kernel_w = 1;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;  // zero padding, both sides
  std::int64_t dilation_h = 1, dilation_w = 1;
  std::int64_t groups = 1;
};

// Every field in range and channels divisible by groups; the error says which field.
Status validate(const Conv2dSpec& spec);
// Output height and width for an input of h x w; an empty output is an error.
Result<std::pair<std::int64_t, std::int64_t>> conv2d_output_hw(const Conv2dSpec& spec,
                                                              std::int64_t h, std::int64_t w);

class PackedConv2d {
 public:
  // weight: [out_channels, in_channels/groups, kernel_h, kernel_w], contiguous;
  // bias: empty or [out_channels].
  static Result<PackedConv2d> make(const Conv2dSpec& spec, std::span<const float> weight,
                                   std::span<const float> bias, Activation act = Activation::None);

  const Conv2dSpec& spec() const { return spec_; }
  Activation activation() const { return act_; }
  std::size_t bytes() const { return (packed_->size() + bias_->size()) * sizeof(float); }

  // Copies share the packed weights (they are immutable); these return modified copies.
  // with_activation: another epilogue activation, weights shared.
  PackedConv2d with_activation(Activation act) const;
  // folded: the convolution followed by y[oc] * scale[oc] + shift[oc] (an eval-mode batchnorm)
  // as one convolution — weights and bias rescaled per output channel (new storage).
  PackedConv2d folded(std::span<const float> scale, std::span<const float> shift) const;
  // Floats of scratch run() needs for one h x w image (the same for any batch size).
  std::size_t workspace_floats(std::int64_t h, std::int64_t w) const;
  // x: [n, in_channels, h, w]; y: [n, out_channels, ho, wo]; both contiguous and disjoint.
  void run(const float* x, std::int64_t n, std::int64_t h, std::int64_t w, float* y,
           float* workspace) const;

 private:
  Conv2dSpec spec_;
  Activation act_ = Activation::None;
  std::int64_t oc_per_group_ = 0, oc_blocks_ = 0, k_ = 0;  // k_ = in_channels/groups * kh * kw
  std::shared_ptr<const std::vector<float>> packed_;  // [groups][oc_blocks][k][4]
  std::shared_ptr<const std::vector<float>> bias_;    // [groups][oc_blocks * 4], zero when absent
};

}  // namespace crucible::runtime
