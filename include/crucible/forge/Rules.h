// Rules.h — fusion rules as data: one TOML file per hardware class (rules/<class>.toml).
//
//   [class]
//   name = "h200"
//   extends = "cpu-avx2"            # optional: rules of the base class come first, same ids override
//   capabilities = ["avx2", "fma"]  # what this class offers
//
//   [[rule]]
//   id = "conv_bias_relu"
//   pattern = ["CONV", "POINTWISE_BINARY?", "POINTWISE_UNARY"]  # kinds (or "aten::op" names);
//                                                               # "?" marks an optional step,
//                                                               # "+" one or more, "*" zero or
//                                                               # more; "A|B" either kind
//   kernel = "conv_epilogue"        # IR002 template
//   recipe = "f32_ordered"          # NumericalRecipe registry name
//   modes = ["train", "infer"]
//   rows = [1, 1048576]             # row-count range (leading dims product) where it applies
//   requires = ["avx2", "fma"]      # capabilities the class must offer
//   numerics = "bit_identical"      # reference | bit_identical | differs
//   priority = 300
//   settings = ["allow_tf32"]       # policy settings the rule reads (must be stated by the policy)
//   horizontal = true               # the pattern is one member of a multi-tensor group
//   phases = ["optimizer"]          # the recorded phases it applies in (default: all)
//   escaping = false                # fused values are never stored (default true)
//
// A "differs" rule applies only when the policy opts into it by id. Parsing is strict: an unknown
// key, kind, template or recipe is an error naming the file, rule and key.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/core/OpTable.h"
#include "crucible/forge/Ir002.h"
#include "crucible/forge/NumericalRecipe.h"
#include "crucible/record/TraceRecord.h"

namespace crucible::forge {

enum class Numerics : std::uint8_t { Reference = 0, BitIdentical = 1, Differs = 2 };
// "reference", "bit_identical", "differs" ("unknown" for a value past the enum): what plan
// texts and reports print.
std::string_view numerics_name(std::uint8_t n) noexcept;

struct PatternStep {
  std::vector<CKernel> kinds;   // match by kind ("POINTWISE_UNARY|POINTWISE_BINARY": any) ...
  std::string op;               // ... or by exact op name ("aten::addmm")
  bool optional = false;        // "?" suffix: zero or one; "*" suffix: zero or more
  bool repeated = false;        // "+" suffix: one or more; "*" suffix: zero or more
};

struct Rule {
  std::string id;
  std::vector<PatternStep> pattern;
  KernelTemplate kernel = KernelTemplate::Opaque;
  const NumericalRecipe* recipe = nullptr;
  bool train = true, infer = true;
  std::int64_t rows_min = 0, rows_max = INT64_MAX;
  std::vector<std::string> requires_caps;
  Numerics numerics = Numerics::Reference;
  std::int32_t priority = 0;
  std::vector<std::string> settings;
  // Note [Horizontal rules] (FuseHorizontal.cpp): the pattern is one member's ops in execution
  // order (consecutive nodes, not a dataflow chain); consecutive independent members form one
  // group, a kernel over a table of pointers and sizes (a multi-tensor optimizer update).
  bool horizontal = false;
  // Note [Escaping links] (Fuse.cpp): whether a fused value may also be stored for readers
  // outside the group. false: each link has one reader and is not live-out.
  bool escaping = true;
  std::vector<record::Phase> phases;  // where the group's nodes may run; empty = any phase
  std::string source;  // "rules/cpu-avx2.toml" (not hashed)
};

struct RuleSet {
  std::string hardware;                 // class name
  std::vector<std::string> chain;       // class, its base, its base's base ...
  std::vector<std::string> capabilities;
  std::vector<Rule> rules;              // base rules first; a same-id rule in a derived class replaces
  std::string digest;                   // SHA-256 hex of the rules texts (chain order)
};

// Loads class `name`, resolving `extends` through `read_text(class) -> TOML text` (a cycle or a
// missing class is an error). Pure: no file access of its own (load_rules_dir below reads files).
Result<RuleSet> parse_rules(std::string_view name,
                            const std::function<Result<std::string>(std::string_view)>& read_text);
// read_text from <dir>/<class>.toml.
Result<RuleSet> load_rules_dir(const std::string& dir, std::string_view name);

// What the user decides: mode, which "differs" rules are allowed, and the settings rules may read.
struct Policy {
  bool training = true;
  // Note [Rematerialization]: recompute cheap saved values in the backward (a plan that runs;
  // reports of what a step does leave it off).
  bool rematerialize = false;
  std::vector<std::string> allow_differs;           // rule ids
  std::map<std::string, std::string> settings;      // stated settings, e.g. allow_tf32=false
};

// The rules that apply under the policy to the class (mode, capabilities, "differs" opt-in,
// settings), sorted by priority descending, then id. Errors: an allowed "differs" id the class
// lacks, a rule reading a setting the policy does not state.
Result<std::vector<const Rule*>> applicable_rules(const RuleSet& rules, const Policy& policy);

}  // namespace crucible::forge
