// AtenParallel.h — the CPU backend's split loops on ATen's intra-op threads (Note [Split loops],
// src/mimic/cpu/CpuBackend.cpp): a mimic::CpuBackendOptions::ParallelFn.
#pragma once

namespace crucible::vessel {

// Runs body(arg, i) for i in [0, parts) through at::parallel_for and returns when all are done.
void aten_parallel(void* ctx, unsigned parts, void (*body)(void* arg, unsigned part), void* arg);

}  // namespace crucible::vessel
