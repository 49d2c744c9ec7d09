// ZipArchive.h — a validating reader of the ZIP container torch.save writes (untrusted input).
//
// The central directory is parsed here; deflate is zlib's inflate (raw, windowBits -15).
// Every entry is checked before any is used: local header present and agreeing with the central
// one, data inside the file and before the central directory, no two entries overlapping, no
// duplicate names, no path traversal ("..", absolute, backslash, NUL), no encryption, method
// stored or deflate only, sizes that cannot overflow. ZIP64 (files over 4 GiB) is supported:
// the ZIP64 end record, its locator and the per-entry extra field are validated like the rest.
// Errors name the byte offset and the reason. Inflating is bounded (InflateLimits): see
// Note [Inflation limits] in ZipArchive.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/core/Status.h"

namespace crucible::ptload {

struct ZipEntry {
  std::string name;
  std::uint64_t local_header_offset = 0;
  std::uint64_t data_offset = 0;  // first byte of the (compressed) data
  std::uint64_t compressed_size = 0;
  std::uint64_t uncompressed_size = 0;
  std::uint32_t crc32 = 0;
  std::uint16_t method = 0;  // 0 stored, 8 deflate
  bool stored() const { return method == 0; }
};

// What extracting one entry may produce, checked before any output is allocated. A limit that is
// hit is an error naming what was found, the limit and `*_option` (how the caller raises it).
struct InflateLimits {
  // Uncompressed bytes of the entry (stored or deflated).
  std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max();
  std::string_view max_bytes_option;
  // Uncompressed : compressed bytes of a deflated entry, applied to entries that inflate to more
  // than kRatioExemptBytes.
  std::uint64_t max_ratio = std::numeric_limits<std::uint64_t>::max();
  std::string_view max_ratio_option;
  // Entries this small inflate into memory that does not matter, while small zero-filled
  // buffers (a bias, a step counter) deflate over 1000:1: they are not held to max_ratio.
  static constexpr std::uint64_t kRatioExemptBytes = 1u << 20;
};

struct ZipOptions {
  // Accept an archive whose every CRC-32 field is 0 (torch.save under
  // torch.serialization.set_crc32_options(False)) without verifying any entry. Off, such an
  // archive fails check_crc() with a message saying why. See Note [Archives without checksums].
  bool allow_zero_crc = false;
  std::string_view allow_zero_crc_option = "ZipOptions::allow_zero_crc";  // named in that message
};

class ZipArchive {
 public:
  // `bytes` must outlive the archive and every view it hands out.
  static Result<ZipArchive> parse(std::span<const std::byte> bytes,
                                  const ZipOptions& options = {});

  const std::vector<ZipEntry>& entries() const { return entries_; }
  // nullptr when absent. Names are compared exactly (case-sensitive).
  const ZipEntry* find(std::string_view name) const;

  // The stored bytes of a stored entry, in place (no copy, no checksum).
  std::span<const std::byte> stored_view(const ZipEntry& e) const;
  // CRC-32 of `data` against the entry's recorded checksum (nothing to check when
  // crc_unverified()).
  Status check_crc(const ZipEntry& e, std::span<const std::byte> data) const;
  // Every entry's CRC-32 field is 0: written without checksums.
  bool all_crc_zero() const { return all_crc_zero_; }
  // all_crc_zero() and ZipOptions::allow_zero_crc: no checksum is verified.
  bool crc_unverified() const { return all_crc_zero_ && options_.allow_zero_crc; }
  // A copy of the uncompressed bytes (inflated for deflate), checksum verified. The entry's
  // declared size is checked against `limits` first; inflating never writes past it, and memory
  // is committed as output arrives, so a record that lies about its size costs no more.
  Result<std::vector<std::byte>> extract(const ZipEntry& e, const InflateLimits& limits = {}) const;

 private:
  std::span<const std::byte> bytes_;
  std::vector<ZipEntry> entries_;  // sorted by name, for find()
  bool all_crc_zero_ = false;
  ZipOptions options_;
};

}  // namespace crucible::ptload
