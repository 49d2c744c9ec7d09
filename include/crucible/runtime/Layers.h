// Layers.h — the runtime's non-GEMM layers on contiguous float32 buffers (NCHW where it matters).
//
// Each mirrors the PyTorch operator named beside it, including its output-size rules, so that a
// model trained in PyTorch runs here unchanged. Shape and parameter checks that depend on user
// input return a Status (the *_output_* functions); the kernels themselves state their
// preconditions as contracts and do no allocation.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/runtime/Cpu.h"

namespace crucible::runtime {

// relu / gelu (erf, or tanh approximation) / sigmoid / tanh, elementwise; y may equal x.
void activation(Activation act, const float* x, float* y, std::int64_t n);

// torch.nn.BatchNorm2d in eval mode as a per-channel affine map: y = x * scale[c] + shift[c]
// with scale = gamma / sqrt(var + eps), shift = beta - mean * scale. x, y: [n, c, hw]; y may
// equal x. Empty gamma/beta mean 1/0 (affine=False).
struct ChannelAffine {
  std::vector<float> scale, shift;
};
Result<ChannelAffine> batchnorm_affine(std::span<const float> mean, std::span<const float> var,
                                       std::span<const float> gamma, std::span<const float> beta,
                                       double eps);
void channel_affine(const ChannelAffine& a, const float* x, float* y, std::int64_t n,
                    std::int64_t hw);

// torch.nn.functional.layer_norm over the last `cols` elements of each row; gamma/beta empty
// or [cols]. y may equal x.
void layernorm(const float* x, float* y, std::int64_t rows, std::int64_t cols, const float* gamma,
               const float* beta, float eps);

// torch.softmax along one dimension of a tensor viewed as [outer, dim, inner]; y may equal x.
void softmax(const float* x, float* y, std::int64_t outer, std::int64_t dim, std::int64_t inner);

// torch.nn.MaxPool2d / AvgPool2d on [nc, h, w] planes.
struct Pool2dSpec {
  std::int64_t kernel_h = 1, kernel_w = 1;
  std::int64_t stride_h = 1, stride_w = 1;  // PyTorch's default stride is the kernel size
  std::int64_t pad_h = 0, pad_w = 0;
  std::int64_t dilation_h = 1, dilation_w = 1;  // max pooling only
  bool ceil_mode = false;
  bool count_include_pad = true;  // average pooling only
};
enum class PoolKind : std::uint8_t { Max, Avg };
Result<std::pair<std::int64_t, std::int64_t>> pool2d_output_hw(PoolKind kind,
                                                              const Pool2dSpec& spec,
                                                              std::int64_t h, std::int64_t w);
void maxpool2d(const Pool2dSpec& spec, const float* x, std::int64_t nc, std::int64_t h,
               std::int64_t w, float* y);
void avgpool2d(const Pool2dSpec& spec, const float* x, std::int64_t nc, std::int64_t h,
               std::int64_t w, float* y);
// torch.nn.AdaptiveAvgPool2d((oh, ow)).
void adaptive_avgpool2d(const float* x, std::int64_t nc, std::int64_t h, std::int64_t w,
                        std::int64_t oh, std::int64_t ow, float* y);

// torch.nn.functional.pad on the last two dimensions (negative amounts crop).
enum class PadMode : std::uint8_t { Constant, Reflect, Replicate };
struct Pad2dSpec {
  std::int64_t left = 0, right = 0, top = 0, bottom = 0;
  PadMode mode = PadMode::Constant;
  float value = 0.0f;
};
Result<std::pair<std::int64_t, std::int64_t>> pad2d_output_hw(const Pad2dSpec& spec,
                                                             std::int64_t h, std::int64_t w);
void pad2d(const Pad2dSpec& spec, const float* x, std::int64_t nc, std::int64_t h, std::int64_t w,
           float* y);

// a + b, a * b with NumPy/PyTorch broadcasting. Shapes are right-aligned; the output shape comes
// from broadcast_shape(). y may equal a or b when that operand already has the output shape.
enum class BinaryOp : std::uint8_t { Add, Mul };
Result<std::vector<std::int64_t>> broadcast_shape(std::span<const std::int64_t> a,
                                                  std::span<const std::int64_t> b);
void binary(BinaryOp op, const float* a, std::span<const std::int64_t> a_shape, const float* b,
            std::span<const std::int64_t> b_shape, float* y);

// torch.cat along `dim`: every input has the same shape except at dim. Each input is viewed as
// [outer, sizes[i], inner] and y as [outer, sum(sizes), inner].
void concat(std::span<const float* const> xs, std::span<const std::int64_t> sizes,
            std::int64_t outer, std::int64_t inner, float* y);

}  // namespace crucible::runtime
