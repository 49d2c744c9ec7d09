// Cse.cpp — common-subexpression elimination: two pure nodes with the same op, the same input
// values and the same scalar arguments compute the same outputs, so the later one is removed and
// its users read the earlier one's outputs (e.g. the backward pass transposing a weight the
// forward pass already transposed).
//
// Pure here means: no mutation, not in place, not RNG / OPAQUE / factory / collective (a factory
// like empty() returns fresh memory that is then written in place: two of them are not
// interchangeable), no output written in place later, and no output live-out (Python may hold
// both tensors and tell them apart).
#include <map>
#include <tuple>

#include "IrEdit.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {

Result<Ir001> cse(Ir001 ir, PassContext& ctx) {
  ctx.start("cse", ir.nodes.size());
  std::vector<bool> written_later(ir.values.size(), false);
  for (const Node& n : ir.nodes) {
    if ((n.mutates || n.in_place) && !n.inputs.empty()) written_later[n.inputs[0]] = true;
  }
  using Key = std::tuple<std::string, std::vector<std::uint32_t>, std::vector<std::uint64_t>>;
  std::map<Key, std::uint32_t> seen;
  std::vector<bool> keep(ir.nodes.size(), true);
  for (std::size_t i = 0; i < ir.nodes.size(); ++i) {
    if (ctx.over()) break;
    const Node& n = ir.nodes[i];
    if (n.mutates || n.in_place || n.kind == CKernel::Rng || n.kind == CKernel::Opaque ||
        n.kind == CKernel::Factory || n.kind == CKernel::Collective || n.outputs.empty()) {
      continue;
    }
    bool pure = true;
    for (std::uint32_t v : n.outputs) pure &= !written_later[v] && !ir.values[v].live_out;
    if (!pure) continue;
    std::vector<std::uint64_t> sc;
    for (const record::ScalarRecord& s : n.scalars) {
      sc.push_back(static_cast<std::uint64_t>(s.kind) | std::uint64_t{s.arg_index} << 8 |
                   std::uint64_t{s.aux} << 24);
      sc.push_back(s.bits);
    }
    Key key{n.op, n.inputs, std::move(sc)};
    auto [it, inserted] = seen.emplace(std::move(key), static_cast<std::uint32_t>(i));
    if (inserted) continue;
    const Node& first = ir.nodes[it->second];
    if (first.outputs.size() != n.outputs.size()) continue;
    for (std::size_t k = 0; k < n.outputs.size(); ++k) detail::replace_uses(ir, n.outputs[k], first.outputs[k]);
    keep[i] = false;
  }
  Ir001 out = detail::compact(ir, keep);
  ctx.finish(out.nodes.size());
  return out;
}

}  // namespace crucible::forge
