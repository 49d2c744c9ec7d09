// Contract.cpp — the cold path of CRUCIBLE_PRE / POST / ASSERT.
#include "crucible/core/Contract.h"

#include <cstdio>
#include <cstdlib>

namespace crucible::contract {
namespace {
std::atomic<std::uint64_t> g_observed{0};

void print(const char* tag, const Violation& v) noexcept {
  std::fprintf(stderr, "crucible: %s %s violated: (%s) at %s:%d: %s\n", tag, v.kind, v.clause,
               v.file, v.line, v.message ? v.message : "");
  std::fflush(stderr);
}
}  // namespace

void violated(Semantic semantic, const Violation& v, std::atomic<bool>* site_logged) noexcept {
  switch (semantic) {
    case Semantic::Enforce:
      print("fatal:", v);
      std::abort();
    case Semantic::Observe:
      g_observed.fetch_add(1, std::memory_order_relaxed);
      if (site_logged == nullptr || !site_logged->exchange(true, std::memory_order_relaxed)) {
        print("observed:", v);
      }
      return;
    case Semantic::Ignore:
      return;
  }
}

std::uint64_t observed_count() noexcept { return g_observed.load(std::memory_order_relaxed); }

}  // namespace crucible::contract
