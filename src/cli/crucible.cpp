// crucible.cpp — the `crucible` command-line tool: main() and the table of top-level commands.
//
// Each command is one row here and one entry point in its own file (see Command.h); misc/CLI.md
// describes the tool. Exit codes: 0 ok, 1 refused input, 2 usage error.
#include <string_view>
#include <vector>

#include "Command.h"

namespace crucible::cli {
namespace {

constexpr Command kTopLevel[] = {
    {"pt", "ls|check ...", "inspect and check torch.save .pt files without torch", "", nullptr,
     pt_commands},
};
static_assert(std::size(kTopLevel) == 1, "misc/CLI.md lists every top-level command");

}  // namespace
}  // namespace crucible::cli

int main(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  return crucible::cli::dispatch("crucible", crucible::cli::kTopLevel, args);
}
