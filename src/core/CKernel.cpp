// CKernel.cpp — the kernel-kind table: one row per CKernel, in ordinal order (frozen ordinals).
#include "crucible/core/CKernel.h"

#include <cstddef>
#include <iterator>

#include "crucible/core/Contract.h"

namespace crucible {
namespace {

// Names are what plan texts and rules files spell ("POINTWISE_UNARY"); they are frozen with the
// ordinals. fusable_epilogue: the kernel can apply a pointwise chain to its output tile before
// writing it (one write instead of write + read + write). elementwise: one output element per
// input element position, so a chain of these fuses into one pass over memory.
constexpr CKernelInfo kCKernelTable[] = {
    {CKernel::Gemm, "GEMM", true, false},
    {CKernel::Conv, "CONV", true, false},
    {CKernel::PointwiseUnary, "POINTWISE_UNARY", false, true},
    {CKernel::PointwiseBinary, "POINTWISE_BINARY", false, true},
    {CKernel::Reduce, "REDUCE", false, false},
    {CKernel::Norm, "NORM", false, false},
    {CKernel::Softmax, "SOFTMAX", false, false},
    {CKernel::Embedding, "EMBEDDING", false, false},
    {CKernel::View, "VIEW", false, false},
    {CKernel::DataMovement, "DATA_MOVEMENT", false, false},
    {CKernel::Rng, "RNG", false, false},
    {CKernel::OptimizerUpdate, "OPTIMIZER_UPDATE", false, false},
    {CKernel::Collective, "COLLECTIVE", false, false},
    {CKernel::Loss, "LOSS", false, false},
    {CKernel::Pooling, "POOLING", false, false},
    {CKernel::Factory, "FACTORY", false, false},
    {CKernel::Opaque, "OPAQUE", false, false},
};

static_assert(std::size(kCKernelTable) == static_cast<std::size_t>(CKernel::kCount),
              "one kCKernelTable row per CKernel; append new kinds before kCount");

constexpr bool rows_in_ordinal_order() {
  for (std::size_t i = 0; i < std::size(kCKernelTable); ++i) {
    if (static_cast<std::size_t>(kCKernelTable[i].kind) != i) return false;
    if (kCKernelTable[i].name.empty()) return false;
  }
  return true;
}
static_assert(rows_in_ordinal_order(), "row i of kCKernelTable describes the kind with ordinal i");

}  // namespace

std::span<const CKernelInfo> ckernel_table() noexcept { return kCKernelTable; }

const CKernelInfo& ckernel_info(CKernel k) noexcept {
  const auto i = static_cast<std::size_t>(k);
  CRUCIBLE_PRE(i < std::size(kCKernelTable), "k is a CKernel other than kCount");
  return kCKernelTable[i < std::size(kCKernelTable) ? i
                                                    : static_cast<std::size_t>(CKernel::Opaque)];
}

}  // namespace crucible
