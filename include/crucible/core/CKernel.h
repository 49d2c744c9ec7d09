// CKernel.h — the kernel taxonomy every recorded ATen op is classified into (the op kinds that
// the graph, Forge and the execution plan share).
//
// The ordinals are frozen: they are written into plan texts and digests, so a new kind is appended
// before kCount, never inserted. The table (kCKernelTable in CKernel.cpp) is data with a
// static_assert'ed size; op names map to kinds through the op table (OpTable.h).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace crucible {

enum class CKernel : std::uint8_t {
  Gemm = 0,             // mm, addmm, bmm, matmul pieces, linear's backward mms
  Conv = 1,             // convolution forward / backward
  PointwiseUnary = 2,   // relu, gelu, exp, neg, copies with a dtype change, ...
  PointwiseBinary = 3,  // add, mul, div, where, threshold_backward, ...
  Reduce = 4,           // sum, mean, max, argmax, ...
  Norm = 5,             // batch/layer norm forward and backward
  Softmax = 6,          // softmax, log_softmax and their backwards
  Embedding = 7,        // embedding, embedding_dense_backward, index_select
  View = 8,             // aliasing ops: view, t, transpose, expand, as_strided, ...
  DataMovement = 9,     // copies that move bytes: clone, contiguous, cat, stack, permute+copy
  Rng = 10,             // random draws: dropout masks, bernoulli, normal_, uniform_
  OptimizerUpdate = 11, // optimizer arithmetic (foreach / fused / in-place updates in phase Opt)
  Collective = 12,      // all_reduce & co. (none in single-process traces)
  Loss = 13,            // nll_loss, mse_loss, ... forward and backward
  Pooling = 14,         // max/avg pooling forward and backward
  Factory = 15,         // zeros, ones, empty, fill_, zero_, scalar_tensor
  Opaque = 16,          // runs op by op; every use has a reason
  kCount = 17,
};

struct CKernelInfo {
  CKernel kind;
  std::string_view name;    // "GEMM", "CONV", ... (what plan texts print)
  bool fusable_epilogue;    // may absorb a following pointwise chain (GEMM, CONV)
  bool elementwise;         // may be fused into a pointwise chain
};
std::span<const CKernelInfo> ckernel_table() noexcept;
const CKernelInfo& ckernel_info(CKernel k) noexcept;

}  // namespace crucible
