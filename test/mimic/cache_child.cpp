// cache_child — a fresh process for the kernel cache tests: runs cache_chain with the disk cache
// in argv[1] and prints where its kernel came from. Exit 0 when the result is right.
#include <cstdio>

#include "cache_chain.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mimic_cache_child CACHE_DIR\n");
    return 2;
  }
  bool correct = false;
  auto stats = crucible::mimic::test::run_cache_chain(argv[1], &correct);
  if (!stats.ok()) {
    std::fprintf(stderr, "mimic_cache_child: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "compiled=%u disk_hits=%u memory_hits=%u rejected=%u correct=%d compile_ms=%.3f "
      "load_ms=%.3f\nproblem=%s\n",
      stats->compiled, stats->disk_hits, stats->memory_hits, stats->disk_rejected, correct ? 1 : 0,
      stats->compile_seconds * 1e3, stats->load_seconds * 1e3, stats->last_disk_problem.c_str());
  return correct ? 0 : 1;
}
