// Microkernels.h — the compute kernels that exist once per ISA (internal to the runtime stage).
//
// MicrokernelsPortable.cpp is plain C++ compiled for the baseline target; MicrokernelsAvx2.cpp is
// the same arithmetic with AVX2+FMA intrinsics, compiled with -mavx2 -mfma and called only when
// CPUID says the CPU has both (see Cpu.cpp). Conv2d/Linear pick one through the dispatchers here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "crucible/runtime/Cpu.h"

namespace crucible::runtime::detail {

// One block of 4 output rows of an implicit GEMM (Note [Implicit GEMM] in Conv2d.h):
//   c[r*ldc + p] = act(bias[r] + sum_k a[k*4 + r] * b[off[k] + p])   for r < rows, p < n.
// Positions are computed 24 at a time; for the last partial block the kernel reads b up to
// off[k] + round_up(n, 24) - 1, which the caller keeps in bounds (zero slack), and writes only
// p < n. rows (1..4) is how many of the 4 packed rows are real.
struct IgemmBlock {
  const float* a = nullptr;            // [k][4]
  const std::ptrdiff_t* off = nullptr;  // [k]
  std::int64_t k = 0;
  const float* b = nullptr;
  std::int64_t n = 0;
  const float* bias = nullptr;  // [4]
  Activation act = Activation::None;
  int rows = 4;
  float* c = nullptr;
  std::int64_t ldc = 0;
};
inline constexpr std::int64_t kIgemmNr = 24;

// y[r][o] = act(bias[o] + sum_i x[r][i] * w[o][i]) for r < rows.
struct GemvBlock {
  const float* x = nullptr;
  std::int64_t rows = 0, in = 0, out = 0;
  const float* w = nullptr;  // [out][in]
  const float* bias = nullptr;  // [out]
  Activation act = Activation::None;
  float* y = nullptr;
};

// max that returns NaN when either operand is NaN (torch.max_pool2d's rule); both ISAs' tails.
inline float nanmax(float a, float b) { return (a > b || a != a) ? a : b; }

// torch.nn.MaxPool2d(2) (kernel 2, stride 2, no padding, floor mode) on [planes, h, w]: the
// pooling every small CNN uses, worth a kernel of its own (10x the general loop). NaN wins, as in
// PyTorch's kernel.
void maxpool2x2_portable(const float* x, std::int64_t planes, std::int64_t h, std::int64_t w, float* y);

namespace portable {
void igemm(const IgemmBlock& g);
void gemv(const GemvBlock& g);
inline void maxpool2x2(const float* x, std::int64_t planes, std::int64_t h, std::int64_t w, float* y) {
  maxpool2x2_portable(x, planes, h, w, y);
}
}  // namespace portable
namespace avx2 {
void igemm(const IgemmBlock& g);
void gemv(const GemvBlock& g);
void maxpool2x2(const float* x, std::int64_t planes, std::int64_t h, std::int64_t w, float* y);
}  // namespace avx2

inline void maxpool2x2(const float* x, std::int64_t planes, std::int64_t h, std::int64_t w, float* y) {
  if (current_isa() == Isa::Avx2Fma) {
    avx2::maxpool2x2(x, planes, h, w, y);
  } else {
    portable::maxpool2x2(x, planes, h, w, y);
  }
}

inline void igemm(const IgemmBlock& g) {
  if (current_isa() == Isa::Avx2Fma) {
    avx2::igemm(g);
  } else {
    portable::igemm(g);
  }
}
inline void gemv(const GemvBlock& g) {
  if (current_isa() == Isa::Avx2Fma) {
    avx2::gemv(g);
  } else {
    portable::gemv(g);
  }
}

// Scalar activation over n floats in place (shared by both ISAs: erf/exp/tanh come from libm so
// that results match PyTorch's to about one ulp whichever ISA computed the sums).
void apply_activation(Activation act, float* y, std::int64_t n);

}  // namespace crucible::runtime::detail
