// crucible.cpp — the `crucible` command-line tool: main() and the table of top-level commands.
//
// Each command is one row here and one entry point in its own file (see Command.h); misc/CLI.md
// describes the tool. Exit codes: 0 ok, 1 refused input, 2 usage error, 3 out of memory.
#include <cstdio>
#include <exception>
#include <new>
#include <string_view>
#include <vector>

#include "Command.h"

namespace crucible::cli {
namespace {

constexpr Command kTopLevel[] = {
    {"pt", "ls|check ...", "inspect and check torch.save .pt files without torch", "", nullptr,
     pt_commands},
    {"plan", "[--hardware CLASS] [--rules DIR] [--infer] [--json] ... TRACE",
     "Forge's fused plan of a recorded iteration: groups, kernels, recipes, memory fit, roofline",
     "  --hardware CLASS     rules/<CLASS>.toml and its datasheet (cpu-avx2, h200); default cpu-avx2\n"
     "  --rules DIR          where the rules files are (default: the source tree's rules/)\n"
     "  --infer              plan for inference (default: training)\n"
     "  --allow-differs ID   allow a rule whose numerics differ from the reference\n"
     "  --setting KEY=VALUE  state a policy setting rules may read\n"
     "  --budget-us N        wall-clock budget per phase (default 50000)\n"
     "  --sizes-from TRACE2  the program recorded at other sizes: each shape over the sizes that differ\n"
     "  --json               machine-readable output",
     plan_command, nullptr},
    {"venn", "[--hardware CLASS] [--rules DIR] [--json] TRACE",
     "which nodes a hardware class has kernel families for, ranked by share of step time", "",
     venn_command, nullptr},
};
static_assert(std::size(kTopLevel) == 3, "misc/CLI.md lists every top-level command");

}  // namespace
}  // namespace crucible::cli

// No exception leaves main (an uncaught one aborts with a core dump and no useful message): a
// file or trace that needs more memory than the process may have is reported and exits 3.
int main(int argc, char** argv) {
  try {
    const std::vector<std::string_view> args(argv + 1, argv + argc);
    return crucible::cli::dispatch("crucible", crucible::cli::kTopLevel, args);
  } catch (const std::bad_alloc&) {
    std::fputs(
        "crucible: out of memory (std::bad_alloc): the input needs more memory than this "
        "process may use; free memory or raise the process's limit (ulimit -v)\n",
        stderr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crucible: unexpected error: %s\n", e.what());
  }
  return crucible::cli::kExitFailed;
}
