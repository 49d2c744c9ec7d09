// Ir002.cpp — kernel template names (the strings rules name and plan texts print).
#include "crucible/forge/Ir002.h"

#include <array>

namespace crucible::forge {
namespace {

// Index = frozen KernelTemplate ordinal.
constexpr std::array<std::string_view, 11> kTemplateNames{
    "gemm_epilogue", "conv_epilogue", "pointwise_chain", "reduce", "norm", "softmax",
    "embedding",     "optimizer",     "collective",      "opaque", "view",
};
static_assert(kTemplateNames.size() == static_cast<std::size_t>(KernelTemplate::kCount),
              "one name per kernel template");

}  // namespace

std::string_view kernel_template_name(KernelTemplate t) noexcept {
  const auto i = static_cast<std::size_t>(t);
  return i < kTemplateNames.size() ? kTemplateNames[i] : std::string_view("unknown");
}

bool kernel_template_from_name(std::string_view name, KernelTemplate* out) noexcept {
  for (std::size_t i = 0; i < kTemplateNames.size(); ++i) {
    if (kTemplateNames[i] == name) {
      if (out != nullptr) *out = static_cast<KernelTemplate>(i);
      return true;
    }
  }
  return false;
}

}  // namespace crucible::forge
