// AtenMath.h — ATen's own vector exp and log for the CPU backend (Note [Vector math],
// include/crucible/mimic/CpuJit.h).
#pragma once

#include <string>

namespace crucible::vessel {

// Gives Mimic the SLEEF functions the libtorch in this process exports, at the width ATen's
// softmax kernels run at (its CPU capability: AVX512 64 bytes, AVX2 32). Once per process; later
// calls return the first answer. Returns "" when given, else why not (softmax then stays a
// library call, which is correct, only not generated).
const std::string& provide_aten_vector_math();

}  // namespace crucible::vessel
