// Report.h — what `crucible plan` and `crucible venn` print: the fused plan with a memory fit and
// a roofline estimate, and the kernel-family coverage of a hardware target.
//
// Note [Cost model]: per node, FLOPs and bytes (read + written, at the recorded shapes) come from
// its kind and shapes (GEMM 2mnk, CONV 2*out*k, pointwise one per element, ...). A group's time is
// max(bytes_materialized / bandwidth, flops / peak): fused edges cost no memory traffic. Peaks are
// datasheet ceilings or estimates unless the hardware entry says measured; the report labels which.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/forge/Passes.h"

namespace crucible::forge {

struct Hardware {
  std::string_view name;          // matches a rules class: "cpu-avx2", "h200"
  std::string_view description;
  double peak_flops = 0;          // FLOP/s (f32 for CPU, dense bf16 for H200)
  double peak_flops_f32 = 0;      // FLOP/s of f32 work without tensor cores (0: peak_flops); a
                                  // group whose recipe's io dtype is not bf16/f16 uses this one
  double bandwidth = 0;           // bytes/s
  std::int64_t memory_bytes = 0;  // device budget (usable)
  bool measured = false;          // true: the figures were measured on the target
  std::vector<CKernel> families;  // kernel kinds the target has native kernels for
  // What the figures are when not measured: "datasheet ceiling" (a vendor's peak) or "estimate"
  // (derived from the core's width and clock, not a datasheet).
  std::string_view source = "datasheet ceiling";
};
const Hardware* hardware_by_name(std::string_view name);  // nullptr if unknown
std::vector<std::string_view> hardware_names();

struct PlanReport {
  std::string text;  // terminal rendering
  std::string json;  // --json
};
PlanReport plan_report(const FrontEndResult& fe, const RuleSet& rules, const Hardware& hw);
PlanReport venn_report(const FrontEndResult& fe, const Hardware& hw);

}  // namespace crucible::forge
