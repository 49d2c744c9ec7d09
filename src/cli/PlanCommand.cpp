// PlanCommand.cpp — `crucible plan TRACE` and `crucible venn TRACE`: Forge's front end on the
// last steady iteration of a recorded trace, printed for a hardware class. For a CPU class,
// `plan` also builds the execution plan and prepares Mimic's CPU backend on it: per kernel,
// generated, partly generated or library calls (and why), its recipe and where its code came
// from (the kernel cache: memory, disk, compiled).
//
//   crucible plan [--hardware cpu-avx2|h200] [--rules DIR] [--infer] [--allow-differs ID]...
//                 [--setting KEY=VALUE]... [--budget-us N] [--sizes-from TRACE2] [--json] TRACE
//   crucible venn [--hardware ...] [--rules DIR] [--json] TRACE
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "Command.h"
#include "crucible/exec/BuildPlan.h"
#include "crucible/forge/Ir001.h"
#include "crucible/forge/Passes.h"
#include "crucible/forge/Report.h"
#include "crucible/graph/Analysis.h"
#if CRUCIBLE_CLI_MIMIC
#include "crucible/mimic/CpuBackend.h"
#endif
#include "crucible/record/TraceFile.h"

namespace crucible::cli {
namespace {

struct PlanArgs {
  std::string hardware = "cpu-avx2";
  std::string rules_dir = CRUCIBLE_RULES_DIR;
  std::string trace;
  std::string sizes_from;  // --sizes-from: the same program recorded at other sizes
  forge::Policy policy;
  double budget_us = 50'000;
  bool json = false;
};

int parse(std::string_view path, Args args, bool plan, PlanArgs& out) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    auto value = [&](std::string* v) {
      if (i + 1 >= args.size()) return false;
      *v = std::string(args[++i]);
      return true;
    };
    std::string v;
    if (a == "--json") {
      out.json = true;
    } else if (a == "--hardware") {
      if (!value(&out.hardware)) return usage_error(path, "--hardware needs a class name");
    } else if (a == "--rules") {
      if (!value(&out.rules_dir)) return usage_error(path, "--rules needs a directory");
    } else if (plan && a == "--infer") {
      out.policy.training = false;
    } else if (plan && a == "--allow-differs") {
      if (!value(&v)) return usage_error(path, "--allow-differs needs a rule id");
      out.policy.allow_differs.push_back(v);
    } else if (plan && a == "--setting") {
      if (!value(&v) || v.find('=') == std::string::npos) return usage_error(path, "--setting needs KEY=VALUE");
      out.policy.settings[v.substr(0, v.find('='))] = v.substr(v.find('=') + 1);
    } else if (plan && a == "--sizes-from") {
      if (!value(&out.sizes_from)) return usage_error(path, "--sizes-from needs a trace of the program at other sizes");
    } else if (plan && a == "--budget-us") {
      if (!value(&v)) return usage_error(path, "--budget-us needs a number");
      char* end = nullptr;
      out.budget_us = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || out.budget_us < 0) return usage_error(path, "--budget-us needs a number >= 0");
    } else if (!a.empty() && a[0] == '-') {
      return usage_error(path, "unknown option '" + std::string(a) + "'");
    } else if (out.trace.empty()) {
      out.trace = std::string(a);
    } else {
      return usage_error(path, "one TRACE only (got '" + out.trace + "' and '" + std::string(a) + "')");
    }
  }
  if (out.trace.empty()) return usage_error(path, "missing TRACE (a .crtrace file: crucible.export(path) writes one)");
  return -1;
}

// Trace -> last steady iteration -> IR001. Prints the error and returns the exit code on failure.
int load_ir(const std::string& path, forge::ExprPool& pool, forge::Ir001* out) {
  auto trace = record::load_trace(path);
  if (!trace.ok()) {
    std::fprintf(stderr, "crucible: %s: %s\n", path.c_str(), message_of(trace.status()).c_str());
    return trace.status().code() == absl::StatusCode::kUnavailable ? kExitUsage : kExitRefused;
  }
  auto it = graph::analyze_latest_iteration(*trace, -1);
  if (!it.ok()) {
    std::fprintf(stderr, "crucible: %s: no iteration to plan: %s\n", path.c_str(),
                 message_of(it.status()).c_str());
    return kExitRefused;
  }
  if ((*it)->incomplete())
    std::fprintf(stderr,
                 "crucible: warning: %s: the planned iteration is incomplete: %llu of its ops were recorded "
                 "right after dropped ones (drop_when_full), so the plan covers only what was recorded; "
                 "record with back-pressure (the default) or larger rings\n",
                 path.c_str(), static_cast<unsigned long long>((*it)->analysis->ops_after_drop));
  auto ir = forge::build_ir001(*trace, (*it)->ops(), pool);
  if (!ir.ok()) {
    std::fprintf(stderr, "crucible: %s\n", message_of(ir.status()).c_str());
    return kExitRefused;
  }
  *out = std::move(*ir);
  return -1;
}

// Trace -> IR001 -> front end (the IR before it kept in `recorded` when asked). Prints the error
// and returns the exit code on failure.
int front_end(const PlanArgs& a, forge::ExprPool& pool, forge::RuleSet* rules,
              const forge::Hardware** hw, forge::FrontEndResult* out, forge::Ir001* recorded = nullptr) {
  *hw = forge::hardware_by_name(a.hardware);
  if (*hw == nullptr) {
    std::string names;
    for (std::string_view n : forge::hardware_names()) names += (names.empty() ? "" : ", ") + std::string(n);
    std::fprintf(stderr, "crucible: unknown hardware class '%s' (known: %s)\n", a.hardware.c_str(), names.c_str());
    return kExitUsage;
  }
  forge::Ir001 ir_value;
  if (int rc = load_ir(a.trace, pool, &ir_value); rc >= 0) return rc;
  if (recorded != nullptr) *recorded = ir_value;
  auto rs = forge::load_rules_dir(a.rules_dir, a.hardware);
  if (!rs.ok()) {
    std::fprintf(stderr, "crucible: rules: %s\n", message_of(rs.status()).c_str());
    return kExitUsage;
  }
  *rules = std::move(*rs);
  auto fe = forge::run_front_end(std::move(ir_value), *rules, a.policy, a.budget_us);
  if (!fe.ok()) {
    std::fprintf(stderr, "crucible: plan: %s\n", message_of(fe.status()).c_str());
    return kExitRefused;
  }
  *out = std::move(*fe);
  return -1;
}

// The CPU backend on the step's execution plan, appended to the report: a line per kernel that
// does work (views have no calls) and the totals. An error (a plan that cannot be built, a
// kernel cache that cannot be opened) is the section's content, not the command's failure.
void add_backend_section(const forge::FrontEndResult& fe, forge::PlanReport* r) {
  nlohmann::json j;
  std::string text = "\nMimic CPU backend (execution plan kernels):\n";
  auto fail = [&](const Status& st) {
    j = {{"backend", "cpu"}, {"error", message_of(st)}};
    text += "  not prepared: " + message_of(st) + "\n";
  };
#if !CRUCIBLE_CLI_MIMIC
  (void)fe;
  fail(
      unsupported("this crucible was built without the Mimic CPU backend (-DCRUCIBLE_LLVM=OFF, "
                  "or a torch of the old std::string ABI: Note [Old std::string ABI])",
                  "build with LLVM installed (utils/bin/setup) to see the CPU backend's kernels"));
#else
  auto plan = exec::build_plan(fe.ir, fe.plan);
  auto cpu = plan.ok() ? mimic::CpuBackend::make() : Result<std::unique_ptr<mimic::CpuBackend>>(plan.status());
  Status st = cpu.ok() ? ok_status() : cpu.status();
  exec::Backend b;
  if (st.ok()) {
    b = (*cpu)->backend();
    st = b.prepare(b.self, *plan);
  }
  if (!st.ok()) {
    fail(st);
  } else {
    std::uint32_t generated = 0, library = 0, tables = 0, table_runs = 0;
    nlohmann::json kernels = nlohmann::json::array();
    for (std::uint32_t k = 0; k < plan->kernels.size(); ++k) {
      const exec::Kernel& kn = plan->kernels[k];
      if (kn.call_count == 0) continue;
      const mimic::CpuKernelState& s = (*cpu)->kernels()[k];
      std::string ops;  // the first few, for the text
      for (std::uint32_t c = kn.call_begin; c < kn.call_begin + std::min(kn.call_count, 6u); ++c)
        ops += (ops.empty() ? "" : " ") + plan->op_names[plan->calls[c].op];
      if (kn.call_count > 6) ops += " ... (" + std::to_string(kn.call_count) + " calls)";
      // The lowering's refusal, less what the section already says ("kernel K is not a
      // pointwise chain ...: " and "; it runs as library calls").
      std::string why = s.why;
      if (const std::size_t at = why.find("generates: "); at != std::string::npos) why.erase(0, at + 11);
      if (const std::size_t at = why.rfind("; it runs as library calls"); at != std::string::npos) why.erase(at);
      nlohmann::json e = {{"kernel", k},
                          {"group", kn.group},
                          {"generated", s.generated},
                          {"calls", kn.call_count},
                          {"generated_calls", s.generated_calls},
                          {"ops", ops},
                          {"table_launches", s.table_launches},
                          {"table_runs", s.table_runs}};
      tables += s.table_launches;
      table_runs += s.table_runs;
      char line[96];
      if (s.generated) {
        ++generated;
        const std::string_view rn = forge::recipe_name(s.recipe);
        e["recipe"] = rn.empty() ? forge::recipe_text(*s.recipe) : std::string(rn);
        e["cache"] = std::string(s.cache);
        std::snprintf(line, sizeof line, "  kernel %-4u group %-4u generated  %-10s ", k, kn.group,
                      std::string(s.cache).c_str());
        text += line + ops + "  [" + e["recipe"].get<std::string>() + "]\n";
      } else {
        ++library;
        e["why"] = why;
        char part[32];
        std::snprintf(part, sizeof part, "partly %u/%u", s.generated_calls, kn.call_count);
        std::snprintf(line, sizeof line, "  kernel %-4u group %-4u %-10s ", k, kn.group,
                      s.generated_calls > 0 ? part : "library");
        text += line + ops + "\n      " + why + "\n";
      }
      kernels.push_back(std::move(e));
    }
    std::uint32_t calls = 0, generated_calls = 0;
    for (const mimic::CpuKernelState& s : (*cpu)->kernels()) generated_calls += s.generated_calls;
    for (const exec::Kernel& kn : plan->kernels) calls += kn.call_count;
    text += "  " + std::to_string(generated) + " kernels generated, " + std::to_string(library) +
            " not (or partly); " + std::to_string(generated_calls) + " of " +
            std::to_string(calls) + " calls generated; " + std::to_string(table_runs) +
            " runs in " + std::to_string(tables) +
            (tables == 1 ? " launch table\n" : " launch tables\n");
    j = {{"backend", "cpu"},         {"generated", generated},
         {"library", library},       {"generated_calls", generated_calls},
         {"calls", calls},           {"kernels", kernels},
         {"table_launches", tables}, {"table_runs", table_runs}};
  }
#endif
  r->text += text;
  if (!r->json.empty()) {
    nlohmann::json report = nlohmann::json::parse(r->json);
    report["mimic"] = std::move(j);
    r->json = report.dump(2);
  }
}

// --sizes-from: the recorded iteration's shapes over the sizes that differ from another recording
// of the program (forge::symbolize_sizes), appended to the report: the symbols, then each node
// whose results' shapes hold one. Returns the exit code on failure (the error printed).
int add_symbolic_section(const PlanArgs& a, forge::ExprPool& pool, const forge::Ir001& here,
                         forge::PlanReport* r) {
  forge::Ir001 other;
  if (int rc = load_ir(a.sizes_from, pool, &other); rc >= 0) return rc;
  std::vector<forge::SizeSymbol> found;
  auto sym = forge::symbolize_sizes(here, other, pool, &found);
  if (!sym.ok()) {
    std::fprintf(stderr, "crucible: plan: --sizes-from %s: %s\n", a.sizes_from.c_str(),
                 message_of(sym.status()).c_str());
    return kExitRefused;
  }
  std::string text = "\nsymbolic shapes (the sizes that differ in " + a.sizes_from + " named):\n";
  nlohmann::json symbols = nlohmann::json::array(), nodes = nlohmann::json::array();
  for (const forge::SizeSymbol& s : found) {
    text += "  " + s.name + " = " + std::to_string(s.a) + " here, " + std::to_string(s.b) + " there (input value " +
            std::to_string(s.value) + ", dim " + std::to_string(s.dim) + ")\n";
    symbols.push_back({{"name", s.name}, {"here", s.a}, {"there", s.b}, {"value", s.value}, {"dim", s.dim}});
  }
  auto shape_text = [](const std::vector<const forge::Expr*>& shape) {
    std::string t = "[";
    for (std::size_t d = 0; d < shape.size(); ++d) t += (d ? ", " : "") + forge::ExprPool::to_string(shape[d]);
    return t + "]";
  };
  std::size_t shown = 0;
  for (std::size_t n = 0; n < sym->nodes.size(); ++n) {
    const forge::Node& node = sym->nodes[n];
    bool symbolic = false;
    nlohmann::json shapes = nlohmann::json::array();
    std::string outs;
    for (std::uint32_t v : node.outputs) {
      const auto& shape = sym->values[v].shape;
      symbolic |= std::any_of(shape.begin(), shape.end(), [](const forge::Expr* e) {
        return e->kind != forge::Expr::Kind::Const;
      });
      shapes.push_back(shape_text(shape));
      outs += (outs.empty() ? "" : ", ") + shape_text(shape);
    }
    if (!symbolic) continue;
    ++shown;
    std::string line = "  node " + std::to_string(n);
    line.resize(std::max<std::size_t>(line.size() + 1, 13), ' ');
    line += node.op;
    line.resize(std::max<std::size_t>(line.size() + 1, 46), ' ');
    text += line + outs + "\n";
    nodes.push_back({{"node", n}, {"op", node.op}, {"shapes", shapes}});
  }
  text += "  " + std::to_string(shown) + " of " + std::to_string(sym->nodes.size()) +
          " nodes have a result whose shape holds a symbol\n";
  r->text += text;
  if (!r->json.empty()) {
    nlohmann::json report = nlohmann::json::parse(r->json);
    report["symbolic"] = {{"symbols", symbols}, {"nodes", nodes}};
    r->json = report.dump(2);
  }
  return -1;
}

// Both commands: parse, run the front end, print the report (text or --json).
int run_report(std::string_view path, Args args, bool plan) {
  PlanArgs a;
  if (int rc = parse(path, args, plan, a); rc >= 0) return rc;
  forge::ExprPool pool;
  forge::RuleSet rules;
  const forge::Hardware* hw = nullptr;
  forge::FrontEndResult fe;
  forge::Ir001 recorded;
  if (int rc = front_end(a, pool, &rules, &hw, &fe, a.sizes_from.empty() ? nullptr : &recorded); rc >= 0) return rc;
  forge::PlanReport r = plan ? forge::plan_report(fe, rules, *hw) : forge::venn_report(fe, *hw);
  if (plan && a.hardware.starts_with("cpu")) add_backend_section(fe, &r);
  if (!a.sizes_from.empty())
    if (int rc = add_symbolic_section(a, pool, recorded, &r); rc >= 0) return rc;
  std::fputs((a.json ? r.json : r.text).c_str(), stdout);
  if (a.json && !r.json.empty() && r.json.back() != '\n') std::fputc('\n', stdout);
  return kExitOk;
}

}  // namespace

int plan_command(Args args) { return run_report("crucible plan", args, true); }
int venn_command(Args args) { return run_report("crucible venn", args, false); }

}  // namespace crucible::cli
