// Layers.cpp — pointwise, normalization, pooling, padding, broadcasting and concatenation layers.
// Output-size rules and edge cases follow PyTorch 1.13's CPU kernels (cited per function).
#include "crucible/runtime/Layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "Microkernels.h"
#include "crucible/core/Contract.h"

namespace crucible::runtime {
namespace {
std::string hw(std::int64_t h, std::int64_t w) { return std::to_string(h) + "x" + std::to_string(w); }
}  // namespace

void activation(Activation act, const float* x, float* y, std::int64_t n) {
  CRUCIBLE_PRE(n >= 0, "activation: negative element count");
  if (x != y) std::memcpy(y, x, static_cast<std::size_t>(n) * sizeof(float));
  detail::apply_activation(act, y, n);
}

Result<ChannelAffine> batchnorm_affine(std::span<const float> mean, std::span<const float> var,
                                       std::span<const float> gamma, std::span<const float> beta,
                                       double eps) {
  const std::size_t c = mean.size();
  if (c == 0 || var.size() != c || (!gamma.empty() && gamma.size() != c) ||
      (!beta.empty() && beta.size() != c)) {
    return invalid_input("batchnorm: running_mean has " + std::to_string(c) +
                             " elements, running_var " + std::to_string(var.size()) + ", weight " +
                             std::to_string(gamma.size()) + ", bias " + std::to_string(beta.size()),
                         "pass [C] statistics (weight and bias may be empty for affine=False)");
  }
  if (!(eps >= 0.0)) {
    return invalid_input("batchnorm: eps=" + std::to_string(eps) + " is negative or NaN",
                         "use the module's eps (1e-5 by default)");
  }
  ChannelAffine a;
  a.scale.resize(c);
  a.shift.resize(c);
  for (std::size_t i = 0; i < c; ++i) {
    // Same arithmetic as PyTorch's batch_norm_cpu_collect_linear_and_constant_terms: invstd in
    // the accumulate type (double) then alpha = invstd * weight, beta = bias - mean * alpha.
    const double invstd = 1.0 / std::sqrt(static_cast<double>(var[i]) + eps);
    const double g = gamma.empty() ? 1.0 : gamma[i];
    const double b = beta.empty() ? 0.0 : beta[i];
    a.scale[i] = static_cast<float>(invstd * g);
    a.shift[i] = static_cast<float>(b - mean[i] * invstd * g);
  }
  return a;
}

void channel_affine(const ChannelAffine& a, const float* x, float* y, std::int64_t n,
                    std::int64_t hw) {
  const auto c = static_cast<std::int64_t>(a.scale.size());
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const float s = a.scale[static_cast<std::size_t>(ch)], t = a.shift[static_cast<std::size_t>(ch)];
      const float* xp = x + (i * c + ch) * hw;
      float* yp = y + (i * c + ch) * hw;
      for (std::int64_t j = 0; j < hw; ++j) yp[j] = xp[j] * s + t;
    }
  }
}

void layernorm(const float* x, float* y, std::int64_t rows, std::int64_t cols, const float* gamma,
               const float* beta, float eps) {
  CRUCIBLE_PRE(cols >= 1, "layernorm: empty rows");
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    double sum = 0.0, sq = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) sum += xr[j];
    const double mean = sum / static_cast<double>(cols);
    for (std::int64_t j = 0; j < cols; ++j) {
      const double d = xr[j] - mean;
      sq += d * d;
    }
    const double var = sq / static_cast<double>(cols);  // biased, like torch
    const auto rstd = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    const auto m = static_cast<float>(mean);
    for (std::int64_t j = 0; j < cols; ++j) {
      float v = (xr[j] - m) * rstd;
      if (gamma != nullptr) v *= gamma[j];
      if (beta != nullptr) v += beta[j];
      yr[j] = v;
    }
  }
}

void softmax(const float* x, float* y, std::int64_t outer, std::int64_t dim, std::int64_t inner) {
  CRUCIBLE_PRE(dim >= 1 && inner >= 1, "softmax: empty dimension");
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      const float* xp = x + o * dim * inner + i;
      float* yp = y + o * dim * inner + i;
      float mx = -std::numeric_limits<float>::infinity();
      for (std::int64_t d = 0; d < dim; ++d) mx = std::max(mx, xp[d * inner]);
      float sum = 0.0f;
      for (std::int64_t d = 0; d < dim; ++d) {
        const float e = std::exp(xp[d * inner] - mx);
        yp[d * inner] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (std::int64_t d = 0; d < dim; ++d) yp[d * inner] *= inv;
    }
  }
}

Result<std::pair<std::int64_t, std::int64_t>> pool2d_output_hw(PoolKind kind, const Pool2dSpec& s,
                                                              std::int64_t h, std::int64_t w) {
  const char* name = kind == PoolKind::Max ? "maxpool2d" : "avgpool2d";
  if (s.kernel_h < 1 || s.kernel_w < 1 || s.stride_h < 1 || s.stride_w < 1 || s.dilation_h < 1 ||
      s.dilation_w < 1 || s.pad_h < 0 || s.pad_w < 0) {
    return invalid_input(std::string(name) + ": kernel, stride and dilation must be >= 1 and "
                                             "padding >= 0",
                         "pass the torch.nn pooling module's arguments");
  }
  if (kind == PoolKind::Avg && (s.dilation_h != 1 || s.dilation_w != 1)) {
    return invalid_input("avgpool2d: dilation must be 1", "AvgPool2d has no dilation");
  }
  // aten/src/ATen/native/Pool.h: pad_h <= kH / 2 (1.13 checks the kernel, not the dilated one).
  if (s.pad_h > s.kernel_h / 2 || s.pad_w > s.kernel_w / 2) {
    return invalid_input(std::string(name) + ": padding " + hw(s.pad_h, s.pad_w) +
                             " exceeds half the kernel " + hw(s.kernel_h, s.kernel_w),
                         "PyTorch refuses this too; use padding <= kernel_size / 2");
  }
  auto out = [&](std::int64_t in, std::int64_t k, std::int64_t p, std::int64_t st,
                 std::int64_t d) -> std::int64_t {
    // pooling_output_shape_pad_lr: floor/ceil division, then the last window must start inside
    // the input or the left padding.
    const std::int64_t num = in + 2 * p - d * (k - 1) - 1 + (s.ceil_mode ? st - 1 : 0);
    std::int64_t o = (num >= 0 ? num / st : -((-num + st - 1) / st)) + 1;
    if (s.ceil_mode && (o - 1) * st >= in + p) --o;
    return o;
  };
  const std::int64_t oh = out(h, s.kernel_h, s.pad_h, s.stride_h, s.dilation_h);
  const std::int64_t ow = out(w, s.kernel_w, s.pad_w, s.stride_w, s.dilation_w);
  if (oh < 1 || ow < 1) {
    return invalid_input(std::string(name) + ": input " + hw(h, w) + " gives an empty output " +
                             hw(oh, ow),
                         "use a smaller kernel or a larger input");
  }
  return std::pair{oh, ow};
}

void maxpool2d(const Pool2dSpec& s, const float* x, std::int64_t nc, std::int64_t h,
               std::int64_t w, float* y) {
  const auto ohw = pool2d_output_hw(PoolKind::Max, s, h, w);
  CRUCIBLE_PRE(ohw.ok(), "pooling/padding parameters invalid for this input (check the *_output_hw function first)");
  const auto [oh, ow] = *ohw;
  if (s.kernel_h == 2 && s.kernel_w == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 &&
      s.pad_w == 0 && s.dilation_h == 1 && s.dilation_w == 1 && oh == h / 2 && ow == w / 2) {
    detail::maxpool2x2(x, nc, h, w, y);
    return;
  }
  for (std::int64_t p = 0; p < nc; ++p) {
    const float* xp = x + p * h * w;
    float* yp = y + p * oh * ow;
    for (std::int64_t oy = 0; oy < oh; ++oy) {
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t ky = 0; ky < s.kernel_h; ++ky) {
          const std::int64_t iy = oy * s.stride_h - s.pad_h + ky * s.dilation_h;
          if (iy < 0 || iy >= h) continue;
          for (std::int64_t kx = 0; kx < s.kernel_w; ++kx) {
            const std::int64_t ix = ox * s.stride_w - s.pad_w + kx * s.dilation_w;
            if (ix < 0 || ix >= w) continue;
            const float v = xp[iy * w + ix];
            if (v > m || std::isnan(v)) m = v;  // NaN wins, as in max_pool2d_kernel
            if (std::isnan(m)) break;
          }
        }
        yp[oy * ow + ox] = m;
      }
    }
  }
}

void avgpool2d(const Pool2dSpec& s, const float* x, std::int64_t nc, std::int64_t h,
               std::int64_t w, float* y) {
  const auto ohw = pool2d_output_hw(PoolKind::Avg, s, h, w);
  CRUCIBLE_PRE(ohw.ok(), "pooling/padding parameters invalid for this input (check the *_output_hw function first)");
  const auto [oh, ow] = *ohw;
  for (std::int64_t p = 0; p < nc; ++p) {
    const float* xp = x + p * h * w;
    float* yp = y + p * oh * ow;
    for (std::int64_t oy = 0; oy < oh; ++oy) {
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        // avg_pool2d_out_frame: the window clipped to input + padding sets pool_size.
        std::int64_t y0 = oy * s.stride_h - s.pad_h, x0 = ox * s.stride_w - s.pad_w;
        std::int64_t y1 = std::min(y0 + s.kernel_h, h + s.pad_h);
        std::int64_t x1 = std::min(x0 + s.kernel_w, w + s.pad_w);
        const std::int64_t pool_size = (y1 - y0) * (x1 - x0);
        y0 = std::max<std::int64_t>(y0, 0);
        x0 = std::max<std::int64_t>(x0, 0);
        y1 = std::min(y1, h);
        x1 = std::min(x1, w);
        if (y0 >= y1 || x0 >= x1) {
          yp[oy * ow + ox] = 0.0f;
          continue;
        }
        float sum = 0.0f;
        for (std::int64_t iy = y0; iy < y1; ++iy) {
          for (std::int64_t ix = x0; ix < x1; ++ix) sum += xp[iy * w + ix];
        }
        const std::int64_t div = s.count_include_pad ? pool_size : (y1 - y0) * (x1 - x0);
        yp[oy * ow + ox] = sum / static_cast<float>(div);
      }
    }
  }
}

void adaptive_avgpool2d(const float* x, std::int64_t nc, std::int64_t h, std::int64_t w,
                        std::int64_t oh, std::int64_t ow, float* y) {
  CRUCIBLE_PRE(oh >= 1 && ow >= 1 && h >= 1 && w >= 1, "adaptive_avgpool2d: empty input or output");
  for (std::int64_t p = 0; p < nc; ++p) {
    const float* xp = x + p * h * w;
    float* yp = y + p * oh * ow;
    for (std::int64_t oy = 0; oy < oh; ++oy) {
      const std::int64_t y0 = (oy * h) / oh, y1 = ((oy + 1) * h + oh - 1) / oh;  // floor, ceil
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        const std::int64_t x0 = (ox * w) / ow, x1 = ((ox + 1) * w + ow - 1) / ow;
        float sum = 0.0f;
        for (std::int64_t iy = y0; iy < y1; ++iy) {
          for (std::int64_t ix = x0; ix < x1; ++ix) sum += xp[iy * w + ix];
        }
        yp[oy * ow + ox] = sum / static_cast<float>((y1 - y0) * (x1 - x0));
      }
    }
  }
}

Result<std::pair<std::int64_t, std::int64_t>> pad2d_output_hw(const Pad2dSpec& s, std::int64_t h,
                                                             std::int64_t w) {
  const std::int64_t oh = h + s.top + s.bottom, ow = w + s.left + s.right;
  if (oh < 1 || ow < 1) {
    return invalid_input("pad2d: padding input " + hw(h, w) + " gives an empty output " + hw(oh, ow),
                         "negative padding may crop at most all but one row/column");
  }
  // Reflect indexes around the original edges (negative amounts then crop), which needs every
  // amount smaller than the dimension it pads, as PyTorch checks.
  if (s.mode == PadMode::Reflect && (s.left >= w || s.right >= w || s.top >= h || s.bottom >= h)) {
    return invalid_input("pad2d: reflect padding must be smaller than the input " + hw(h, w),
                         "PyTorch refuses this too; use replicate or constant mode");
  }
  return std::pair{oh, ow};
}

void pad2d(const Pad2dSpec& s, const float* x, std::int64_t nc, std::int64_t h, std::int64_t w,
           float* y) {
  const auto ohw = pad2d_output_hw(s, h, w);
  CRUCIBLE_PRE(ohw.ok(), "pooling/padding parameters invalid for this input (check the *_output_hw function first)");
  const auto [oh, ow] = *ohw;
  auto src = [&](std::int64_t i, std::int64_t n) -> std::int64_t {  // -1: constant value
    switch (s.mode) {
      case PadMode::Constant: return (i >= 0 && i < n) ? i : -1;
      case PadMode::Reflect: return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i);
      case PadMode::Replicate: return std::clamp<std::int64_t>(i, 0, n - 1);
    }
    return -1;
  };
  for (std::int64_t p = 0; p < nc; ++p) {
    const float* xp = x + p * h * w;
    float* yp = y + p * oh * ow;
    for (std::int64_t oy = 0; oy < oh; ++oy) {
      const std::int64_t iy = src(oy - s.top, h);
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        const std::int64_t ix = src(ox - s.left, w);
        yp[oy * ow + ox] = (iy < 0 || ix < 0) ? s.value : xp[iy * w + ix];
      }
    }
  }
}

Result<std::vector<std::int64_t>> broadcast_shape(std::span<const std::int64_t> a,
                                                  std::span<const std::int64_t> b) {
  const std::size_t n = std::max(a.size(), b.size());
  std::vector<std::int64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      return invalid_input("broadcast: sizes " + std::to_string(da) + " and " + std::to_string(db) +
                               " at dimension " + std::to_string(i) + " (right-aligned) differ and neither is 1",
                           "make the shapes broadcastable, as PyTorch requires");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

void binary(BinaryOp op, const float* a, std::span<const std::int64_t> a_shape, const float* b,
            std::span<const std::int64_t> b_shape, float* y) {
  const auto out_shape = broadcast_shape(a_shape, b_shape);
  CRUCIBLE_PRE(out_shape.ok(), "binary: shapes do not broadcast (check broadcast_shape first)");
  const std::vector<std::int64_t>& os = *out_shape;
  const std::size_t nd = os.size();
  // Element strides of a and b in the output's index space (0 where broadcast).
  std::vector<std::int64_t> sa(nd, 0), sb(nd, 0);
  auto strides = [&](std::span<const std::int64_t> shape, std::vector<std::int64_t>& st) {
    std::int64_t s = 1;
    for (std::size_t i = shape.size(); i-- > 0;) {
      const std::size_t oi = i + (nd - shape.size());
      st[oi] = shape[i] == 1 ? 0 : s;
      s *= shape[i];
    }
  };
  strides(a_shape, sa);
  strides(b_shape, sb);
  std::int64_t total = 1;
  for (std::int64_t d : os) total *= d;
  if (total == 0) return;
  const std::int64_t inner = nd == 0 ? 1 : os[nd - 1];
  const std::int64_t ia = nd == 0 ? 0 : sa[nd - 1], ib = nd == 0 ? 0 : sb[nd - 1];
  std::vector<std::int64_t> idx(nd, 0);
  std::int64_t pa = 0, pb = 0;
  for (std::int64_t base = 0; base < total; base += inner) {
    float* yp = y + base;
    if (op == BinaryOp::Add) {
      for (std::int64_t j = 0; j < inner; ++j) yp[j] = a[pa + j * ia] + b[pb + j * ib];
    } else {
      for (std::int64_t j = 0; j < inner; ++j) yp[j] = a[pa + j * ia] * b[pb + j * ib];
    }
    // Advance the multi-index over every dimension but the last.
    for (std::size_t d = nd >= 1 ? nd - 1 : 0; d-- > 0;) {
      ++idx[d];
      pa += sa[d];
      pb += sb[d];
      if (idx[d] < os[d]) break;
      pa -= sa[d] * os[d];
      pb -= sb[d] * os[d];
      idx[d] = 0;
    }
  }
}

void concat(std::span<const float* const> xs, std::span<const std::int64_t> sizes,
            std::int64_t outer, std::int64_t inner, float* y) {
  CRUCIBLE_PRE(xs.size() == sizes.size(), "concat: one size per input");
  std::int64_t total = 0;
  for (std::int64_t s : sizes) total += s;
  for (std::int64_t o = 0; o < outer; ++o) {
    float* dst = y + o * total * inner;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const std::int64_t chunk = sizes[i] * inner;
      std::memcpy(dst, xs[i] + o * chunk, static_cast<std::size_t>(chunk) * sizeof(float));
      dst += chunk;
    }
  }
}

}  // namespace crucible::runtime
