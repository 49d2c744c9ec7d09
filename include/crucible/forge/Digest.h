// Digest.h — the canonical, versioned text of a plan and its SHA-256 (OpenSSL).
//
// The text has one header line with the schema version, the hardware class and the rules
// digest, one line per group (kernel template, recipe text, numerics, node ops with their
// symbolic output shapes and dtypes), one line per edge (value, from, to, fused/materialized,
// shape, dtype). Rule ids, file names, module paths and comments are not in it, so editing an
// unused rule or renaming a module leaves the digest unchanged; anything that changes what runs
// changes it. Same trace + same rules = same text = same digest, in any process.
#pragma once

#include <string>
#include <string_view>

#include "crucible/forge/Ir001.h"
#include "crucible/forge/Ir002.h"
#include "crucible/forge/Rules.h"

namespace crucible::forge {

inline constexpr int kPlanTextVersion = 1;

std::string canonical_plan_text(const Ir001& ir, const Ir002& plan, const RuleSet& rules);
// The plan digest: SHA-256 hex of the plan text without the header's " rules=<digest>" field (the
// rules digest is provenance, not what runs; see Note [Plan text v1] in Digest.cpp).
std::string plan_text_digest(std::string_view plan_text);
std::string sha256_hex(std::string_view bytes);

}  // namespace crucible::forge
