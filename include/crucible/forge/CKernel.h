// CKernel.h — the kernel taxonomy every recorded ATen op is classified into (IR001's op kinds).
//
// The ordinals are frozen: they are written into plan texts and digests, so a new kind is appended
// before kCount, never inserted. The table (kCKernelTable in CKernel.cpp) is data with a
// static_assert'ed size; op names map to kinds through a second table (OpTable.cpp) whose every
// OPAQUE entry carries the reason it is opaque. An op missing from that table is classified
// OPAQUE with the reason "not in the op table" — reported, never guessed.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace crucible::forge {

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

// Classification of one ATen op by its qualified name ("aten::addmm" or "aten::add.Tensor": the
// overload is looked up first, then the base name).
struct OpClass {
  CKernel kind = CKernel::Opaque;
  std::string_view reason;  // non-empty exactly when kind == Opaque
};
OpClass classify_op(std::string_view qualified_name) noexcept;
// The reason classify_op gives an op the table does not have.
inline constexpr std::string_view kNotInOpTable = "not in the op table";

// Every entry of the op table, for tests and reports.
struct OpTableEntry {
  std::string_view name;
  CKernel kind;
  std::string_view reason;  // OPAQUE only
};
std::span<const OpTableEntry> op_table() noexcept;

}  // namespace crucible::forge
