// Command.cpp — table dispatch, --help at every level, usage errors.
#include "Command.h"

#include <algorithm>
#include <cstdarg>
#include <string>

namespace crucible::cli {

bool is_help_flag(std::string_view a) { return a == "--help" || a == "-h" || a == "help"; }

std::string strf(const char* fmt, ...) {
  std::va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
  va_end(ap2);
  return out;
}

int usage_error(std::string_view path, const std::string& what) {
  std::fprintf(stderr, "crucible: %s\nRun '%.*s --help' for usage.\n", what.c_str(),
               static_cast<int>(path.size()), path.data());
  return kExitUsage;
}

namespace {

void print_table_help(std::string_view path, std::span<const Command> table) {
  std::printf("usage: %.*s COMMAND [ARGS]\n\ncommands:\n", static_cast<int>(path.size()),
              path.data());
  std::size_t w = 0;
  for (const Command& c : table) w = std::max(w, c.name.size() + 1 + c.args.size());
  for (const Command& c : table) {
    const std::string head = std::string(c.name) + " " + std::string(c.args);
    std::printf("  %-*s  %.*s\n", static_cast<int>(w), head.c_str(),
                static_cast<int>(c.summary.size()), c.summary.data());
  }
  std::printf("\nRun '%.*s COMMAND --help' for one command's details.\n",
              static_cast<int>(path.size()), path.data());
}

void print_command_help(std::string_view path, const Command& c) {
  std::printf("usage: %.*s %.*s %.*s\n\n%.*s\n", static_cast<int>(path.size()), path.data(),
              static_cast<int>(c.name.size()), c.name.data(), static_cast<int>(c.args.size()),
              c.args.data(), static_cast<int>(c.summary.size()), c.summary.data());
  if (!c.details.empty())
    std::printf("\n%.*s\n", static_cast<int>(c.details.size()), c.details.data());
}

}  // namespace

int dispatch(std::string_view path, std::span<const Command> table, Args args) {
  if (args.empty()) return usage_error(path, "missing command");
  if (is_help_flag(args[0])) {
    print_table_help(path, table);
    return kExitOk;
  }
  for (const Command& c : table) {
    if (c.name != args[0]) continue;
    if (c.group != nullptr)
      return dispatch(std::string(path) + " " + std::string(c.name), c.group(), args.subspan(1));
    // Only a first-position --help is ours: later ones could be a file named "help".
    if (args.size() >= 2 && (args[1] == "--help" || args[1] == "-h")) {
      print_command_help(path, c);
      return kExitOk;
    }
    return c.run(args.subspan(1));
  }
  return usage_error(path, "unknown command '" + std::string(args[0]) + "'");
}

}  // namespace crucible::cli
