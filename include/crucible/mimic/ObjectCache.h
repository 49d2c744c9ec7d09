// ObjectCache.h — the kernel cache's second level: object files on disk, one per key, shared
// by every process of the user.
//
// An entry is <dir>/<key hash>.cko: a header (magic, format version, the full key text, the
// body's length and its XXH3-128) and the object file. Writes go to a temporary file in the
// same directory, then rename(2) onto the entry's name: a reader sees no entry or a whole one,
// and several processes may write the same entry at once (the last rename wins; both are
// equal). A load checks the header against the key it wants (which names the target CPU's
// features) and the body against its checksum; an entry that fails is removed and reported as
// rejected, and the caller compiles again. An entry whose features this CPU lacks is rejected
// before its body is checked. Removal is by name: a process rejecting a bad entry may remove a
// good one another process renamed there a moment before; the next process compiles it again.
//
// Threads: an ObjectCache is immutable after open(); load and store may run on any threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "crucible/core/Status.h"
#include "crucible/mimic/CpuTarget.h"

namespace crucible::mimic {

// CRUCIBLE_CACHE_DIR, else $XDG_CACHE_HOME/crucible, else $HOME/.cache/crucible; empty when
// none of them is set.
std::string default_cache_dir();

class ObjectCache {
 public:
  // Creates `dir` (and its parents) if needed. Errors: a directory that cannot be made.
  static Result<ObjectCache> open(std::string dir);

  enum class Outcome : std::uint8_t { Hit, Miss, Rejected };
  struct Loaded {
    Outcome outcome = Outcome::Miss;
    std::string object;  // Hit: the object file
    std::string why;     // Rejected: what was wrong with the entry
  };
  // Never an error: an unreadable or bad entry is a miss or a rejection (and is removed).
  Loaded load(const CpuKernelKey& key, const CpuTarget& host) const;
  // Errors: the temporary file cannot be written or renamed (disk full, permissions).
  Status store(const CpuKernelKey& key, const std::string& object) const;

  std::string path_of(const CpuKernelKey& key) const;
  const std::string& dir() const { return dir_; }

 private:
  explicit ObjectCache(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace crucible::mimic
