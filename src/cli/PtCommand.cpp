// PtCommand.cpp — `crucible pt ls|check FILE`: a .pt file's tensors, and whether it loads.
//
// Both open the file with crucible::ptload::StateDict (no torch, no code execution; CRC-32 of
// every record verified, unless --allow-zero-crc admits an archive that has none). A refusal
// prints the loader's message plus its class explained (Refusal.h) and exits 1; a missing or
// unreadable file is a usage error, exit 2.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>
#include <vector>

#include "Command.h"
#include "Refusal.h"
#include "crucible/core/ShapeText.h"
#include "crucible/ptload/StateDict.h"

namespace crucible::cli {
namespace {

using ptload::StateDict;
// An expanded view (stride 0) may span 2^63 elements of 8 bytes: sums are kept in 128 bits.
__extension__ typedef unsigned __int128 u128;

constexpr std::string_view kPath = "crucible pt";

struct Options {
  bool json = false;
  std::uint64_t repeat = 0;  // check --repeat N: time N opens
  ptload::LoadOptions load;  // the limits below, and --allow-zero-crc
  std::string file;
};

// The limits and the checksum option both commands take (help text of ls and check).
#define CRUCIBLE_PT_LIMIT_HELP                                                                     \
  "--max-pickle-bytes N    refuse a data.pkl over N bytes uncompressed (default 67108864)\n"       \
  "--max-inflate-ratio N   refuse a deflated record over 1 MiB that inflates more than N:1\n"      \
  "                        (default 100; torch.save never compresses)\n"                           \
  "--max-pickle-memory N   refuse a pickle whose objects would take over N bytes of memory\n"      \
  "                        (default 268435456; torch.save's take 2-3 KB a tensor)\n"               \
  "--allow-zero-crc        load an archive whose every CRC-32 field is 0 (torch.save under\n"      \
  "                        torch.serialization.set_crc32_options(False)) unverified\n"

// Parses [--json] [--repeat N] [--max-pickle-bytes N] [--max-inflate-ratio N]
// [--max-pickle-memory N] [--allow-zero-crc] FILE, accepting only the flags the command names.
// Returns -1 on success, else the exit code of the usage error already printed.
int parse(std::string_view cmd, Args args, bool allow_json, bool allow_repeat, Options& o) {
  const std::string where = std::string(kPath) + " " + std::string(cmd);
  std::vector<std::string_view> files;
  bool options_done = false;
  // Reads the positive integer after the flag args[i] into `out`; on a usage error prints it,
  // keeps its exit code in rc and returns false.
  int rc = -1;
  auto count = [&](std::size_t& i, std::uint64_t& out) {
    const std::string flag(args[i]);
    if (i + 1 == args.size()) {
      rc = usage_error(where, flag + " needs a count");
      return false;
    }
    const std::string_view n = args[++i];
    auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), out);
    if (ec != std::errc() || end != n.data() + n.size() || out == 0) {
      rc = usage_error(where, flag + " takes a positive integer, not '" + std::string(n) + "'");
      return false;
    }
    return true;
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (options_done || a.empty() || a[0] != '-' || a == "-") {
      files.push_back(a);
    } else if (a == "--") {
      options_done = true;
    } else if (allow_json && a == "--json") {
      o.json = true;
    } else if (allow_repeat && a == "--repeat") {
      if (!count(i, o.repeat)) return rc;
    } else if (a == "--max-pickle-bytes") {
      if (!count(i, o.load.max_pickle_bytes)) return rc;
    } else if (a == "--max-inflate-ratio") {
      if (!count(i, o.load.max_inflate_ratio)) return rc;
    } else if (a == "--max-pickle-memory") {
      if (!count(i, o.load.max_pickle_memory)) return rc;
    } else if (a == "--allow-zero-crc") {
      o.load.allow_zero_crc = true;
    } else {
      return usage_error(where, "unknown option '" + std::string(a) + "'");
    }
  }
  if (files.empty()) return usage_error(where, "missing FILE");
  if (files.size() > 1)
    return usage_error(where, "one FILE at a time (got " + std::to_string(files.size()) + ")");
  o.file = std::string(files[0]);
  // A file that cannot be opened at all is the caller's mistake, not a refusal of its content.
  const int fd = ::open(o.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return usage_error(where, "cannot open '" + o.file + "': " + std::strerror(errno));
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  if (!regular) return usage_error(where, "'" + o.file + "' is not a regular file");
  return -1;
}

std::string count_str(u128 v) {  // 11699132 -> "11,699,132"
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  for (std::size_t i = digits.size(); i > 3; i -= 3) digits.insert(i - 3, ",");
  return digits;
}

std::string human_bytes(u128 v) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double x = static_cast<double>(v);
  std::size_t u = 0;
  while (x >= 1024.0 && u + 1 < std::size(kUnits)) {
    x /= 1024.0;
    ++u;
  }
  return u == 0 ? strf("%.0f B", x) : strf("%.1f %s", x, kUnits[u]);
}

// A JSON number when it fits 64 bits, else its decimal text (only crafted views get there).
nlohmann::ordered_json json_count(u128 v) {
  if (v <= std::numeric_limits<std::uint64_t>::max()) return static_cast<std::uint64_t>(v);
  std::string s = count_str(v);
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  return s;
}

// Names come from the file's dict keys: control bytes are shown escaped, not sent to a terminal.
std::string printable(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      out += strf("\\x%02x", u);
    else
      out += c;
  }
  return out;
}

u128 view_bytes(const ptload::TensorView& t) { return static_cast<u128>(t.numel()) * t.itemsize(); }

struct Totals {
  std::size_t tensors = 0, storages = 0;
  u128 numel = 0, bytes = 0, storage_bytes = 0;
};

Totals totals_of(const StateDict& sd) {
  Totals t;
  std::unordered_set<const ptload::TensorStorage*> seen;
  for (const auto& [name, view] : sd.tensors()) {
    ++t.tensors;
    t.numel += static_cast<u128>(view.numel());
    t.bytes += view_bytes(view);
    if (seen.insert(&view.storage()).second) t.storage_bytes += view.storage().bytes.size();
  }
  t.storages = seen.size();
  return t;
}

std::string byte_order(const StateDict& sd) {
  return sd.big_endian_source() ? "big-endian (storages byte-swapped to little-endian on load)"
                                : "little-endian";
}

// Wraps `text` at 90 columns, each line indented by `indent` spaces.
std::string wrap(std::string_view text, std::size_t indent) {
  constexpr std::size_t kWidth = 90;
  std::string out, line(indent, ' ');
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t sp = std::min(text.find(' ', i), text.size());
    const std::string_view word = text.substr(i, sp - i);
    if (line.size() > indent && line.size() + 1 + word.size() > kWidth) {
      out += line + "\n";
      line.assign(indent, ' ');
    }
    if (line.size() > indent) line += ' ';
    line += word;
    i = sp + 1;
  }
  return out + line + "\n";
}

// The loader's message, then the class of refusal in plain words.
void print_refusal(std::FILE* out, const Status& s) {
  const std::string msg = message_of(s);
  const RefusalClass& c = classify_refusal(msg);
  std::fprintf(out, "REFUSED: %s\n\nWhat this means [%.*s: %.*s]:\n%s", msg.c_str(),
               static_cast<int>(c.id.size()), c.id.data(), static_cast<int>(c.title.size()),
               c.title.data(), wrap(explain_refusal(c, msg), 2).c_str());
}

int refused_json(const Options& o, const Status& s) {
  const std::string msg = message_of(s);
  const RefusalClass& c = classify_refusal(msg);
  const nlohmann::ordered_json j = {{"file", o.file},
                                    {"ok", false},
                                    {"error", msg},
                                    {"refusal_class", std::string(c.id)},
                                    {"explanation", explain_refusal(c, msg)}};
  std::printf("%s\n",
              j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  return kExitRefused;
}

int ls_json(const Options& o, const StateDict& sd) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& [name, t] : sd.tensors()) {
    rows.push_back({{"name", name},
                    {"dtype", std::string(t.dtype_name())},
                    {"shape", std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end())},
                    {"strides", std::vector<std::int64_t>(t.strides().begin(), t.strides().end())},
                    {"storage_offset", t.storage_offset()},
                    {"numel", t.numel()},
                    {"bytes", json_count(view_bytes(t))},
                    {"storage", t.storage().key},
                    {"contiguous", t.is_contiguous()},
                    {"requires_grad", t.requires_grad()}});
  }
  const Totals tot = totals_of(sd);
  const nlohmann::ordered_json j = {{"file", o.file},
                                    {"ok", true},
                                    {"big_endian", sd.big_endian_source()},
                                    {"tensors", std::move(rows)},
                                    {"totals",
                                     {{"tensors", tot.tensors},
                                      {"numel", json_count(tot.numel)},
                                      {"bytes", json_count(tot.bytes)},
                                      {"storages", tot.storages},
                                      {"storage_bytes", json_count(tot.storage_bytes)}}}};
  std::printf("%s\n",
              j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  return kExitOk;
}

int ls_table(const StateDict& sd) {
  struct Row {
    std::string name, dtype, shape, numel, bytes;
  };
  std::vector<Row> rows;
  rows.push_back({"name", "dtype", "shape", "numel", "bytes"});
  for (const auto& [name, t] : sd.tensors())
    rows.push_back({name.empty() ? "<top-level tensor>" : printable(name),
                    std::string(t.dtype_name()), shape_text(t.sizes()), count_str(t.numel()),
                    count_str(view_bytes(t))});
  std::size_t w[5] = {};
  for (const Row& r : rows) {
    const std::string* cells[] = {&r.name, &r.dtype, &r.shape, &r.numel, &r.bytes};
    for (int i = 0; i < 5; ++i) w[i] = std::max(w[i], cells[i]->size());
  }
  for (const Row& r : rows)
    std::printf("%-*s  %-*s  %-*s  %*s  %*s\n", static_cast<int>(w[0]), r.name.c_str(),
                static_cast<int>(w[1]), r.dtype.c_str(), static_cast<int>(w[2]), r.shape.c_str(),
                static_cast<int>(w[3]), r.numel.c_str(), static_cast<int>(w[4]), r.bytes.c_str());
  const Totals t = totals_of(sd);
  std::printf("\n%zu tensors, %s elements, %s bytes (%s; numel x itemsize of each view)\n",
              t.tensors, count_str(t.numel).c_str(), count_str(t.bytes).c_str(),
              human_bytes(t.bytes).c_str());
  std::printf("%zu storages, %s bytes (%s)%s\n", t.storages, count_str(t.storage_bytes).c_str(),
              human_bytes(t.storage_bytes).c_str(),
              t.storages < t.tensors ? "; tensors share storages (views of one another)" : "");
  std::printf("byte order: %s\n", byte_order(sd).c_str());
  return kExitOk;
}

int run_ls(Args args) {
  Options o;
  if (int rc = parse("ls", args, /*allow_json=*/true, /*allow_repeat=*/false, o); rc >= 0)
    return rc;
  auto sd = StateDict::open(o.file, o.load);
  if (!sd.ok()) {
    if (o.json) return refused_json(o, sd.status());
    print_refusal(stderr, sd.status());
    return kExitRefused;
  }
  return o.json ? ls_json(o, *sd) : ls_table(*sd);
}

int run_check(Args args) {
  Options o;
  if (int rc = parse("check", args, /*allow_json=*/false, /*allow_repeat=*/true, o); rc >= 0)
    return rc;
  ptload::LoadOptions opts = o.load;
  opts.verify_checksums = true;
  const std::uint64_t opens = std::max<std::uint64_t>(o.repeat, 1);
  std::vector<double> seconds;
  std::optional<Result<StateDict>> opened;
  for (std::uint64_t i = 0; i < opens; ++i) {
    opened.reset();  // the previous open is released outside the timed region
    const auto t0 = std::chrono::steady_clock::now();
    opened.emplace(StateDict::open(o.file, opts));
    const auto t1 = std::chrono::steady_clock::now();
    if (!opened->ok()) break;
    seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  if (!opened->ok()) {
    print_refusal(stdout, opened->status());
    return kExitRefused;
  }
  const StateDict& sd = **opened;
  if (o.repeat > 0) {
    struct stat st {};
    ::stat(o.file.c_str(), &st);
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted.size() % 2
                              ? sorted[sorted.size() / 2]
                              : (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]) / 2;
    std::string list;
    for (std::size_t i = 0; i < seconds.size(); ++i) {
      std::printf("open %zu/%zu: %.3f ms\n", i + 1, seconds.size(), seconds[i] * 1e3);
      list += strf("%s%.9f", i ? "," : "", seconds[i]);
    }
    // One line for scripts (bench/python/pt_load_bench.py reads it).
    std::printf(
        "timing: opens=%zu file_bytes=%lld median_s=%.9f min_s=%.9f seconds=%s "
        "(each open maps the file, parses zip and pickle and verifies the CRC-32 of "
        "every record: every byte is read)\n",
        seconds.size(), static_cast<long long>(st.st_size), median, sorted.front(), list.c_str());
  }
  const Totals t = totals_of(sd);
  std::printf("OK  %s: %zu tensors, %s elements, %s in %zu storages, %s; %s\n", o.file.c_str(),
              t.tensors, count_str(t.numel).c_str(), human_bytes(t.storage_bytes).c_str(),
              t.storages, sd.big_endian_source() ? "big-endian" : "little-endian",
              sd.crc_unverified()
                  ? "NOT verified: every CRC-32 field of the archive is 0 (saved with "
                    "torch.serialization.set_crc32_options(False)), loaded with --allow-zero-crc"
                  : "CRC-32 of every record verified");
  return kExitOk;
}

constexpr Command kPtCommands[] = {
    {"ls", "[--json] FILE", "list every tensor: name, dtype, shape, numel, bytes; then totals",
     "Opens FILE (a torch.save .pt file) without torch and without running any of its pickle.\n"
     "Bytes are each view's numel x itemsize; 'storages' counts distinct data records, fewer\n"
     "than the tensors when views share one. --json prints the same as JSON (also the strides,\n"
     "storage offset, storage key, contiguity and requires_grad of each tensor).\n"
     "Exit 0 listed, 1 the file was refused (reason and explanation on stderr), 2 usage error,\n"
     "3 out of memory.\n\nLimits (each N > 0) and checksums:\n" CRUCIBLE_PT_LIMIT_HELP,
     run_ls, nullptr},
    {"check", "FILE", "verify the file loads safely (CRC-32 checked); explain any refusal",
     "Prints 'OK' and a summary, exit 0; or the loader's refusal and what that class of\n"
     "refusal means and what to do, exit 1. Exit 2 on usage errors (missing file, bad option),\n"
     "3 out of memory.\n"
     "--repeat N (for benchmarks): opens the file N times and prints each open's wall time\n"
     "and a 'timing:' line with opens, file_bytes, median_s, min_s and seconds=.\n"
     "\nLimits (each N > 0) and checksums:\n" CRUCIBLE_PT_LIMIT_HELP,
     run_check, nullptr},
};
static_assert(std::size(kPtCommands) == 2, "misc/CLI.md documents every pt subcommand");
#undef CRUCIBLE_PT_LIMIT_HELP

}  // namespace

std::span<const Command> pt_commands() { return kPtCommands; }

}  // namespace crucible::cli
