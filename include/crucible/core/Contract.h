// Contract.h — CRUCIBLE_PRE / CRUCIBLE_POST / CRUCIBLE_ASSERT with a semantic chosen per build.
//
// The semantic comes from CRUCIBLE_CONTRACT_SEMANTIC, which each preset sets (CMake option
// CRUCIBLE_CONTRACTS):
//   2 enforce  print clause, file:line and message to stderr, then abort()   (default, verify)
//   1 observe  print once per call site, count every violation, continue     (release)
//   0 ignore   the condition is not evaluated at all                         (opt-in only)
// The macro reads CRUCIBLE_CONTRACT_SEMANTIC where it is expanded, so one translation unit can
// pick another semantic by defining it before this header (the contract tests do).
//
// Cost: enforce/observe add one well-predicted branch per clause; the violation path is a
// cold out-of-line call. Observe keeps one std::atomic<bool> per call site for "logged once".
#pragma once

#include <atomic>
#include <cstdint>

namespace crucible::contract {

enum class Semantic : std::uint8_t { Ignore = 0, Observe = 1, Enforce = 2 };

struct Violation {
  const char* kind;    // "precondition", "postcondition", "assertion"
  const char* clause;  // the condition as written
  const char* file;
  int line;
  const char* message; // what the caller should know or do
};

// Reports a violation with the given semantic. Enforce never returns.
// `site_logged` is the call site's flag so observe prints only the first time.
[[gnu::cold]] void violated(Semantic semantic, const Violation& v,
                            std::atomic<bool>* site_logged) noexcept;

// Violations observed (semantic Observe) since process start, all sites together.
std::uint64_t observed_count() noexcept;

}  // namespace crucible::contract

#ifndef CRUCIBLE_CONTRACT_SEMANTIC
#define CRUCIBLE_CONTRACT_SEMANTIC 2
#endif

#define CRUCIBLE_CONTRACT_CHECK_(kind, cond, msg)                                          \
  do {                                                                                     \
    if constexpr (CRUCIBLE_CONTRACT_SEMANTIC != 0) {                                       \
      if (!(cond)) [[unlikely]] {                                                          \
        static std::atomic<bool> crucible_site_logged_{false};                            \
        ::crucible::contract::violated(                                                    \
            static_cast<::crucible::contract::Semantic>(CRUCIBLE_CONTRACT_SEMANTIC),      \
            ::crucible::contract::Violation{kind, #cond, __FILE__, __LINE__, msg},        \
            &crucible_site_logged_);                                                       \
      }                                                                                    \
    } else {                                                                               \
      (void)sizeof(!(cond)); /* keeps the clause compiling, never evaluates it */         \
    }                                                                                      \
  } while (0)

// Precondition: what the caller must guarantee on entry.
#define CRUCIBLE_PRE(cond, msg) CRUCIBLE_CONTRACT_CHECK_("precondition", cond, msg)
// Postcondition: what the function guarantees on exit; place it before the return.
#define CRUCIBLE_POST(cond, msg) CRUCIBLE_CONTRACT_CHECK_("postcondition", cond, msg)
// Internal invariant.
#define CRUCIBLE_ASSERT(cond, msg) CRUCIBLE_CONTRACT_CHECK_("assertion", cond, msg)
