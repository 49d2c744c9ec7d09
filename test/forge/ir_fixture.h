// ir_fixture.h — hand-built IR001 graphs and in-memory rules for the fuse, lower, digest and
// report tests (no trace, no recorder: every field is set directly).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "crucible/forge/Ir001.h"
#include "crucible/forge/Rules.h"

namespace crucible::forge::test {

class IrFixture {
 public:
  IrFixture() {
    ir.pool = pool_.get();
    ir.module_paths = {""};
  }
  IrFixture(const IrFixture&) = delete;
  IrFixture& operator=(const IrFixture&) = delete;

  Ir001 ir;

  ExprPool& pool() { return *pool_; }

  // An external value (batch input, parameter, ...) with its own storage; float32 unless told.
  std::uint32_t input(std::vector<std::int64_t> shape,
                      record::ExternalKind kind = record::ExternalKind::Input,
                      std::int8_t dtype = 6) {
    Value v = make(shape, dtype);
    v.external = static_cast<std::uint8_t>(kind);
    ir.values.push_back(std::move(v));
    return static_cast<std::uint32_t>(ir.values.size() - 1);
  }

  // A node reading `ins` and writing one fresh value per shape in `outs`; returns the node id.
  std::uint32_t node(std::string op, CKernel kind, std::vector<std::uint32_t> ins,
                     std::vector<std::vector<std::int64_t>> outs,
                     record::Phase phase = record::Phase::Forward, std::int8_t dtype = 6) {
    Node n;
    n.op = std::move(op);
    n.kind = kind;
    if (kind == CKernel::Opaque) n.opaque_reason = "test";
    n.phase = phase;
    n.inputs = std::move(ins);
    const auto id = static_cast<std::uint32_t>(ir.nodes.size());
    for (std::size_t k = 0; k < outs.size(); ++k) {
      Value v = make(outs[k], dtype);
      v.producer = id;
      v.producer_output = static_cast<std::uint32_t>(k);
      ir.values.push_back(std::move(v));
      n.outputs.push_back(static_cast<std::uint32_t>(ir.values.size() - 1));
    }
    ir.nodes.push_back(std::move(n));
    return id;
  }
  // The same, returning the node's first output.
  std::uint32_t op(std::string name, CKernel kind, std::vector<std::uint32_t> ins,
                   std::vector<std::int64_t> out, record::Phase phase = record::Phase::Forward) {
    const std::uint32_t n = node(std::move(name), kind, std::move(ins), {std::move(out)}, phase);
    return ir.nodes[n].outputs[0];
  }

  // Live-out = produced and read by no node (Note [Live-out]); costs: one FLOP per output
  // element (2mnk-free: the tests only need them consistent), bytes = inputs + outputs.
  Ir001& done() {
    std::vector<bool> read(ir.values.size(), false);
    for (const Node& n : ir.nodes)
      for (std::uint32_t v : n.inputs) read[v] = true;
    for (std::size_t v = 0; v < ir.values.size(); ++v)
      if (ir.values[v].producer != kNoNode && !read[v]) ir.values[v].live_out = true;
    for (Node& n : ir.nodes) {
      n.flops = n.bytes = 0;
      for (std::uint32_t v : n.inputs) n.bytes += ir.values[v].is_view ? 0 : ir.values[v].nbytes;
      for (std::uint32_t v : n.outputs) {
        n.bytes += ir.values[v].is_view ? 0 : ir.values[v].nbytes;
        n.flops += ir.values[v].nbytes / 4;
      }
    }
    return ir;
  }

 private:
  Value make(const std::vector<std::int64_t>& shape, std::int8_t dtype) {
    Value v;
    std::int64_t numel = 1;
    for (std::int64_t d : shape) {
      v.shape.push_back(pool_->constant(d));
      numel *= d;
    }
    v.dtype = dtype;
    v.storage = next_storage_++;
    v.nbytes = numel * (dtype == 15 || dtype == 5 ? 2 : dtype == 4 || dtype == 7 ? 8 : 4);
    return v;
  }
  std::unique_ptr<ExprPool> pool_ = std::make_unique<ExprPool>();
  std::uint64_t next_storage_ = 1;
};

// Rules from in-memory texts: files maps class name -> TOML text.
inline Result<RuleSet> rules_from(const std::map<std::string, std::string>& files,
                                  std::string_view name) {
  return parse_rules(name, [&files](std::string_view c) -> Result<std::string> {
    auto it = files.find(std::string(c));
    if (it == files.end()) return invalid_input("no class " + std::string(c), "add it");
    return it->second;
  });
}

// A one-file class "t" with capabilities ["avx2"] and the given [[rule]] tables.
inline RuleSet one_class(const std::string& rules_toml) {
  auto r =
      rules_from({{"t", "[class]\nname = \"t\"\ncapabilities = [\"avx2\"]\n" + rules_toml}}, "t");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : RuleSet{};
}

// One [[rule]] table.
inline std::string rule(const std::string& id, const std::string& pattern,
                        const std::string& kernel, int priority, const std::string& extra = "") {
  std::string s = "[[rule]]\nid = \"" + id + "\"\npattern = " + pattern + "\nkernel = \"" + kernel +
                  "\"\npriority = " + std::to_string(priority) + "\n";
  if (kernel != "opaque" && kernel != "view" && extra.find("recipe") == std::string::npos)
    s += "recipe = \"f32_ordered\"\n";
  return s + extra;
}

}  // namespace crucible::forge::test
