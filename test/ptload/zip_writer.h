// zip_writer.h — builds small ZIP archives in memory for the ptload tests and fuzz seeds.
//
// Test-only: stored or raw-deflate entries (or deflated zeros: bombs), optional archive comment,
// no ZIP64. Real fixtures come from torch (make_fixtures.py); this covers what C++ tests build
// byte by byte.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::ptload::test {

struct ZipItem {
  std::string name;
  std::string data;
  bool deflate = false;
  // > 0: the entry is this many zero bytes, deflated 1 MiB at a time (`data` and `deflate` are
  // not used): a decompression bomb without holding what it inflates to.
  std::uint64_t zeros = 0;
  // Write 0 in the CRC-32 fields, as torch.save does under set_crc32_options(False).
  bool zero_crc = false;
};

inline void put16(std::string& o, std::uint32_t v) {
  o += char(v & 0xFF);
  o += char((v >> 8) & 0xFF);
}
inline void put32(std::string& o, std::uint32_t v) {
  put16(o, v & 0xFFFF);
  put16(o, v >> 16);
}

inline std::string raw_deflate(std::string_view in) {
  z_stream zs{};
  deflateInit2(&zs, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, static_cast<uLong>(in.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// Raw deflate of `n` zero bytes (about n / 1030 bytes out) and their CRC-32, never holding more
// than 1 MiB of input.
inline std::string raw_deflate_zeros(std::uint64_t n, std::uint32_t& crc) {
  const std::string chunk(1u << 20, '\0');
  z_stream zs{};
  deflateInit2(&zs, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
  std::string out;
  char buf[1u << 16];
  crc = 0;
  for (std::uint64_t left = n;;) {
    const auto take = static_cast<uInt>(std::min<std::uint64_t>(left, chunk.size()));
    crc = static_cast<std::uint32_t>(
        crc32(crc, reinterpret_cast<const Bytef*>(chunk.data()), take));
    left -= take;
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(chunk.data()));
    zs.avail_in = take;
    const int flush = left == 0 ? Z_FINISH : Z_NO_FLUSH;
    int rc;
    do {
      zs.next_out = reinterpret_cast<Bytef*>(buf);
      zs.avail_out = sizeof buf;
      rc = deflate(&zs, flush);
      out.append(buf, sizeof buf - zs.avail_out);
    } while (zs.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
    if (left == 0) break;
  }
  deflateEnd(&zs);
  return out;
}

inline std::string make_zip(const std::vector<ZipItem>& items, std::string_view comment = {}) {
  std::string out, central;
  for (const auto& it : items) {
    std::uint32_t crc = 0;
    std::string payload;
    if (it.zeros > 0) {
      payload = raw_deflate_zeros(it.zeros, crc);
    } else {
      payload = it.deflate ? raw_deflate(it.data) : it.data;
      crc = static_cast<std::uint32_t>(crc32(
          0, reinterpret_cast<const Bytef*>(it.data.data()), static_cast<uInt>(it.data.size())));
    }
    if (it.zero_crc) crc = 0;
    const auto size = static_cast<std::uint32_t>(it.zeros > 0 ? it.zeros : it.data.size());
    const auto off = static_cast<std::uint32_t>(out.size());
    const std::uint32_t method = it.deflate || it.zeros > 0 ? 8 : 0;
    put32(out, 0x04034b50);
    put16(out, 20);
    put16(out, 0);
    put16(out, method);
    put32(out, 0);
    put32(out, crc);
    put32(out, static_cast<std::uint32_t>(payload.size()));
    put32(out, size);
    put16(out, static_cast<std::uint32_t>(it.name.size()));
    put16(out, 0);
    out += it.name;
    out += payload;
    put32(central, 0x02014b50);
    put16(central, 20);
    put16(central, 20);
    put16(central, 0);
    put16(central, method);
    put32(central, 0);
    put32(central, crc);
    put32(central, static_cast<std::uint32_t>(payload.size()));
    put32(central, size);
    put16(central, static_cast<std::uint32_t>(it.name.size()));
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);
    put32(central, 0);
    put32(central, off);
    central += it.name;
  }
  const auto cd_off = static_cast<std::uint32_t>(out.size());
  out += central;
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<std::uint32_t>(items.size()));
  put16(out, static_cast<std::uint32_t>(items.size()));
  put32(out, static_cast<std::uint32_t>(central.size()));
  put32(out, cd_off);
  put16(out, static_cast<std::uint32_t>(comment.size()));
  out += comment;
  return out;
}

// A torch.save-shaped archive around one pickle and float32 storages "0", "1", ...
inline std::string make_pt(std::string_view pickle,
                           const std::vector<std::vector<float>>& storages = {}) {
  std::vector<ZipItem> items{{"a/data.pkl", std::string(pickle)}};
  for (std::size_t i = 0; i < storages.size(); ++i)
    items.push_back(
        {"a/data/" + std::to_string(i),
         std::string(reinterpret_cast<const char*>(storages[i].data()), storages[i].size() * 4)});
  items.push_back({"a/version", "3\n"});
  return make_zip(items);
}

// Pickle snippets in torch.save's shape.
inline std::string uni(std::string_view s) {
  std::string o = "X";
  put32(o, static_cast<std::uint32_t>(s.size()));
  return o + std::string(s);
}
inline std::string global(std::string_view m, std::string_view n) {
  return "c" + std::string(m) + "\n" + std::string(n) + "\n";
}
// _rebuild_tensor_v2 of float32 storage `key` (numel elements) as a 1-d view of `size` from offset.
inline std::string tensor_f32(std::string_view key, int numel, int offset, int size) {
  auto i1 = [](int v) { return std::string("K") + char(v); };
  return global("torch._utils", "_rebuild_tensor_v2") + "((" + uni("storage") +
         global("torch", "FloatStorage") + uni(key) + uni("cpu") + i1(numel) + "tQ" + i1(offset) +
         i1(size) + "\x85" + i1(1) + "\x85" + "\x89" + global("collections", "OrderedDict") +
         ")RtR";
}

}  // namespace crucible::ptload::test
