// Cpu.h — which instruction set the runtime's compute kernels use (AVX2+FMA or portable C++).
//
// The GEMM/convolution microkernels exist twice: once written with AVX2+FMA intrinsics (compiled
// with -mavx2 -mfma in their own translation unit), once in plain C++ compiled for baseline
// x86-64 (or whatever the target is). The choice is made at run time from CPUID, so one binary
// runs everywhere and uses AVX2 where the CPU has it. Tests run every layer under both.
//
// The active ISA is process-wide (an atomic read once per kernel call). It starts as the best
// available one unless CRUCIBLE_RUNTIME_ISA=portable|avx2 says otherwise.
#pragma once

#include <cstdint>
#include <string_view>

#include "crucible/core/Status.h"

namespace crucible::runtime {

enum class Isa : std::uint8_t { Portable, Avx2Fma };

std::string_view isa_name(Isa isa) noexcept;  // "portable", "avx2"
bool isa_available(Isa isa) noexcept;         // CPUID (and OS support for the YMM state)
Isa best_isa() noexcept;
Isa current_isa() noexcept;
// Selects the ISA for every later kernel call; an ISA this CPU lacks is an error.
Status set_isa(Isa isa);

// The activation a layer applies to its output, fused into conv/linear epilogues.
enum class Activation : std::uint8_t { None, Relu, Gelu, GeluTanh, Sigmoid, Tanh };
std::string_view activation_name(Activation a) noexcept;

}  // namespace crucible::runtime
