// AtenProvider.h — the exec stage's library calls performed by ATen (Note [ATen provider],
// AtenProvider.cpp): a plan's call, whose tensors the runner has placed, becomes one call of the
// recorded operator on tensors that wrap that memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "crucible/core/Status.h"
#include "crucible/exec/Backend.h"

namespace crucible::vessel {

struct AtenProviderStats {
  std::uint64_t calls = 0;
  std::uint64_t in_place = 0;  // the operator writes its own arguments (add_, an out= overload)
  std::uint64_t out_variant = 0;  // a functional operator run through its out= overload
  std::uint64_t copied = 0;  // no out= overload: the result is computed, then copied into place
};

class AtenProvider {
 public:
  AtenProvider();
  ~AtenProvider();
  AtenProvider(const AtenProvider&) = delete;
  AtenProvider& operator=(const AtenProvider&) = delete;

  // The exec::Provider over this object; it must outlive every Runner given it.
  exec::Provider provider();
  // Performs one call, or says why it cannot (an operator this torch lacks, an argument the
  // trace does not hold in full, ATen's own error).
  Status call(const exec::LibraryCall& c);
  const AtenProviderStats& stats() const { return stats_; }

  struct Resolved;

 private:
  Result<const Resolved*> resolve(std::string_view op);
  std::unordered_map<std::string, std::unique_ptr<Resolved>> ops_;
  AtenProviderStats stats_;
};

}  // namespace crucible::vessel
