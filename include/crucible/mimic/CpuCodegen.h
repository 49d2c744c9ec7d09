// CpuCodegen.h — a pointwise program to a native object file, through LLVM: a contiguous loop
// (vectorized by LLVM for the target's features) and a strided loop, as two C functions.
//
// The two entry points, for a program whose symbol prefix is P:
//   void P_contig(char* const* ptrs, int64_t n, const uint64_t* params)
//     every operand is contiguous over the n elements, or broadcast (its one element);
//   void P_strided(char* const* ptrs, const int64_t* strides, int64_t n, const uint64_t* params)
//     operand k's element i is at ptrs[k] + i * strides[k] elements;
//   void P_contig_fused(...), as P_contig: only for a program with AddScaled/SubScaled, which it
//     rounds once (llvm.fma) where the two others round twice (Note [Pointwise programs]).
// ptrs[k] is operand k's element 0; params[j] holds parameter j in its dtype (a float in the
// low 4 bytes). Operands are distinct memory (Note [Pointwise programs]).
//
// Floating point: no fast-math flags, FP-op fusion Strict (no FMA contraction), so each
// instruction is the one IEEE operation the program names (BITEXACT_STRICT); the only fused
// multiply-adds are the explicit llvm.fma of P_contig_fused.
#pragma once

#include <cstdint>
#include <string>

#include "crucible/core/Status.h"
#include "crucible/mimic/CpuTarget.h"
#include "crucible/mimic/PointwiseProgram.h"

namespace crucible::mimic {

using ContigFn = void (*)(char* const* ptrs, std::int64_t n, const std::uint64_t* params);
using StridedFn = void (*)(char* const* ptrs, const std::int64_t* strides, std::int64_t n,
                           const std::uint64_t* params);

inline constexpr int kCpuOptLevel = 3;

// The object file's bytes, or an error naming what LLVM refused.
Result<std::string> compile_pointwise(const PointwiseProgram& program, const std::string& prefix,
                                      const CpuTarget& target);

}  // namespace crucible::mimic
