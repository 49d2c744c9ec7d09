// status_old_abi_test.cpp — message_of compiled with the pre-C++11 std::string ABI beside
// Debian's Abseil (C++11 ABI), as the build for a torch 2.4-2.6 pip wheel is (Note [Old
// std::string ABI] in cmake/CrucibleDeps.cmake). No GoogleTest here: it is compiled with the
// other ABI. Exit status 0 when every message reads back as written.
#include <cstdio>
#include <string>

#include "crucible/core/Status.h"

static_assert(_GLIBCXX_USE_CXX11_ABI == 0, "this test is built with the old std::string ABI");

namespace {
int failures = 0;

void expect(const crucible::Status& s, const std::string& want) {
  const std::string got = crucible::message_of(s);
  if (got != want) {
    std::fprintf(stderr, "message_of: got \"%s\" (%zu bytes), want \"%s\" (%zu bytes)\n",
                 got.c_str(), got.size(), want.c_str(), want.size());
    ++failures;
  }
}
}  // namespace

int main() {
  expect(crucible::invalid_input("value must be positive, got -2", "pass a count >= 1"),
         "value must be positive, got -2; pass a count >= 1");
  expect(crucible::bad_state("a: b: c", "d"), "a: b: c; d");  // the message's own ": " kept
  expect(absl::InternalError(""), "");
  expect(absl::OkStatus(), "");
  const std::string longer(5000, 'x');  // past any small-string buffer of either layout
  expect(absl::ResourceExhaustedError(longer), longer);
  crucible::Result<int> r = crucible::unsupported("float16 sums", "use float32");
  expect(r.status(), "float16 sums; use float32");
  if (failures == 0) std::puts("message_of reads every message as written");
  return failures == 0 ? 0 : 1;
}
