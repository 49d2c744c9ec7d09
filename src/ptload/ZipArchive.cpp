// ZipArchive.cpp — central directory parser and validator; inflate through zlib, CRC-32 by
// libdeflate.
#include "crucible/ptload/ZipArchive.h"

#include <libdeflate.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "crucible/core/Contract.h"

namespace crucible::ptload {
namespace {

constexpr std::uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50,
                        kZip64EndSig = 0x06064b50, kZip64LocatorSig = 0x07064b50;
constexpr std::size_t kLocalSize = 30, kCentralSize = 46, kEndSize = 22, kZip64EndSize = 56,
                      kZip64LocatorSize = 20;
constexpr std::size_t kMaxComment = 0xFFFF;
// Deflate's best case is one 258-byte match per 2 bits: at most 1032 output bytes per input
// byte, plus one match for the stream's last partial byte. A larger declared size is a lie (and
// would make us allocate it), so it is refused before inflating.
constexpr std::uint64_t kMaxDeflateRatio = 1032, kDeflateSlack = 258;
// General-purpose flag bits: 0 encrypted, 6 strong encryption, 13 encrypted central directory.
constexpr std::uint16_t kEncryptedFlags = (1u << 0) | (1u << 6) | (1u << 13);

// Reads little-endian integers from a bounded span; callers check bounds first.
template <class T>
T le(std::span<const std::byte> b, std::uint64_t at) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<T>(static_cast<T>(std::to_integer<std::uint8_t>(b[at + i])) << (8 * i));
  return v;
}

Status bad(std::uint64_t offset, const std::string& what) {
  return invalid_input("pt zip: " + what + " (at byte offset " + std::to_string(offset) + ")",
                       "the file is corrupt, truncated or crafted; re-save it with torch.save "
                       "and copy it again");
}

bool fits(std::span<const std::byte> b, std::uint64_t at, std::uint64_t len) {
  return at <= b.size() && len <= b.size() - at;
}

// Why a name is unsafe to use as a path, or empty when it is fine.
std::string unsafe_name_reason(std::string_view n) {
  if (n.empty()) return "an empty entry name";
  if (n.find('\0') != std::string_view::npos) return "a NUL byte in entry name";
  if (n.find('\\') != std::string_view::npos)
    return "a backslash in entry name '" + std::string(n) + "'";
  if (n.front() == '/') return "absolute entry name '" + std::string(n) + "'";
  std::size_t start = 0;
  while (start <= n.size()) {
    const std::size_t end = std::min(n.find('/', start), n.size());
    const std::string_view part = n.substr(start, end - start);
    if (part == "..") return "path traversal ('..') in entry name '" + std::string(n) + "'";
    if (part == "." || (part.empty() && end != n.size()))
      return "an empty or '.' path component in entry name '" + std::string(n) + "'";
    start = end + 1;
  }
  return {};
}

struct Central {
  std::uint64_t entries = 0, size = 0, offset = 0;
  std::uint64_t end_of_region = 0;  // where the central directory must end by
};

Result<Central> find_central(std::span<const std::byte> b) {
  if (b.size() < kEndSize)
    return bad(0, "file of " + std::to_string(b.size()) +
                      " bytes is too short for a zip end record (22 bytes)");
  // The end record is the last 22 bytes plus a comment of up to 65535 bytes. The one whose
  // comment length reaches exactly the end of the file is taken, scanning from the end.
  const std::uint64_t last = b.size() - kEndSize;
  const std::uint64_t first = last > kMaxComment ? last - kMaxComment : 0;
  std::uint64_t eocd = std::numeric_limits<std::uint64_t>::max();
  for (std::uint64_t p = last + 1; p-- > first;) {
    if (le<std::uint32_t>(b, p) == kEndSig &&
        p + kEndSize + le<std::uint16_t>(b, p + 20) == b.size()) {
      eocd = p;
      break;
    }
  }
  if (eocd == std::numeric_limits<std::uint64_t>::max())
    return bad(b.size(), "no zip end-of-central-directory record in the last 65557 bytes");
  const auto disk = le<std::uint16_t>(b, eocd + 4), cd_disk = le<std::uint16_t>(b, eocd + 6);
  const auto n_disk = le<std::uint16_t>(b, eocd + 8), n_total = le<std::uint16_t>(b, eocd + 10);
  Central c;
  c.entries = n_total;
  c.size = le<std::uint32_t>(b, eocd + 12);
  c.offset = le<std::uint32_t>(b, eocd + 16);
  c.end_of_region = eocd;
  const bool zip64 = n_total == 0xFFFF || c.size == 0xFFFFFFFF || c.offset == 0xFFFFFFFF;
  if (!zip64) {
    if (disk != 0 || cd_disk != 0 || n_disk != n_total)
      return bad(eocd, "multi-disk zip (disk " + std::to_string(disk) + ")");
  } else {
    if (eocd < kZip64LocatorSize ||
        le<std::uint32_t>(b, eocd - kZip64LocatorSize) != kZip64LocatorSig)
      return bad(eocd, "end record says ZIP64 but no ZIP64 locator precedes it");
    const std::uint64_t loc = eocd - kZip64LocatorSize;
    if (le<std::uint32_t>(b, loc + 4) != 0 || le<std::uint32_t>(b, loc + 16) != 1)
      return bad(loc, "multi-disk ZIP64 locator");
    const std::uint64_t rec = le<std::uint64_t>(b, loc + 8);
    if (rec > loc || loc - rec < kZip64EndSize)
      return bad(loc, "ZIP64 end record offset " + std::to_string(rec) +
                          " does not end before its locator");
    if (le<std::uint32_t>(b, rec) != kZip64EndSig)
      return bad(rec, "missing ZIP64 end record signature");
    const std::uint64_t rec_size = le<std::uint64_t>(b, rec + 4);
    if (rec_size < kZip64EndSize - 12 || rec_size > loc - rec - 12)
      return bad(rec,
                 "ZIP64 end record size " + std::to_string(rec_size) + " overlaps its locator");
    if (le<std::uint32_t>(b, rec + 16) != 0 || le<std::uint32_t>(b, rec + 20) != 0 ||
        le<std::uint64_t>(b, rec + 24) != le<std::uint64_t>(b, rec + 32))
      return bad(rec, "multi-disk ZIP64 end record");
    c.entries = le<std::uint64_t>(b, rec + 32);
    c.size = le<std::uint64_t>(b, rec + 40);
    c.offset = le<std::uint64_t>(b, rec + 48);
    c.end_of_region = rec;
  }
  if (c.offset > c.end_of_region || c.size > c.end_of_region - c.offset)
    return bad(c.end_of_region, "central directory [" + std::to_string(c.offset) + ", +" +
                                    std::to_string(c.size) + ") lies outside the file");
  if (c.entries > c.size / kCentralSize)
    return bad(c.end_of_region, std::to_string(c.entries) +
                                    " entries cannot fit a central directory of " +
                                    std::to_string(c.size) + " bytes");
  return c;
}

// Applies the ZIP64 extended-information extra field (id 1) to the fields that hold 0xFFFFFFFF.
Status apply_zip64_extra(std::span<const std::byte> b, std::uint64_t at, std::uint64_t len,
                         ZipEntry& e, bool need_u, bool need_c, bool need_o) {
  std::uint64_t p = at;
  const std::uint64_t end = at + len;
  bool found = false;
  while (p < end) {
    if (end - p < 4) return bad(p, "extra field header runs past the extra area");
    const auto id = le<std::uint16_t>(b, p), sz = le<std::uint16_t>(b, p + 2);
    if (sz > end - p - 4)
      return bad(p, "extra field of " + std::to_string(sz) + " bytes runs past the extra area");
    if (id == 0x0001) {
      if (found) return bad(p, "two ZIP64 extra fields in one entry");
      found = true;
      std::uint64_t q = p + 4;
      const std::uint64_t need = 8u * (need_u + need_c + need_o);
      if (sz < need) return bad(p, "ZIP64 extra field too short for the sizes it must hold");
      if (need_u) {
        e.uncompressed_size = le<std::uint64_t>(b, q);
        q += 8;
      }
      if (need_c) {
        e.compressed_size = le<std::uint64_t>(b, q);
        q += 8;
      }
      if (need_o) {
        e.local_header_offset = le<std::uint64_t>(b, q);
        q += 8;
      }
    }
    p += 4 + static_cast<std::uint64_t>(sz);
  }
  if ((need_u || need_c || need_o) && !found)
    return bad(at, "entry sizes say ZIP64 but there is no ZIP64 extra field");
  return ok_status();
}

}  // namespace

Result<ZipArchive> ZipArchive::parse(std::span<const std::byte> b, const ZipOptions& options) {
  auto central = find_central(b);
  if (!central.ok()) return central.status();
  const Central c = *central;
  ZipArchive z;
  z.bytes_ = b;
  z.entries_.reserve(static_cast<std::size_t>(c.entries));
  std::uint64_t p = c.offset;
  const std::uint64_t cd_end = c.offset + c.size;
  for (std::uint64_t i = 0; i < c.entries; ++i) {
    if (cd_end - p < kCentralSize)
      return bad(p, "central directory entry " + std::to_string(i) + " is truncated");
    if (le<std::uint32_t>(b, p) != kCentralSig)
      return bad(p, "bad central directory entry signature");
    const auto flags = le<std::uint16_t>(b, p + 8);
    ZipEntry e;
    e.method = le<std::uint16_t>(b, p + 10);
    e.crc32 = le<std::uint32_t>(b, p + 16);
    e.compressed_size = le<std::uint32_t>(b, p + 20);
    e.uncompressed_size = le<std::uint32_t>(b, p + 24);
    const std::uint64_t nlen = le<std::uint16_t>(b, p + 28), xlen = le<std::uint16_t>(b, p + 30),
                        clen = le<std::uint16_t>(b, p + 32);
    const auto disk = le<std::uint16_t>(b, p + 34);
    e.local_header_offset = le<std::uint32_t>(b, p + 42);
    if (cd_end - p - kCentralSize < nlen + xlen + clen)
      return bad(p, "central directory entry " + std::to_string(i) +
                        " name/extra/comment run past the directory");
    e.name.assign(reinterpret_cast<const char*>(b.data() + p + kCentralSize), nlen);
    if (auto why = unsafe_name_reason(e.name); !why.empty()) return bad(p, why);
    if (flags & kEncryptedFlags) return bad(p, "entry '" + e.name + "' is encrypted");
    if (e.method != 0 && e.method != 8)
      return bad(p, "entry '" + e.name + "' uses compression method " + std::to_string(e.method) +
                        " (only stored 0 and deflate 8 are read)");
    if (disk != 0 && disk != 0xFFFF) return bad(p, "entry '" + e.name + "' is on another disk");
    CRUCIBLE_RETURN_IF_ERROR(
        apply_zip64_extra(b, p + kCentralSize + nlen, xlen, e, e.uncompressed_size == 0xFFFFFFFF,
                          e.compressed_size == 0xFFFFFFFF, e.local_header_offset == 0xFFFFFFFF));
    if (e.stored() && e.compressed_size != e.uncompressed_size)
      return bad(p, "stored entry '" + e.name + "' has compressed size " +
                        std::to_string(e.compressed_size) + " != uncompressed size " +
                        std::to_string(e.uncompressed_size));
    // The local header must be where the directory says, inside the file, before the directory.
    const std::uint64_t lh = e.local_header_offset;
    if (lh > c.offset || c.offset - lh < kLocalSize || le<std::uint32_t>(b, lh) != kLocalSig)
      return bad(lh, "entry '" + e.name +
                         "' has no local header at its offset (or it lies outside the file)");
    const std::uint64_t lnlen = le<std::uint16_t>(b, lh + 26),
                        lxlen = le<std::uint16_t>(b, lh + 28);
    if (le<std::uint16_t>(b, lh + 8) != e.method ||
        (le<std::uint16_t>(b, lh + 6) & kEncryptedFlags))
      return bad(lh, "local header of '" + e.name +
                         "' disagrees with the central directory (method or encryption)");
    if (lnlen != nlen || c.offset - lh - kLocalSize < lnlen + lxlen ||
        std::memcmp(b.data() + lh + kLocalSize, e.name.data(), nlen) != 0)
      return bad(lh, "local header name of '" + e.name + "' disagrees with the central directory");
    e.data_offset = lh + kLocalSize + lnlen + lxlen;
    if (e.compressed_size > c.offset - e.data_offset)
      return bad(e.data_offset, "data of '" + e.name + "' (" + std::to_string(e.compressed_size) +
                                    " bytes) runs past the start of the central directory at " +
                                    std::to_string(c.offset));
    if (e.method == 8 && e.uncompressed_size > e.compressed_size * kMaxDeflateRatio + kDeflateSlack)
      return bad(p, "entry '" + e.name + "' claims " + std::to_string(e.uncompressed_size) +
                        " bytes from " + std::to_string(e.compressed_size) +
                        " deflated bytes, more than deflate can produce (1032:1)");
    z.entries_.push_back(std::move(e));
    p += kCentralSize + nlen + xlen + clen;
  }
  // No two entries may share bytes: sorted by offset, each must end before the next begins.
  std::vector<const ZipEntry*> by_offset;
  by_offset.reserve(z.entries_.size());
  for (const auto& e : z.entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const ZipEntry* a, const ZipEntry* b2) {
    return a->local_header_offset < b2->local_header_offset;
  });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const ZipEntry& prev = *by_offset[i - 1];
    if (by_offset[i]->local_header_offset < prev.data_offset + prev.compressed_size)
      return bad(by_offset[i]->local_header_offset,
                 "entries '" + prev.name + "' and '" + by_offset[i]->name + "' overlap");
  }
  std::sort(z.entries_.begin(), z.entries_.end(),
            [](const ZipEntry& a, const ZipEntry& b2) { return a.name < b2.name; });
  for (std::size_t i = 1; i < z.entries_.size(); ++i)
    if (z.entries_[i].name == z.entries_[i - 1].name)
      return bad(z.entries_[i].local_header_offset,
                 "duplicate entry name '" + z.entries_[i].name + "'");
  z.all_crc_zero_ =
      !z.entries_.empty() && std::all_of(z.entries_.begin(), z.entries_.end(),
                                         [](const ZipEntry& e) { return e.crc32 == 0; });
  z.options_ = options;
  return z;
}

const ZipEntry* ZipArchive::find(std::string_view name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const ZipEntry& e, std::string_view n) { return e.name < n; });
  return it != entries_.end() && it->name == name ? &*it : nullptr;
}

std::span<const std::byte> ZipArchive::stored_view(const ZipEntry& e) const {
  CRUCIBLE_PRE(e.stored(), "stored_view() is for stored entries; use extract() for deflate");
  CRUCIBLE_PRE(fits(bytes_, e.data_offset, e.compressed_size), "entry from another archive");
  return bytes_.subspan(e.data_offset, e.compressed_size);
}

// Note [Archives without checksums]
// torch.save under torch.serialization.set_crc32_options(False) (PyTorch 2.x) writes 0 in every
// CRC-32 field instead of computing it, to save time on large files. Such an archive carries no
// checksum at all: check_crc() says so instead of reporting a plain mismatch (which reads as
// damage), and names the two ways on: re-save with crc32 on, or accept it unverified with
// ZipOptions::allow_zero_crc. That option skips verification only when every entry's field is
// 0; a single 0 among real checksums is a mismatch like any other.
Status ZipArchive::check_crc(const ZipEntry& e, std::span<const std::byte> data) const {
  if (crc_unverified()) return ok_status();
  // zlib's crc32 (reflected 0xEDB88320, pre- and post-inverted), 3.4x as fast: every stored
  // record is checked on open, so this is most of StateDict::open's time on a large file.
  const std::uint32_t crc = ::libdeflate_crc32(0, data.data(), data.size());
  if (crc != e.crc32) {
    char buf[64];
    if (all_crc_zero_) {
      std::snprintf(buf, sizeof buf, "0x%08x", crc);
      return invalid_input(
          "pt zip: entry '" + e.name + "' cannot be verified: every CRC-32 field of this archive "
              "is 0, as torch.save writes under torch.serialization.set_crc32_options(False) "
              "(its data's CRC-32 is " + buf + ", at byte offset " +
              std::to_string(e.data_offset) + ")",
          "re-save it with torch.serialization.set_crc32_options(True), or, if you trust this "
          "copy, load it unverified with " + std::string(options_.allow_zero_crc_option));
    }
    std::snprintf(buf, sizeof buf, "CRC-32 0x%08x, directory says 0x%08x", crc, e.crc32);
    return bad(e.data_offset, "entry '" + e.name + "' fails its checksum: " + buf);
  }
  return ok_status();
}

// Note [Inflation limits]
// A deflated record can inflate 1032:1: a 1 MB file can hold a 1 GB data.pkl of zeros, and a
// reader that allocates the declared size before inflating holds 1 GB before it finds the
// pickle is junk (or dies of std::bad_alloc under a memory limit). torch.save stores every record
// uncompressed, so deflate only appears in re-zipped files; real pickles deflate about 5:1 and
// real weights under 2:1. extract() therefore refuses, before allocating anything:
//   - an entry whose declared uncompressed size is over InflateLimits::max_bytes (StateDict sets
//     LoadOptions::max_pickle_bytes, 64 MiB by default, for data.pkl: a pickle is about 200
//     bytes a tensor, so a million-tensor state dict fits);
//   - a deflated entry of more than 1 MiB whose declared size is over max_ratio times its
//     compressed size (LoadOptions::max_inflate_ratio, 100:1 by default).
// The declared size is the most inflate may write: the output is bounded by it, so the checks on
// the declared size bound what is produced too. Capacity for it is reserved (address space; pages
// are committed as inflate writes them), so a record that declares more than it holds costs
// only what it holds.
namespace {

Status check_limits(const ZipEntry& e, const InflateLimits& limits) {
  auto raise = [](std::string_view option) {
    return option.empty() ? std::string("re-save it with torch.save (which stores records "
                                        "uncompressed)")
                          : "if you trust the file, raise " + std::string(option);
  };
  if (e.uncompressed_size > limits.max_bytes)
    return exhausted("pt zip: entry '" + e.name + "' is " + std::to_string(e.uncompressed_size) +
                         " bytes uncompressed, over the limit of " +
                         std::to_string(limits.max_bytes) + " bytes (from " +
                         std::to_string(e.compressed_size) + " bytes in the file, at byte offset " +
                         std::to_string(e.data_offset) + ")",
                     "no state dict needs that much; the file is likely a decompression bomb; " +
                         raise(limits.max_bytes_option));
  std::uint64_t allowed = 0;  // compressed * max_ratio; past 2^64 nothing is over it
  if (!e.stored() && e.uncompressed_size > InflateLimits::kRatioExemptBytes &&
      !__builtin_mul_overflow(e.compressed_size, limits.max_ratio, &allowed) &&
      e.uncompressed_size > allowed)
    return exhausted(
        "pt zip: entry '" + e.name + "' inflates " + std::to_string(e.compressed_size) +
            " bytes to " + std::to_string(e.uncompressed_size) + " (" +
            std::to_string(e.uncompressed_size / std::max<std::uint64_t>(e.compressed_size, 1)) +
            ":1), over the limit of " + std::to_string(limits.max_ratio) +
            ":1 on the compression ratio (at byte offset " + std::to_string(e.data_offset) + ")",
        "torch.save stores records uncompressed and real data deflates far less; the file is "
        "likely a decompression bomb; " +
            raise(limits.max_ratio_option));
  return ok_status();
}

}  // namespace

Result<std::vector<std::byte>> ZipArchive::extract(const ZipEntry& e,
                                                   const InflateLimits& limits) const {
  CRUCIBLE_PRE(fits(bytes_, e.data_offset, e.compressed_size), "entry from another archive");
  CRUCIBLE_RETURN_IF_ERROR(check_limits(e, limits));
  std::vector<std::byte> out;
  if (e.stored()) {
    const auto v = stored_view(e);
    out.assign(v.begin(), v.end());
  } else {
    // Reserved, not resized: the pages of the declared size are committed chunk by chunk as
    // inflate fills them (Note [Inflation limits]); data() never moves while size <= capacity.
    const auto declared = static_cast<std::size_t>(e.uncompressed_size);
    out.reserve(declared);
    z_stream zs{};
    if (inflateInit2(&zs, -15) != Z_OK)
      return exhausted("zlib inflateInit2 failed", "free memory and retry");
    // zlib counts in 32-bit uInt: input is fed in chunks of at most 1 GiB, output space is
    // added 1 MiB at a time (each chunk zero-filled by resize, then overwritten by inflate).
    constexpr std::uint64_t kInChunk = 1u << 30;
    constexpr std::size_t kOutChunk = 1u << 20;
    std::uint64_t in_done = 0;
    Bytef empty_out = 0;  // zlib refuses a null next_out even when nothing is to be written
    zs.next_out = &empty_out;
    int rc = Z_OK;
    while (rc == Z_OK) {
      if (zs.avail_in == 0 && in_done < e.compressed_size) {
        const std::uint64_t n = std::min(kInChunk, e.compressed_size - in_done);
        zs.next_in = reinterpret_cast<Bytef*>(
            const_cast<std::byte*>(bytes_.data() + e.data_offset + in_done));
        zs.avail_in = static_cast<uInt>(n);
        in_done += n;
      }
      if (zs.avail_out == 0 && out.size() < declared) {
        const std::size_t at = out.size(), n = std::min(kOutChunk, declared - at);
        out.resize(at + n);
        CRUCIBLE_ASSERT(out.capacity() == declared, "the reserved buffer never moves");
        zs.next_out = reinterpret_cast<Bytef*>(out.data() + at);
        zs.avail_out = static_cast<uInt>(n);
      }
      if (zs.avail_in == 0 && zs.avail_out == 0) break;  // sizes exhausted, stream not ended
      rc = inflate(&zs, Z_NO_FLUSH);
    }
    const std::uint64_t produced = out.size() - zs.avail_out;
    const bool input_left = zs.avail_in != 0 || in_done < e.compressed_size;
    const char* zmsg = zs.msg;
    inflateEnd(&zs);
    if (rc != Z_STREAM_END) {
      if (rc == Z_OK || rc == Z_BUF_ERROR)
        return bad(e.data_offset, "deflate data of '" + e.name + "' does not end within its " +
                                      std::to_string(e.compressed_size) +
                                      " bytes / declared size " +
                                      std::to_string(e.uncompressed_size));
      return bad(e.data_offset, "deflate data of '" + e.name + "' is corrupt: " +
                                    (zmsg ? zmsg : "zlib error " + std::to_string(rc)));
    }
    if (produced != e.uncompressed_size || input_left)
      return bad(e.data_offset, "deflate data of '" + e.name + "' inflates to " +
                                    std::to_string(produced) + " bytes, directory says " +
                                    std::to_string(e.uncompressed_size) +
                                    (input_left ? " (and input is left over)" : ""));
  }
  CRUCIBLE_RETURN_IF_ERROR(check_crc(e, out));
  return out;
}

}  // namespace crucible::ptload
