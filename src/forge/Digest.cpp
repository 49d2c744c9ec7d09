// Digest.cpp — canonical plan text (schema v1) and SHA-256 through OpenSSL's EVP interface.
#include "crucible/forge/Digest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>

#include "crucible/core/Contract.h"
#include "crucible/core/ScalarType.h"
#include "crucible/record/Trace.h"

namespace crucible::forge {
namespace {

std::string phase_short(record::Phase p) {
  switch (p) {
    case record::Phase::Forward:
      return "fwd";
    case record::Phase::Backward:
      return "bwd";
    case record::Phase::Optimizer:
      return "opt";
  }
  return std::to_string(static_cast<int>(p));
}

std::string external_name(std::uint8_t e) {
  if (e == 0 || e > record::kMaxExternalKind) return "unknown";
  return record::external_kind_name(static_cast<record::ExternalKind>(e));
}

// "float32[B*32,512]": dtype name from the c10 table, dims in ExprPool's canonical text.
std::string value_type(const Value& v) {
  std::string s(scalar_type_info(v.dtype).name);
  s += '[';
  for (std::size_t i = 0; i < v.shape.size(); ++i) {
    if (i) s += ',';
    s += v.shape[i] ? ExprPool::to_string(v.shape[i]) : std::string("?");
  }
  s += ']';
  return s;
}

std::string group_ref(std::uint32_t g) { return g == UINT32_MAX ? "ext" : "g" + std::to_string(g); }

// One op of a group: "n4=aten::addmm@fwd(v0,v1,v2)->(v3:float32[32,512])" and, when the op has
// scalar arguments, "{kind.arg.aux.bits,...}" with bits in hex (doubles as their IEEE bits).
void append_op(std::string& s, const Ir001& ir, std::uint32_t n) {
  const Node& node = ir.nodes[n];
  s += 'n' + std::to_string(n) + '=' + node.op + '@' + phase_short(node.phase) + '(';
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    if (i) s += ',';
    s += 'v' + std::to_string(node.inputs[i]);
  }
  s += ")->(";
  for (std::size_t i = 0; i < node.outputs.size(); ++i) {
    if (i) s += ',';
    const std::uint32_t v = node.outputs[i];
    s += 'v' + std::to_string(v) + ':';
    s += v < ir.values.size() ? value_type(ir.values[v]) : std::string("?");
  }
  s += ')';
  if (!node.scalars.empty()) {
    s += '{';
    char buf[64];
    for (std::size_t i = 0; i < node.scalars.size(); ++i) {
      const record::ScalarRecord& r = node.scalars[i];
      const Expr* e = i < node.scalar_exprs.size() ? node.scalar_exprs[i] : nullptr;
      if (e != nullptr) {  // a batch-proportional int: its expression, not one batch's value
        std::snprintf(buf, sizeof buf, "%s%u.%u.%u.", i ? "," : "", static_cast<unsigned>(r.kind),
                      static_cast<unsigned>(r.arg_index), static_cast<unsigned>(r.aux));
        s += buf;
        s += ExprPool::to_string(e);
        continue;
      }
      std::snprintf(buf, sizeof buf, "%s%u.%u.%u.%" PRIx64, i ? "," : "",
                    static_cast<unsigned>(r.kind), static_cast<unsigned>(r.arg_index),
                    static_cast<unsigned>(r.aux), r.bits);
      s += buf;
    }
    s += '}';
  }
}

}  // namespace

// Note [Plan text v1]: the header names the schema, the hardware class and the rules digest
// (provenance: which rules produced the plan). The plan digest hashes everything but the rules
// digest (plan_text_digest below), so editing a rule the plan does not use, renaming a rule id or
// changing a comment leaves the plan digest unchanged while the rules digest moves. Rule ids,
// rule files and module paths never appear in the text at all. An edge's state is "fused",
// "fused+stored" (fused, and also written by its kernel because it escapes: Note [Escaping
// links] in Fuse.cpp) or "materialized".
std::string canonical_plan_text(const Ir001& ir, const Ir002& plan, const RuleSet& rules) {
  std::string s = "crucible-plan v" + std::to_string(kPlanTextVersion) +
                  " hardware=" + rules.hardware + " rules=" + rules.digest + '\n';
  for (const FusionGroup& g : plan.groups) {
    s += "group " + std::to_string(g.id) + ' ' + std::string(kernel_template_name(g.kernel)) +
         " numerics=" + std::string(numerics_name(g.numerics)) + " recipe=[" +
         (g.recipe ? recipe_text(*g.recipe) : std::string("none")) +
         "] ops=" + std::to_string(g.nodes.size());
    for (std::uint32_t n : g.nodes) {
      s += " | ";
      if (n < ir.nodes.size()) {
        append_op(s, ir, n);
      } else {
        s += "n" + std::to_string(n) + "=?";
      }
    }
    s += '\n';
  }
  for (const Edge& e : plan.edges) {
    s += "edge v" + std::to_string(e.value) + ' ';
    const bool known = e.value < ir.values.size();
    if (e.from_group == UINT32_MAX && known && ir.values[e.value].producer == kNoNode) {
      s += "ext(" + external_name(ir.values[e.value].external) + ')';
    } else {
      s += group_ref(e.from_group);
    }
    s += "->" + group_ref(e.to_group) + ' ';
    // A fused value that escapes (Note [Escaping links], Fuse.cpp) is also stored by its kernel.
    const bool stored = e.state == EdgeState::Fused && e.from_group < plan.kernels.size() &&
                        std::find(plan.kernels[e.from_group].outputs.begin(),
                                  plan.kernels[e.from_group].outputs.end(),
                                  e.value) != plan.kernels[e.from_group].outputs.end();
    s += e.state == EdgeState::Fused ? (stored ? "fused+stored " : "fused ") : "materialized ";
    s += known ? value_type(ir.values[e.value]) : std::string("?");
    s += '\n';
  }
  return s;
}

std::string plan_text_digest(std::string_view plan_text) {
  const std::size_t eol = plan_text.find('\n');
  const std::string_view header = plan_text.substr(0, eol);
  const std::size_t r = header.find(" rules=");
  if (r == std::string_view::npos) return sha256_hex(plan_text);
  std::string hashed(header.substr(0, r));
  if (eol != std::string_view::npos) hashed += plan_text.substr(eol);
  return sha256_hex(hashed);
}

std::string sha256_hex(std::string_view bytes) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const bool ok = ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1 &&
                  EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) == 1 &&
                  EVP_DigestFinal_ex(ctx.get(), md, &len) == 1;
  // SHA-256 over memory fails only when OpenSSL cannot allocate its context.
  CRUCIBLE_ASSERT(ok && len == 32, "OpenSSL EVP SHA-256 failed (out of memory?)");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = kHex[md[i] >> 4];
    out[2 * i + 1] = kHex[md[i] & 15];
  }
  return out;
}

}  // namespace crucible::forge
