// Command.h — one entry of the `crucible` tool's subcommand tables, its exit codes and dispatch.
//
// The tool is a tree of tables: main() dispatches on kTopLevel ("pt", "plan", "venn"),
// `pt` dispatches on its own table ("ls", "check"). Adding a subcommand is one table row plus
// its entry point. dispatch() owns the shared behaviour: --help at every level, and a clear
// message on stderr with exit code 2 for a missing or unknown name.
#pragma once

#include <cstdio>
#include <span>
#include <string>
#include <string_view>

namespace crucible::cli {

using Args = std::span<const std::string_view>;

// 0 success, 1 the input was examined and refused (a file failed its check), 2 usage errors:
// unknown command or option, missing or unreadable file; 3 the command could not finish: out of
// memory (main catches std::bad_alloc) or an unexpected exception.
enum Exit : int { kExitOk = 0, kExitRefused = 1, kExitUsage = 2, kExitFailed = 3 };

// A leaf command has `run`; a group (`crucible pt ...`) has `group`, its own table.
struct Command {
  std::string_view name;
  std::string_view args;     // usage after the name: "[--json] FILE"
  std::string_view summary;  // one line, listed by the parent's --help
  std::string_view details;  // more lines, printed by this command's own --help (may be empty)
  int (*run)(Args args) = nullptr;                // gets the arguments after the name
  std::span<const Command> (*group)() = nullptr;  // the subcommand table
};

// Runs the command `args[0]` names from `table`. `path` is how the user reached the table
// ("crucible", "crucible pt"), for help and error messages.
int dispatch(std::string_view path, std::span<const Command> table, Args args);

// Prints "crucible: <what>" and a pointer to --help on stderr; returns kExitUsage.
int usage_error(std::string_view path, const std::string& what);

bool is_help_flag(std::string_view a);

// printf into a std::string.
[[gnu::format(printf, 1, 2)]] std::string strf(const char* fmt, ...);

// Tables of the command groups, each in its own file.
std::span<const Command> pt_commands();  // PtCommand.cpp: ls, check
int plan_command(Args args);             // PlanCommand.cpp: crucible plan
int venn_command(Args args);             // PlanCommand.cpp: crucible venn

}  // namespace crucible::cli
