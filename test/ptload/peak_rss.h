// peak_rss.h — this process's peak resident memory, for tests that bound what a refusal costs.
#pragma once

#include <sys/resource.h>

#include <cstdint>

namespace crucible::ptload::test {

// Peak resident memory of this process so far, in bytes. ctest runs each test case in its own
// process, so a test's growth over its start is what that test allocated.
inline std::uint64_t peak_rss() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

}  // namespace crucible::ptload::test
