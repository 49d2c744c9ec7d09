// ModuleTree.cpp — splitting a module table's paths into scopes, once.
#include "crucible/record/ModuleTree.h"

#include <algorithm>
#include <numeric>

namespace crucible::record {

ModuleTree::ModuleTree(std::span<const std::string> paths) {
  scopes_begin_.reserve(paths.size() + 1);
  for (std::size_t id = 0; id < paths.size(); ++id) {
    scopes_begin_.push_back(scope_ids_.size());
    const std::string_view p = paths[id];
    path_bytes_ += p.size();
    std::shared_ptr<const std::string> owner;  // made when the path opens a scope not seen yet
    // Components end at each '.' after the first character (a leading '.' belongs to the first).
    for (std::size_t start = 0; !p.empty() && start <= p.size();) {
      std::size_t dot = p.find('.', start == 0 ? 1 : start);
      if (dot == std::string_view::npos) dot = p.size();
      auto it = by_path_.find(p.substr(0, dot));
      if (it == by_path_.end()) {
        if (!owner) owner = std::make_shared<const std::string>(p);
        const auto scope = static_cast<std::uint32_t>(scopes_.size());
        scopes_.push_back(Scope{owner, dot, 0, 0});
        it = by_path_.emplace(std::string_view(*owner).substr(0, dot), scope).first;
      }
      if (dot == p.size() && scopes_[it->second].label == 0)
        scopes_[it->second].label = static_cast<std::uint32_t>(id);
      scope_ids_.push_back(it->second);
      start = dot + 1;
    }
  }
  scopes_begin_.push_back(scope_ids_.size());
  std::vector<std::uint32_t> by_rank(scopes_.size());
  std::iota(by_rank.begin(), by_rank.end(), 0u);
  std::sort(by_rank.begin(), by_rank.end(),
            [&](std::uint32_t a, std::uint32_t b) { return path(a) < path(b); });
  for (std::size_t r = 0; r < by_rank.size(); ++r)
    scopes_[by_rank[r]].rank = static_cast<std::uint32_t>(r);
}

bool ModuleTree::fits(std::span<const std::string> paths) const {
  if (paths.size() != num_paths()) return false;
  std::size_t bytes = 0;
  for (const std::string& p : paths) bytes += p.size();
  return bytes == path_bytes_;
}

std::uint32_t ModuleTree::label_of(std::string_view path) const {
  const auto it = by_path_.find(path);
  return it == by_path_.end() ? 0 : scopes_[it->second].label;
}

}  // namespace crucible::record
