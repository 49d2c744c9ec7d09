// MicrokernelsAvx2.cpp — the implicit-GEMM and GEMV kernels with AVX2+FMA intrinsics.
//
// Built with -mavx2 -mfma (CMakeLists.txt); only called after Cpu.cpp found both in CPUID.
// igemm keeps a 4 x 24 tile in 12 YMM accumulators: per k it loads 3 vectors of positions and
// broadcasts 4 weights, 12 FMAs for 7 loads, so the two FMA pipes are the limit, not the loads.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "Microkernels.h"

namespace crucible::runtime::detail::avx2 {

void igemm(const IgemmBlock& g) {
  constexpr std::int64_t nr = kIgemmNr;
  static_assert(nr == 24, "the tile below is 4 x 3 vectors of 8");
  const __m256 zero = _mm256_setzero_ps();
  for (std::int64_t p0 = 0; p0 < g.n; p0 += nr) {
    __m256 c00 = zero, c01 = zero, c02 = zero;
    __m256 c10 = zero, c11 = zero, c12 = zero;
    __m256 c20 = zero, c21 = zero, c22 = zero;
    __m256 c30 = zero, c31 = zero, c32 = zero;
    const float* b = g.b + p0;
    const float* a = g.a;
    const std::ptrdiff_t* off = g.off;
    for (std::int64_t k = 0; k < g.k; ++k, a += 4) {
      const float* bk = b + off[k];
      const __m256 b0 = _mm256_loadu_ps(bk);
      const __m256 b1 = _mm256_loadu_ps(bk + 8);
      const __m256 b2 = _mm256_loadu_ps(bk + 16);
      __m256 ar = _mm256_broadcast_ss(a + 0);
      c00 = _mm256_fmadd_ps(ar, b0, c00);
      c01 = _mm256_fmadd_ps(ar, b1, c01);
      c02 = _mm256_fmadd_ps(ar, b2, c02);
      ar = _mm256_broadcast_ss(a + 1);
      c10 = _mm256_fmadd_ps(ar, b0, c10);
      c11 = _mm256_fmadd_ps(ar, b1, c11);
      c12 = _mm256_fmadd_ps(ar, b2, c12);
      ar = _mm256_broadcast_ss(a + 2);
      c20 = _mm256_fmadd_ps(ar, b0, c20);
      c21 = _mm256_fmadd_ps(ar, b1, c21);
      c22 = _mm256_fmadd_ps(ar, b2, c22);
      ar = _mm256_broadcast_ss(a + 3);
      c30 = _mm256_fmadd_ps(ar, b0, c30);
      c31 = _mm256_fmadd_ps(ar, b1, c31);
      c32 = _mm256_fmadd_ps(ar, b2, c32);
    }
    __m256 tile[4][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32}};
    const bool relu = g.act == Activation::Relu;
    for (int r = 0; r < 4; ++r) {
      const __m256 bias = _mm256_broadcast_ss(g.bias + r);
      for (int j = 0; j < 3; ++j) {
        tile[r][j] = _mm256_add_ps(tile[r][j], bias);
        // max(0, x) returns x when x is NaN (the second operand): NaN propagates like torch.relu.
        if (relu) tile[r][j] = _mm256_max_ps(zero, tile[r][j]);
      }
    }
    const std::int64_t width = std::min(nr, g.n - p0);
    for (int r = 0; r < g.rows; ++r) {
      float* c = g.c + r * g.ldc + p0;
      if (width == nr) {
        _mm256_storeu_ps(c, tile[r][0]);
        _mm256_storeu_ps(c + 8, tile[r][1]);
        _mm256_storeu_ps(c + 16, tile[r][2]);
      } else {
        alignas(32) float tmp[nr];
        _mm256_store_ps(tmp, tile[r][0]);
        _mm256_store_ps(tmp + 8, tile[r][1]);
        _mm256_store_ps(tmp + 16, tile[r][2]);
        std::memcpy(c, tmp, static_cast<std::size_t>(width) * sizeof(float));
      }
      if (!relu) apply_activation(g.act, c, width);
    }
  }
}

namespace {
float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
}  // namespace

void gemv(const GemvBlock& g) {
  const std::int64_t in = g.in;
  const std::int64_t in8 = in & ~std::int64_t{7};
  for (std::int64_t r = 0; r < g.rows; ++r) {
    const float* x = g.x + r * in;
    float* y = g.y + r * g.out;
    std::int64_t o = 0;
    // Four outputs at a time: each x vector is loaded once for four weight rows.
    for (; o + 4 <= g.out; o += 4) {
      const float* w0 = g.w + o * in;
      const float* w1 = w0 + in;
      const float* w2 = w1 + in;
      const float* w3 = w2 + in;
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (std::int64_t i = 0; i < in8; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), xv, s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), xv, s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), xv, s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), xv, s3);
      }
      float t0 = hsum(s0), t1 = hsum(s1), t2 = hsum(s2), t3 = hsum(s3);
      for (std::int64_t i = in8; i < in; ++i) {
        t0 += w0[i] * x[i];
        t1 += w1[i] * x[i];
        t2 += w2[i] * x[i];
        t3 += w3[i] * x[i];
      }
      y[o] = t0 + g.bias[o];
      y[o + 1] = t1 + g.bias[o + 1];
      y[o + 2] = t2 + g.bias[o + 2];
      y[o + 3] = t3 + g.bias[o + 3];
    }
    for (; o < g.out; ++o) {
      const float* w0 = g.w + o * in;
      __m256 s0 = _mm256_setzero_ps();
      for (std::int64_t i = 0; i < in8; i += 8) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), _mm256_loadu_ps(x + i), s0);
      }
      float t0 = hsum(s0);
      for (std::int64_t i = in8; i < in; ++i) t0 += w0[i] * x[i];
      y[o] = t0 + g.bias[o];
    }
    apply_activation(g.act, y, g.out);
  }
}

namespace {
// _mm256_max_ps(a, b) returns b when either is NaN; blending a back where a is NaN makes any NaN
// win, as in torch.max_pool2d.
inline __m256 nanmax(__m256 a, __m256 b) {
  return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}
}  // namespace

void maxpool2x2(const float* x, std::int64_t planes, std::int64_t h, std::int64_t w, float* y) {
  const std::int64_t oh = h / 2, ow = w / 2;
  for (std::int64_t p = 0; p < planes; ++p) {
    for (std::int64_t oy = 0; oy < oh; ++oy) {
      const float* r0 = x + (p * h + 2 * oy) * w;
      const float* r1 = r0 + w;
      float* out = y + (p * oh + oy) * ow;
      std::int64_t ox = 0;
      for (; ox + 8 <= ow; ox += 8) {
        // Rows max'ed first (16 inputs -> 16), then even/odd columns split per 128-bit lane and
        // max'ed (-> 8, lane-interleaved), then the 64-bit quarters put back in order.
        const __m256 v0 = nanmax(_mm256_loadu_ps(r0 + 2 * ox), _mm256_loadu_ps(r1 + 2 * ox));
        const __m256 v1 = nanmax(_mm256_loadu_ps(r0 + 2 * ox + 8), _mm256_loadu_ps(r1 + 2 * ox + 8));
        const __m256 even = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
        const __m256 odd = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
        const __m256 m = nanmax(even, odd);
        _mm256_storeu_ps(out + ox, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(m),
                                                                           _MM_SHUFFLE(3, 1, 2, 0))));
      }
      for (; ox < ow; ++ox) {
        out[ox] = detail::nanmax(detail::nanmax(r0[2 * ox], r0[2 * ox + 1]),
                                 detail::nanmax(r1[2 * ox], r1[2 * ox + 1]));
      }
    }
  }
}

}  // namespace crucible::runtime::detail::avx2
