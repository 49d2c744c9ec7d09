// CpuTarget.h — the CPU code is generated for: triple, CPU name and the resolved feature string
// of the host, as LLVM detects them; and what the kernel cache keys an object by.
#pragma once

#include <string>
#include <string_view>

#include "crucible/core/ContentHash.h"

namespace crucible::mimic {

struct CpuTarget {
  std::string triple;    // "x86_64-pc-linux-gnu"
  std::string cpu;       // "znver3", "skylake-avx512"
  std::string features;  // every feature LLVM knows for the host, sorted: "+avx,+avx2,-avx512f,..."
  std::string llvm_version;
};

// The host, detected once per process (llvm::sys::getHostCPUName / getHostCPUFeatures).
const CpuTarget& host_target();

// True when every feature `features` enables ("+name") is enabled in `host`: code built for
// `features` runs here without an illegal instruction.
bool runs_on(std::string_view features, const CpuTarget& host);

// The kernel cache key: what is computed and everything that changes the machine code.
struct CpuKernelKey {
  std::string text;  // "mimic-cpu/3 content=... recipe=... triple=... cpu=... features=..."
  ContentHash hash;  // of text
};
CpuKernelKey cpu_kernel_key(const ContentHash& content, std::string_view recipe,
                            const CpuTarget& target, int opt_level);

// The features named in a key's text ("" when it names none).
std::string_view key_features(std::string_view key_text);

}  // namespace crucible::mimic
