// MicrokernelsPortable.cpp — the implicit-GEMM and GEMV kernels in plain C++, for any CPU.
//
// Compiled for the baseline target (see CMakeLists.txt), so a binary built with -march=native
// still has a path that runs on a CPU without AVX2. The loops are shaped so that the compiler
// can vectorize the 24-wide position loop with whatever the baseline has (SSE2 on x86-64).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "Microkernels.h"

namespace crucible::runtime::detail {

void apply_activation(Activation act, float* y, std::int64_t n) {
  switch (act) {
    case Activation::None:
      return;
    case Activation::Relu:
      for (std::int64_t i = 0; i < n; ++i) {
        y[i] = (y[i] > 0.0f || std::isnan(y[i])) ? y[i] : 0.0f;
      }
      return;
    case Activation::Gelu:
      for (std::int64_t i = 0; i < n; ++i) {
        y[i] = 0.5f * y[i] * (1.0f + std::erf(y[i] * static_cast<float>(M_SQRT1_2)));
      }
      return;
    case Activation::GeluTanh: {
      const float k_beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);  // sqrt(2/pi)
      for (std::int64_t i = 0; i < n; ++i) {
        const float x = y[i];
        y[i] = 0.5f * x * (1.0f + std::tanh(k_beta * (x + 0.044715f * x * x * x)));
      }
      return;
    }
    case Activation::Sigmoid:
      for (std::int64_t i = 0; i < n; ++i) {
        y[i] = 1.0f / (1.0f + std::exp(-y[i]));
      }
      return;
    case Activation::Tanh:
      for (std::int64_t i = 0; i < n; ++i) {
        y[i] = std::tanh(y[i]);
      }
      return;
  }
}

void maxpool2x2_portable(const float* x, std::int64_t planes, std::int64_t h, std::int64_t w, float* y) {
  const std::int64_t oh = h / 2, ow = w / 2;
  for (std::int64_t p = 0; p < planes; ++p) {
    for (std::int64_t oy = 0; oy < oh; ++oy) {
      const float* r0 = x + (p * h + 2 * oy) * w;
      const float* r1 = r0 + w;
      float* out = y + (p * oh + oy) * ow;
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        out[ox] = nanmax(nanmax(r0[2 * ox], r0[2 * ox + 1]), nanmax(r1[2 * ox], r1[2 * ox + 1]));
      }
    }
  }
}

namespace portable {

void igemm(const IgemmBlock& g) {
  constexpr std::int64_t nr = kIgemmNr;
  for (std::int64_t p0 = 0; p0 < g.n; p0 += nr) {
    float acc[4][nr] = {};
    const float* b = g.b + p0;
    for (std::int64_t k = 0; k < g.k; ++k) {
      const float* bk = b + g.off[k];
      const float* ak = g.a + k * 4;
      for (int r = 0; r < 4; ++r) {
        const float ar = ak[r];
        for (std::int64_t j = 0; j < nr; ++j) {
          acc[r][j] += ar * bk[j];
        }
      }
    }
    const std::int64_t width = std::min(nr, g.n - p0);
    for (int r = 0; r < g.rows; ++r) {
      float* c = g.c + r * g.ldc + p0;
      for (std::int64_t j = 0; j < width; ++j) {
        c[j] = acc[r][j] + g.bias[r];
      }
      apply_activation(g.act, c, width);
    }
  }
}

void gemv(const GemvBlock& g) {
  for (std::int64_t r = 0; r < g.rows; ++r) {
    const float* x = g.x + r * g.in;
    float* y = g.y + r * g.out;
    for (std::int64_t o = 0; o < g.out; ++o) {
      const float* w = g.w + o * g.in;
      float s = 0.0f;
      for (std::int64_t i = 0; i < g.in; ++i) {
        s += x[i] * w[i];
      }
      y[o] = s + g.bias[o];
    }
    apply_activation(g.act, y, g.out);
  }
}

}  // namespace portable
}  // namespace crucible::runtime::detail
