// Status.h — errors are values: absl::Status / absl::StatusOr with a house convention.
//
// Every error a user can see says what is wrong and what to do about it. The helpers below
// build such messages in one shape: "<what is wrong>; <what to do>". Use them at API
// boundaries; internal code may return any absl::Status.
#pragma once

#include <cstring>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include <string>

namespace crucible {

using Status = absl::Status;
template <class T>
using Result = absl::StatusOr<T>;

// Abseil here is built with its own absl::string_view (not std::), so messages are joined
// as std::string.
inline std::string join_(std::string_view what, std::string_view fix) {
  std::string m(what);
  m += "; ";
  m += fix;
  return m;
}

inline Status ok_status() { return absl::OkStatus(); }

// A status's message. Every source reads it through this, never through Status::message():
// that accessor is inline and reads the std::string Abseil's compiled code wrote, which a build
// for a torch of the old std::string ABI would read with the other layout (Note [Old
// std::string ABI] in cmake/CrucibleDeps.cmake). The test core_status_message_lint checks.
std::string message_of(const Status& s);

// Input the caller gave is malformed or out of range (a corrupt file, a bad argument).
inline Status invalid_input(std::string_view what, std::string_view fix) {
  return absl::InvalidArgumentError(join_(what, fix));
}
// A request that is well formed but not supported (yet, or on this build/machine).
inline Status unsupported(std::string_view what, std::string_view fix) {
  return absl::UnimplementedError(join_(what, fix));
}
// A limit of the machine or of a configured budget would be exceeded.
inline Status exhausted(std::string_view what, std::string_view fix) {
  return absl::ResourceExhaustedError(join_(what, fix));
}
// The system is in a state where the call cannot proceed (not enabled, already enabled, ...).
inline Status bad_state(std::string_view what, std::string_view fix) {
  return absl::FailedPreconditionError(join_(what, fix));
}
// An OS call failed; `what` names the call and the path or object.
inline Status os_error(std::string_view what, int errnum) {
  return absl::UnavailableError(
      std::string(what) + ": " + std::strerror(errnum) + " (errno " + std::to_string(errnum) + ")");
}

}  // namespace crucible

// Propagate a non-OK status from an expression.
#define CRUCIBLE_RETURN_IF_ERROR(expr)                    \
  do {                                                    \
    ::crucible::Status crucible_status_ = (expr);         \
    if (!crucible_status_.ok()) return crucible_status_;  \
  } while (0)
