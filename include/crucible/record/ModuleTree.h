// ModuleTree.h — the module scopes of a module table, worked out once per table.
//
// A scope is a module path, or a prefix of one that ends before a '.' (components end at each
// '.' after the first character: ".a" is one component, "a..b" opens "a", "a." and "a..b"). A
// module runs inside every scope on its path, and the Merkle DAG's module regions are the runs
// of consecutive nodes inside one scope. Scopes depend on the table's strings alone, and the
// recorder's table only grows, so the recorder builds the tree once per table it hands out
// (Trace::module_tree) instead of every iteration build splitting, hashing and sorting the same
// strings again: resnet18's Merkle DAG took 40.5 us that way and 22.5 us with the recorder's
// tree (a loop over one saved trace; 32 us when the build makes the tree from the table).
//
// Immutable once built: shared between threads without locking. It owns copies of the paths
// it needs (Region::path_owner points into them), never the caller's strings.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace crucible::record {

class ModuleTree {
 public:
  // From a module table: module id -> path ("" for id 0, which opens no scope).
  explicit ModuleTree(std::span<const std::string> paths);

  std::size_t num_paths() const { return scopes_begin_.size() - 1; }
  // Whether this tree may describe `paths`: as many paths, of as many bytes in all. A cheap
  // guard (a sum per build), not a proof: it catches a table grown, cut or renamed to other
  // lengths since the tree was made, not one edited in place to the same lengths.
  bool fits(std::span<const std::string> paths) const;
  std::uint32_t num_scopes() const { return static_cast<std::uint32_t>(scopes_.size()); }
  // The scopes module `id` runs inside, outermost first; none for "" or an id past the table.
  std::span<const std::uint32_t> scopes_of(std::uint32_t id) const {
    if (id >= num_paths()) return {};
    return {scope_ids_.data() + scopes_begin_[id], scopes_begin_[id + 1] - scopes_begin_[id]};
  }
  // The scope's place among all scopes sorted by path (std::string_view order).
  std::uint32_t rank(std::uint32_t scope) const { return scopes_[scope].rank; }
  // The first module id whose path is exactly the scope's, 0 if none (a parent scope that was
  // never entered itself).
  std::uint32_t label(std::uint32_t scope) const { return scopes_[scope].label; }
  // label() of the scope with this path; 0 when no scope has it.
  std::uint32_t label_of(std::string_view path) const;
  // The path is the first path_len() bytes of *owner(): a copy of the first module path that
  // opened the scope, shared by every scope that path opened.
  const std::shared_ptr<const std::string>& owner(std::uint32_t scope) const { return scopes_[scope].owner; }
  std::size_t path_len(std::uint32_t scope) const { return scopes_[scope].len; }
  std::string_view path(std::uint32_t scope) const {
    return std::string_view(*scopes_[scope].owner).substr(0, scopes_[scope].len);
  }

 private:
  struct Scope {
    std::shared_ptr<const std::string> owner;
    std::size_t len = 0;
    std::uint32_t label = 0;
    std::uint32_t rank = 0;
  };
  std::vector<Scope> scopes_;
  std::vector<std::uint32_t> scope_ids_;     // every module's scopes, module after module
  std::vector<std::size_t> scopes_begin_;    // module id -> its first entry in scope_ids_
  std::size_t path_bytes_ = 0;               // the table's bytes in all (fits)
  absl::flat_hash_map<std::string_view, std::uint32_t> by_path_;  // views into the owners
};

}  // namespace crucible::record
