// dispatch_conflict_test.cpp — another library already owns the dispatch key: install()
// refuses with a message that names the key and says what to do.
#include <gtest/gtest.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "Dispatch.h"

namespace {
void foreign(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER,
                                              c10::DispatchKey::TESTING_ONLY_GenericMode), stack);
}

TEST(DispatchConflict, ForeignFallbackOnTheKeyIsRefused) {
  if (std::string(crucible::vessel::dispatch_key_name()) != "TESTING_ONLY_GenericMode")
    GTEST_SKIP() << "patched PyTorch: Crucible has its own key";
  torch::Library other(torch::Library::IMPL, "_", c10::DispatchKey::TESTING_ONLY_GenericMode,
                       __FILE__, __LINE__);
  other.fallback(torch::CppFunction::makeFromBoxedFunction<&foreign>());
  const crucible::Status st = crucible::vessel::install();
  ASSERT_FALSE(st.ok());
  const std::string msg(st.message());
  EXPECT_NE(msg.find("another library already holds that key"), std::string::npos) << msg;
  EXPECT_NE(msg.find("TESTING_ONLY_GenericMode"), std::string::npos) << msg;
  EXPECT_FALSE(crucible::vessel::installed());
}
}  // namespace
