// Conv2d.cpp — spec checks, weight packing and the two convolution paths (Note [Implicit GEMM]).
#include "crucible/runtime/Conv2d.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "Microkernels.h"
#include "crucible/core/Contract.h"

namespace crucible::runtime {
namespace {

// Sizes beyond this are refused so that every index below fits comfortably in 64 bits.
constexpr std::int64_t kMaxDim = std::int64_t{1} << 24;

std::string field(const char* name, std::int64_t v) { return std::string(name) + "=" + std::to_string(v); }

bool direct_path(const Conv2dSpec& s) { return s.stride_h == 1 && s.stride_w == 1; }

std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

// Offsets (ptrdiff_t) sit at the start of the workspace, then the float buffers, 16-float aligned.
std::int64_t offsets_floats(std::int64_t k) {
  return round_up(k * static_cast<std::int64_t>(sizeof(std::ptrdiff_t) / sizeof(float)), 16);
}

}  // namespace

Status validate(const Conv2dSpec& s) {
  struct Check {
    const char* name;
    std::int64_t value, lo;
  };
  const Check checks[] = {{"in_channels", s.in_channels, 1}, {"out_channels", s.out_channels, 1},
                          {"kernel_h", s.kernel_h, 1},       {"kernel_w", s.kernel_w, 1},
                          {"stride_h", s.stride_h, 1},       {"stride_w", s.stride_w, 1},
                          {"pad_h", s.pad_h, 0},             {"pad_w", s.pad_w, 0},
                          {"dilation_h", s.dilation_h, 1},   {"dilation_w", s.dilation_w, 1},
                          {"groups", s.groups, 1}};
  for (const Check& c : checks) {
    if (c.value < c.lo || c.value > kMaxDim) {
      return invalid_input("conv2d: " + field(c.name, c.value) + " is out of range [" +
                               std::to_string(c.lo) + ", " + std::to_string(kMaxDim) + "]",
                           "pass the values of the torch.nn.Conv2d the weights came from");
    }
  }
  if (s.in_channels % s.groups != 0 || s.out_channels % s.groups != 0) {
    return invalid_input("conv2d: " + field("in_channels", s.in_channels) + " and " +
                             field("out_channels", s.out_channels) + " must both be divisible by " +
                             field("groups", s.groups),
                         "check the groups argument");
  }
  return ok_status();
}

Result<std::pair<std::int64_t, std::int64_t>> conv2d_output_hw(const Conv2dSpec& s, std::int64_t h,
                                                              std::int64_t w) {
  CRUCIBLE_RETURN_IF_ERROR(validate(s));
  if (h < 1 || w < 1 || h > kMaxDim || w > kMaxDim) {
    return invalid_input("conv2d: input plane " + std::to_string(h) + "x" + std::to_string(w) +
                             " is empty or too large",
                         "pass an input of shape [n, c, h, w] with 1 <= h, w <= 2^24");
  }
  const std::int64_t eh = s.dilation_h * (s.kernel_h - 1) + 1;
  const std::int64_t ew = s.dilation_w * (s.kernel_w - 1) + 1;
  if (h + 2 * s.pad_h < eh || w + 2 * s.pad_w < ew) {
    return invalid_input("conv2d: padded input " + std::to_string(h + 2 * s.pad_h) + "x" +
                             std::to_string(w + 2 * s.pad_w) + " is smaller than the dilated kernel " +
                             std::to_string(eh) + "x" + std::to_string(ew),
                         "use a larger input or more padding");
  }
  return std::pair{(h + 2 * s.pad_h - eh) / s.stride_h + 1, (w + 2 * s.pad_w - ew) / s.stride_w + 1};
}

Result<PackedConv2d> PackedConv2d::make(const Conv2dSpec& spec, std::span<const float> weight,
                                        std::span<const float> bias, Activation act) {
  CRUCIBLE_RETURN_IF_ERROR(validate(spec));
  PackedConv2d p;
  p.spec_ = spec;
  p.act_ = act;
  const std::int64_t icg = spec.in_channels / spec.groups;
  p.oc_per_group_ = spec.out_channels / spec.groups;
  p.oc_blocks_ = (p.oc_per_group_ + 3) / 4;
  p.k_ = icg * spec.kernel_h * spec.kernel_w;
  const std::int64_t expect = spec.out_channels * p.k_;
  if (static_cast<std::int64_t>(weight.size()) != expect) {
    return invalid_input("conv2d: weight has " + std::to_string(weight.size()) +
                             " elements, expected out_channels*in_channels/groups*kh*kw = " +
                             std::to_string(expect),
                         "pass the [out, in/groups, kh, kw] weight of this convolution");
  }
  if (!bias.empty() && static_cast<std::int64_t>(bias.size()) != spec.out_channels) {
    return invalid_input("conv2d: bias has " + std::to_string(bias.size()) + " elements, expected " +
                             std::to_string(spec.out_channels),
                         "pass the conv's [out_channels] bias, or none");
  }
  auto packed = std::make_shared<std::vector<float>>(
      static_cast<std::size_t>(spec.groups * p.oc_blocks_ * p.k_ * 4), 0.0f);
  auto packed_bias = std::make_shared<std::vector<float>>(
      static_cast<std::size_t>(spec.groups * p.oc_blocks_ * 4), 0.0f);
  for (std::int64_t g = 0; g < spec.groups; ++g) {
    for (std::int64_t o = 0; o < p.oc_per_group_; ++o) {
      const std::int64_t oc = g * p.oc_per_group_ + o;
      const std::int64_t blk = g * p.oc_blocks_ + o / 4;
      for (std::int64_t k = 0; k < p.k_; ++k) {
        (*packed)[static_cast<std::size_t>((blk * p.k_ + k) * 4 + o % 4)] =
            weight[static_cast<std::size_t>(oc * p.k_ + k)];
      }
      if (!bias.empty()) (*packed_bias)[static_cast<std::size_t>(blk * 4 + o % 4)] = bias[static_cast<std::size_t>(oc)];
    }
  }
  p.packed_ = std::move(packed);
  p.bias_ = std::move(packed_bias);
  return p;
}

PackedConv2d PackedConv2d::with_activation(Activation act) const {
  PackedConv2d p = *this;
  p.act_ = act;
  return p;
}

PackedConv2d PackedConv2d::folded(std::span<const float> scale, std::span<const float> shift) const {
  CRUCIBLE_PRE(static_cast<std::int64_t>(scale.size()) == spec_.out_channels &&
                   static_cast<std::int64_t>(shift.size()) == spec_.out_channels,
               "conv2d fold: one scale and shift per output channel");
  PackedConv2d p = *this;
  auto packed = std::make_shared<std::vector<float>>(*packed_);
  auto bias = std::make_shared<std::vector<float>>(*bias_);
  for (std::int64_t g = 0; g < spec_.groups; ++g) {
    for (std::int64_t o = 0; o < oc_per_group_; ++o) {
      const auto oc = static_cast<std::size_t>(g * oc_per_group_ + o);
      const std::int64_t blk = g * oc_blocks_ + o / 4;
      for (std::int64_t k = 0; k < k_; ++k) {
        (*packed)[static_cast<std::size_t>((blk * k_ + k) * 4 + o % 4)] *= scale[oc];
      }
      float& b = (*bias)[static_cast<std::size_t>(blk * 4 + o % 4)];
      b = b * scale[oc] + shift[oc];
    }
  }
  p.packed_ = std::move(packed);
  p.bias_ = std::move(bias);
  return p;
}

std::size_t PackedConv2d::workspace_floats(std::int64_t h, std::int64_t w) const {
  const Conv2dSpec& s = spec_;
  const std::int64_t eh = s.dilation_h * (s.kernel_h - 1) + 1;
  const std::int64_t ew = s.dilation_w * (s.kernel_w - 1) + 1;
  const std::int64_t hp = h + 2 * s.pad_h, wp = w + 2 * s.pad_w;
  const std::int64_t ho = (hp - eh) / s.stride_h + 1, wo = (wp - ew) / s.stride_w + 1;
  std::int64_t floats = offsets_floats(k_);
  if (direct_path(s)) {
    // Padded input with read slack for the last partial tile, then a 4-row output block.
    floats += round_up(s.in_channels * hp * wp + (ew - 1) + detail::kIgemmNr, 16);
    floats += 4 * ho * wp;
  } else {
    floats += k_ * round_up(ho * wo, detail::kIgemmNr);  // im2col of one group
  }
  return static_cast<std::size_t>(floats);
}

void PackedConv2d::run(const float* x, std::int64_t n, std::int64_t h, std::int64_t w, float* y,
                       float* workspace) const {
  const Conv2dSpec& s = spec_;
  CRUCIBLE_PRE(x != nullptr && y != nullptr && workspace != nullptr && n >= 1, "conv2d: null buffer or empty batch");
  const std::int64_t eh = s.dilation_h * (s.kernel_h - 1) + 1;
  const std::int64_t ew = s.dilation_w * (s.kernel_w - 1) + 1;
  const std::int64_t hp = h + 2 * s.pad_h, wp = w + 2 * s.pad_w;
  CRUCIBLE_PRE(hp >= eh && wp >= ew, "conv2d: input smaller than the dilated kernel (check conv2d_output_hw first)");
  const std::int64_t ho = (hp - eh) / s.stride_h + 1, wo = (wp - ew) / s.stride_w + 1;
  const std::int64_t icg = s.in_channels / s.groups;
  const std::int64_t khw = s.kernel_h * s.kernel_w;
  auto* off = reinterpret_cast<std::ptrdiff_t*>(workspace);
  float* buf = workspace + offsets_floats(k_);

  detail::IgemmBlock blk;
  blk.k = k_;
  blk.off = off;
  blk.act = act_;
  for (std::int64_t img = 0; img < n; ++img) {
    const float* xi = x + img * s.in_channels * h * w;
    float* yi = y + img * s.out_channels * ho * wo;
    if (direct_path(s)) {
      const std::int64_t plane = hp * wp;
      const std::int64_t padded = round_up(s.in_channels * plane + (ew - 1) + detail::kIgemmNr, 16);
      float* pin = buf;
      float* pout = buf + padded;
      std::memset(pin, 0, static_cast<std::size_t>(padded) * sizeof(float));
      for (std::int64_t c = 0; c < s.in_channels; ++c) {
        for (std::int64_t r = 0; r < h; ++r) {
          std::memcpy(pin + c * plane + (r + s.pad_h) * wp + s.pad_w, xi + (c * h + r) * w,
                      static_cast<std::size_t>(w) * sizeof(float));
        }
      }
      for (std::int64_t c = 0; c < icg; ++c) {
        for (std::int64_t ky = 0; ky < s.kernel_h; ++ky) {
          for (std::int64_t kx = 0; kx < s.kernel_w; ++kx) {
            off[c * khw + ky * s.kernel_w + kx] = c * plane + ky * s.dilation_h * wp + kx * s.dilation_w;
          }
        }
      }
      blk.n = ho * wp;
      blk.c = pout;
      blk.ldc = ho * wp;
      for (std::int64_t g = 0; g < s.groups; ++g) {
        blk.b = pin + g * icg * plane;
        for (std::int64_t ob = 0; ob < oc_blocks_; ++ob) {
          const std::int64_t pb = g * oc_blocks_ + ob;
          blk.a = packed_->data() + pb * k_ * 4;
          blk.bias = bias_->data() + pb * 4;
          blk.rows = static_cast<int>(std::min<std::int64_t>(4, oc_per_group_ - ob * 4));
          detail::igemm(blk);
          for (int r = 0; r < blk.rows; ++r) {
            const std::int64_t oc = g * oc_per_group_ + ob * 4 + r;
            for (std::int64_t oy = 0; oy < ho; ++oy) {
              std::memcpy(yi + (oc * ho + oy) * wo, pout + r * ho * wp + oy * wp,
                          static_cast<std::size_t>(wo) * sizeof(float));
            }
          }
        }
      }
    } else {
      const std::int64_t npos = ho * wo;
      const std::int64_t nr = round_up(npos, detail::kIgemmNr);
      float* col = buf;
      for (std::int64_t k = 0; k < k_; ++k) off[k] = k * nr;
      blk.b = col;
      blk.n = npos;
      blk.ldc = npos;
      for (std::int64_t g = 0; g < s.groups; ++g) {
        for (std::int64_t c = 0; c < icg; ++c) {
          const float* plane = xi + (g * icg + c) * h * w;
          for (std::int64_t ky = 0; ky < s.kernel_h; ++ky) {
            for (std::int64_t kx = 0; kx < s.kernel_w; ++kx) {
              float* row = col + (c * khw + ky * s.kernel_w + kx) * nr;
              for (std::int64_t oy = 0; oy < ho; ++oy) {
                const std::int64_t iy = oy * s.stride_h - s.pad_h + ky * s.dilation_h;
                float* dst = row + oy * wo;
                if (iy < 0 || iy >= h) {
                  std::fill(dst, dst + wo, 0.0f);
                  continue;
                }
                const float* src = plane + iy * w;
                for (std::int64_t ox = 0; ox < wo; ++ox) {
                  const std::int64_t ix = ox * s.stride_w - s.pad_w + kx * s.dilation_w;
                  dst[ox] = (ix >= 0 && ix < w) ? src[ix] : 0.0f;
                }
              }
              std::fill(row + npos, row + nr, 0.0f);
            }
          }
        }
        for (std::int64_t ob = 0; ob < oc_blocks_; ++ob) {
          const std::int64_t pb = g * oc_blocks_ + ob;
          blk.a = packed_->data() + pb * k_ * 4;
          blk.bias = bias_->data() + pb * 4;
          blk.rows = static_cast<int>(std::min<std::int64_t>(4, oc_per_group_ - ob * 4));
          blk.c = yi + (g * oc_per_group_ + ob * 4) * npos;
          detail::igemm(blk);
        }
      }
    }
  }
}

}  // namespace crucible::runtime
