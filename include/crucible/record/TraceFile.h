// TraceFile.h — write and read .crtrace files (format: misc/CRTRACE.md).
//
// The reader treats its input as untrusted: every count, offset and length is checked before
// use, so a truncated or corrupted file yields an error naming the offset and the problem,
// never undefined behaviour (fuzzed by test/record/fuzz_trace_file.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/record/Trace.h"

namespace crucible::record {

inline constexpr std::uint32_t kTraceFormatVersion = 1;
// The reader refuses module paths past these (a model's paths are a few levels and tens of
// bytes; module regions grow with depth: MerkleDag.cpp, misc/CRUCIBLE.md).
inline constexpr std::size_t kMaxModulePathBytes = std::size_t{1} << 16;
inline constexpr std::size_t kMaxModuleLevels = 256;
// Whether a .crtrace file can hold module path `path`: an error naming its size, depth and the
// bounds above when not. Recorder::intern_module refuses such a path with this error, so that
// nothing recorded is refused later by export.
Status check_module_path(std::string_view path);

std::vector<std::byte> encode_trace(const Trace& t);
Result<Trace> decode_trace(std::span<const std::byte> bytes);

// Atomic write: to path + ".tmp", then rename, so a crash never leaves half a trace.
Status save_trace(const Trace& t, const std::string& path);
// Writes bytes to path + ".tmp" and renames it over path, so that a failed write (a full disk)
// leaves no partial file; errors start with `what`. A path with a NUL in it is refused.
Status write_file_replacing(const std::string& path, std::span<const std::byte> bytes, std::string_view what);
Result<Trace> load_trace(const std::string& path);

}  // namespace crucible::record
