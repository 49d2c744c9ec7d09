// AtenParallel.cpp — see AtenParallel.h.
//
// This file alone is compiled with -fopenmp: at::parallel_for is a header template that runs its
// body serially in a translation unit built without OpenMP (ParallelOpenMP.h defines
// INTRA_OP_PARALLEL only under _OPENMP). Built with it, its `omp parallel` calls the libgomp
// already in the process — torch's wheel ships one under the same soname, libgomp.so.1, which
// the loader reuses — so generated loops run on the threads ATen's kernels use, and neither
// pool spins on a core the other needs.
#include "AtenParallel.h"

#include <ATen/Parallel.h>

#ifndef _OPENMP
#error "AtenParallel.cpp must be compiled with -fopenmp (vessel/torch/CMakeLists.txt)"
#endif

namespace crucible::vessel {

void aten_parallel(void*, unsigned parts, void (*body)(void* arg, unsigned part), void* arg) {
  at::parallel_for(0, parts, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) body(arg, static_cast<unsigned>(i));
  });
}

}  // namespace crucible::vessel
