// CpuTarget.cpp — feature checks and the kernel cache key (host detection is in CpuCodegen.cpp,
// beside the rest of what uses LLVM).
#include "crucible/mimic/CpuTarget.h"

#include <set>

namespace crucible::mimic {
namespace {

// The backend version: bump it whenever the generated code changes for the same program.
constexpr std::string_view kKeyVersion = "mimic-cpu/3";

std::set<std::string_view> enabled(std::string_view features) {
  std::set<std::string_view> r;
  while (!features.empty()) {
    const std::size_t comma = features.find(',');
    const std::string_view f = features.substr(0, comma);
    if (f.size() > 1 && f[0] == '+') r.insert(f.substr(1));
    if (comma == std::string_view::npos) break;
    features.remove_prefix(comma + 1);
  }
  return r;
}

}  // namespace

bool runs_on(std::string_view features, const CpuTarget& host) {
  const std::set<std::string_view> have = enabled(host.features);
  for (std::string_view f : enabled(features))
    if (!have.contains(f)) return false;
  return true;
}

CpuKernelKey cpu_kernel_key(const ContentHash& content, std::string_view recipe,
                            const CpuTarget& target, int opt_level) {
  CpuKernelKey k;
  k.text = std::string(kKeyVersion) + " content=" + content.hex() +
           " recipe=" + std::string(recipe) + " triple=" + target.triple + " cpu=" + target.cpu +
           " opt=" + std::to_string(opt_level) + " llvm=" + target.llvm_version +
           " features=" + target.features;
  k.hash = content_hash(k.text);
  return k;
}

std::string_view key_features(std::string_view key_text) {
  const std::size_t at = key_text.find(" features=");
  if (at == std::string_view::npos) return {};
  std::string_view rest = key_text.substr(at + 10);
  return rest.substr(0, rest.find(' '));
}

}  // namespace crucible::mimic
