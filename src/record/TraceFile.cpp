// TraceFile.cpp — .crtrace encoder and validating decoder.
#include "crucible/record/TraceFile.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string_view>

namespace crucible::record {

static_assert(std::endian::native == std::endian::little,
              ".crtrace is little-endian and written by memcpy: port the encoder to byte-swap "
              "before building on a big-endian host");

namespace {

constexpr char kMagic[8] = {'C', 'R', 'T', 'R', 'A', 'C', 'E', '\0'};
constexpr std::uint32_t kHeaderSize = 64;
constexpr std::uint32_t kSectionEntrySize = 32;
constexpr std::uint32_t kMaxSections = 16;

enum Section : std::uint32_t {
  kOps = 1, kTensors = 2, kDims = 3, kScalars = 4, kSchemaNames = 5, kModulePaths = 6,
  kThreadStats = 7, kExternals = 8,
};
constexpr int kNumSections = 8;

struct ExternalRecord {
  std::uint64_t storage_id;
  std::uint8_t kind;
  std::uint8_t reserved[7];
};
static_assert(sizeof(ExternalRecord) == 16);

struct Header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_size;
  std::uint32_t section_count;
  std::uint32_t flags;
  std::uint64_t file_size;
  std::uint64_t reserved[4];
};
static_assert(sizeof(Header) == kHeaderSize);

struct SectionEntry {
  std::uint32_t kind;
  std::uint32_t record_size;  // 1 for variable-length blobs
  std::uint64_t offset;
  std::uint64_t count;        // records (or names, for blobs)
  std::uint64_t byte_length;
};
static_assert(sizeof(SectionEntry) == kSectionEntrySize);

struct ThreadStatsRecord {
  std::uint32_t thread;
  std::uint32_t reserved0;
  std::uint64_t ops[kNumPhases];
  std::uint64_t dropped;
  std::uint64_t bytes;
  std::uint64_t waits;
  std::uint64_t reserved1;
};
static_assert(sizeof(ThreadStatsRecord) == 64);

void put(std::vector<std::byte>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}
template <class T>
void put_pod(std::vector<std::byte>& out, const T& v) { put(out, &v, sizeof v); }

// The reader's bounds on a module path (kMaxModulePathBytes, kMaxModuleLevels); levels are the
// path's dot-separated components, a leading '.' belonging to the first (as module regions count
// them).
std::size_t module_levels(std::string_view path) {
  return path.empty() ? 0
                      : 1 + static_cast<std::size_t>(std::count(path.begin() + 1, path.end(), '.'));
}
bool module_path_fits(std::string_view path) {
  return path.size() <= kMaxModulePathBytes && module_levels(path) <= kMaxModuleLevels;
}
std::string module_path_bounds() {
  return ".crtrace files hold paths of up to " + std::to_string(kMaxModulePathBytes) + " bytes and " +
         std::to_string(kMaxModuleLevels) + " levels";
}
Status check_module_path(std::string_view path, std::size_t index, const std::string& where) {
  if (module_path_fits(path)) return ok_status();
  return invalid_input("crtrace: module path " + std::to_string(index) + " is " +
                           std::to_string(path.size()) + " bytes and " +
                           std::to_string(module_levels(path)) + " levels deep (" + where + "); " +
                           module_path_bounds(),
                       "a model's module paths are a few levels deep: check where this trace came from");
}

Status corrupt(std::uint64_t offset, const std::string& what) {
  return invalid_input("crtrace: corrupt or truncated file: " + what + " (at byte offset " +
                           std::to_string(offset) + ")",
                       "re-export the trace; if it was copied, check the copy is complete");
}

}  // namespace

Status check_module_path(std::string_view path) {
  if (module_path_fits(path)) return ok_status();
  return invalid_input("module path '" + std::string(path.substr(0, 80)) + (path.size() > 80 ? "..." : "") +
                           "' is " + std::to_string(path.size()) + " bytes and " +
                           std::to_string(module_levels(path)) + " levels deep; " + module_path_bounds(),
                       "name the module (or its parents) with a shorter path, or do not track it");
}

std::vector<std::byte> encode_trace(const Trace& t) {
  std::vector<std::byte> names, modules, stats;
  for (const auto& [h, n] : t.schema_names) {
    put_pod(names, h);
    put_pod(names, static_cast<std::uint32_t>(n.size()));
    put(names, n.data(), n.size());
  }
  for (const auto& m : t.module_paths) {
    put_pod(modules, static_cast<std::uint32_t>(m.size()));
    put(modules, m.data(), m.size());
  }
  for (const auto& s : t.threads) {
    ThreadStatsRecord r{};
    r.thread = s.thread;
    for (int p = 0; p < kNumPhases; ++p) r.ops[p] = s.ops[p];
    r.dropped = s.dropped;
    r.bytes = s.bytes;
    r.waits = s.waits;
    put_pod(stats, r);
  }
  std::vector<std::byte> externals;
  std::vector<std::pair<std::uint64_t, ExternalKind>> sorted_externals(t.externals.begin(), t.externals.end());
  std::sort(sorted_externals.begin(), sorted_externals.end());  // the same file for the same trace
  for (const auto& [sid, kind] : sorted_externals) {
    ExternalRecord r{};
    r.storage_id = sid;
    r.kind = static_cast<std::uint8_t>(kind);
    put_pod(externals, r);
  }
  struct Part { Section kind; std::uint32_t rec; std::uint64_t count; const void* data; std::size_t len; };
  const Part parts[kNumSections] = {
      {kOps, sizeof(TraceEntry), t.ops.size(), t.ops.data(), t.ops.size() * sizeof(TraceEntry)},
      {kTensors, sizeof(TensorMeta), t.tensors.size(), t.tensors.data(), t.tensors.size() * sizeof(TensorMeta)},
      {kDims, 8, t.dims.size(), t.dims.data(), t.dims.size() * 8},
      {kScalars, sizeof(ScalarRecord), t.scalars.size(), t.scalars.data(), t.scalars.size() * sizeof(ScalarRecord)},
      {kSchemaNames, 1, t.schema_names.size(), names.data(), names.size()},
      {kModulePaths, 1, t.module_paths.size(), modules.data(), modules.size()},
      {kThreadStats, sizeof(ThreadStatsRecord), t.threads.size(), stats.data(), stats.size()},
      {kExternals, sizeof(ExternalRecord), t.externals.size(), externals.data(), externals.size()},
  };
  std::vector<std::byte> out;
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kTraceFormatVersion;
  h.header_size = kHeaderSize;
  h.section_count = kNumSections;
  std::uint64_t offset = kHeaderSize + kNumSections * kSectionEntrySize;
  std::vector<SectionEntry> table;
  for (const Part& p : parts) {
    offset = (offset + 63) & ~std::uint64_t{63};  // sections start on 64-byte boundaries
    table.push_back(SectionEntry{p.kind, p.rec, offset, p.count, p.len});
    offset += p.len;
  }
  h.file_size = offset;
  out.reserve(offset);
  put_pod(out, h);
  for (const auto& e : table) put_pod(out, e);
  for (std::size_t i = 0; i < kNumSections; ++i) {
    out.resize(table[i].offset, std::byte{0});
    put(out, parts[i].data, parts[i].len);
  }
  return out;
}

Result<Trace> decode_trace(std::span<const std::byte> in) {
  const std::uint64_t size = in.size();
  if (size < kHeaderSize) return corrupt(size, "file shorter than the 64-byte header");
  Header h;
  std::memcpy(&h, in.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0)
    return invalid_input("crtrace: not a .crtrace file (bad magic at offset 0)",
                         "pass a file written by crucible.export()");
  if (h.version != kTraceFormatVersion)
    return unsupported("crtrace: format version " + std::to_string(h.version) +
                           ", this build reads version " + std::to_string(kTraceFormatVersion),
                       "load it with the Crucible release that wrote it");
  if (h.header_size != kHeaderSize) return corrupt(12, "header size field is not 64");
  if (h.file_size != size)
    return corrupt(24, "header says " + std::to_string(h.file_size) + " bytes, file has " +
                           std::to_string(size));
  if (h.section_count > kMaxSections) return corrupt(16, "more than 16 sections");
  const std::uint64_t table_end = kHeaderSize + std::uint64_t{h.section_count} * kSectionEntrySize;
  if (table_end > size) return corrupt(kHeaderSize, "section table runs past the end");

  const SectionEntry* found[kNumSections + 1] = {};
  std::vector<SectionEntry> table(h.section_count);
  for (std::uint32_t i = 0; i < h.section_count; ++i) {
    const std::uint64_t at = kHeaderSize + std::uint64_t{i} * kSectionEntrySize;
    std::memcpy(&table[i], in.data() + at, kSectionEntrySize);
    const SectionEntry& e = table[i];
    if (e.kind < 1 || e.kind > kNumSections) continue;  // unknown sections are skipped
    if (found[e.kind] != nullptr) return corrupt(at, "section " + std::to_string(e.kind) + " appears twice");
    if (e.offset < table_end || e.offset > size || e.byte_length > size - e.offset)
      return corrupt(at, "section " + std::to_string(e.kind) + " lies outside the file");
    if (e.record_size == 0)
      return corrupt(at, "section " + std::to_string(e.kind) + " has record size 0");
    if (e.record_size != 1 && (e.count > e.byte_length / e.record_size ||
                               e.count * e.record_size != e.byte_length))
      return corrupt(at, "section " + std::to_string(e.kind) + " length is not count x record size");
    found[e.kind] = &e;
  }
  const std::uint32_t expect_rec[kNumSections + 1] = {0, sizeof(TraceEntry), sizeof(TensorMeta), 8,
                                                      sizeof(ScalarRecord), 1, 1, sizeof(ThreadStatsRecord),
                                                      sizeof(ExternalRecord)};
  for (int k = 1; k <= kNumSections; ++k) {
    if (found[k] == nullptr) return corrupt(kHeaderSize, "required section " + std::to_string(k) + " missing");
    if (found[k]->record_size != expect_rec[k])
      return corrupt(kHeaderSize, "section " + std::to_string(k) + " has record size " +
                                      std::to_string(found[k]->record_size));
  }

  Trace t;
  auto copy_records = [&](Section s, auto& vec) {
    const SectionEntry& e = *found[s];
    vec.resize(e.count);
    if (e.count != 0) std::memcpy(vec.data(), in.data() + e.offset, e.byte_length);
  };
  copy_records(kOps, t.ops);
  copy_records(kTensors, t.tensors);
  copy_records(kDims, t.dims);
  copy_records(kScalars, t.scalars);

  {  // schema names: (u64 hash, u32 len, bytes)*
    const SectionEntry& e = *found[kSchemaNames];
    std::uint64_t p = e.offset, end = e.offset + e.byte_length;
    for (std::uint64_t i = 0; i < e.count; ++i) {
      if (end - p < 12) return corrupt(p, "schema name entry truncated");
      std::uint64_t hash;
      std::uint32_t len;
      std::memcpy(&hash, in.data() + p, 8);
      std::memcpy(&len, in.data() + p + 8, 4);
      p += 12;
      if (len > end - p) return corrupt(p, "schema name longer than its section");
      t.schema_names[hash].assign(reinterpret_cast<const char*>(in.data() + p), len);
      p += len;
    }
    if (p != end) return corrupt(p, "trailing bytes in schema name section");
  }
  {  // module paths: (u32 len, bytes)*
    const SectionEntry& e = *found[kModulePaths];
    std::uint64_t p = e.offset, end = e.offset + e.byte_length;
    if (e.count > e.byte_length / 4) return corrupt(e.offset, "module path count exceeds section");
    for (std::uint64_t i = 0; i < e.count; ++i) {
      if (end - p < 4) return corrupt(p, "module path entry truncated");
      std::uint32_t len;
      std::memcpy(&len, in.data() + p, 4);
      p += 4;
      if (len > end - p) return corrupt(p, "module path longer than its section");
      // Module regions grow with a path's depth (one scope per level) and its runs: a bound
      // keeps a crafted path from costing more than its bytes many times over.
      const std::string_view path(reinterpret_cast<const char*>(in.data() + p), len);
      if (Status st = check_module_path(path, i, "at byte offset " + std::to_string(p)); !st.ok())
        return st;
      t.module_paths.emplace_back(path);
      p += len;
    }
    if (p != end) return corrupt(p, "trailing bytes in module path section");
    if (t.module_paths.empty() || !t.module_paths[0].empty())
      return corrupt(e.offset, "module path 0 must be the empty root path");
  }
  {
    std::vector<ThreadStatsRecord> recs;
    copy_records(kThreadStats, recs);
    for (const auto& r : recs) {
      ThreadStats s;
      s.thread = r.thread;
      for (int p = 0; p < kNumPhases; ++p) s.ops[p] = r.ops[p];
      s.dropped = r.dropped;
      s.bytes = r.bytes;
      s.waits = r.waits;
      t.threads.push_back(s);
    }
  }

  {
    std::vector<ExternalRecord> recs;
    copy_records(kExternals, recs);
    for (std::size_t i = 0; i < recs.size(); ++i) {
      if (recs[i].kind < 1 || recs[i].kind > kMaxExternalKind)
        return corrupt(found[kExternals]->offset + i * sizeof(ExternalRecord), "unknown external kind");
      t.externals[recs[i].storage_id] = static_cast<ExternalKind>(recs[i].kind);
    }
  }

  // Cross-check the records against each other and rebuild the derived offsets.
  const std::uint64_t ops_off = found[kOps]->offset;
  std::uint64_t tensor_i = 0, scalar_i = 0, dims_i = 0;
  t.op_tensor_begin.reserve(t.ops.size());
  t.op_scalar_begin.reserve(t.ops.size());
  t.tensor_dims_begin.reserve(t.tensors.size());
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    const TraceEntry& e = t.ops[i];
    const std::uint64_t at = ops_off + i * sizeof(TraceEntry);
    if (static_cast<std::uint8_t>(e.phase) >= kNumPhases) return corrupt(at, "op phase out of range");
    if (e.n_inputs > e.n_tensors) return corrupt(at, "op has more inputs than tensors");
    if (e.n_tensors > t.tensors.size() - tensor_i) return corrupt(at, "op tensors run past the tensor section");
    if (e.n_scalars > t.scalars.size() - scalar_i) return corrupt(at, "op scalars run past the scalar section");
    if (e.module_id >= t.module_paths.size()) return corrupt(at, "op module id has no path");
    t.op_tensor_begin.push_back(tensor_i);
    t.op_scalar_begin.push_back(scalar_i);
    std::uint64_t cells = 0;
    for (std::uint32_t k = 0; k < e.n_tensors; ++k, ++tensor_i) {
      const TensorMeta& m = t.tensors[tensor_i];
      if (2ull * m.ndim > t.dims.size() - dims_i)
        return corrupt(found[kTensors]->offset + tensor_i * sizeof(TensorMeta), "tensor dims run past the dims section");
      t.tensor_dims_begin.push_back(dims_i);
      dims_i += 2ull * m.ndim;
      cells += 1 + dims_cells(m.ndim);
    }
    if (cells != e.n_meta_cells) return corrupt(at, "op meta cell count disagrees with its tensors");
    for (std::uint32_t k = 0; k < e.n_scalars; ++k) {
      const ScalarRecord& s = t.scalars[scalar_i + k];
      if (static_cast<std::uint8_t>(s.kind) > static_cast<std::uint8_t>(ScalarKind::Unknown))
        return corrupt(found[kScalars]->offset + (scalar_i + k) * sizeof(ScalarRecord), "unknown scalar kind");
      if (s.kind == ScalarKind::ListBegin && s.aux > e.n_scalars - k - 1)
        return corrupt(found[kScalars]->offset + (scalar_i + k) * sizeof(ScalarRecord), "scalar list longer than its op");
    }
    scalar_i += e.n_scalars;
  }
  if (tensor_i != t.tensors.size()) return corrupt(found[kTensors]->offset, "tensors not referenced by any op");
  if (scalar_i != t.scalars.size()) return corrupt(found[kScalars]->offset, "scalars not referenced by any op");
  if (dims_i != t.dims.size()) return corrupt(found[kDims]->offset, "dims not referenced by any tensor");
  return t;
}

Status write_file_replacing(const std::string& path, std::span<const std::byte> bytes, std::string_view what) {
  if (path.find('\0') != std::string::npos)
    return invalid_input(std::string(what) + ": the path has a NUL character in it", "pass a path without one");
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return os_error(std::string(what) + ": cannot create " + tmp, errno);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int werr = errno;
  if (std::fclose(f) != 0 || !ok) {
    const int e = ok ? errno : werr;
    std::remove(tmp.c_str());
    return os_error(std::string(what) + ": cannot write " + tmp, e);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return os_error(std::string(what) + ": cannot rename " + tmp + " to " + path, e);
  }
  return ok_status();
}

Status save_trace(const Trace& t, const std::string& path) {
  for (std::size_t i = 0; i < t.module_paths.size(); ++i)  // what the reader would refuse
    if (Status st = check_module_path(t.module_paths[i], i, "not written to " + path); !st.ok())
      return st;
  return write_file_replacing(path, encode_trace(t), "crtrace");
}

Result<Trace> load_trace(const std::string& path) {
  if (path.find('\0') != std::string::npos)
    return invalid_input("crtrace: the path has a NUL character in it", "pass a path without one");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return os_error("crtrace: cannot open " + path, errno);
  std::vector<std::byte> bytes;
  std::byte buf[1 << 16];
  errno = 0;
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) != 0;) bytes.insert(bytes.end(), buf, buf + n);
  const bool err = std::ferror(f) != 0;
  const int read_errno = errno;  // fread sets it (EISDIR for a directory)
  std::fclose(f);
  if (err) return os_error("crtrace: cannot read " + path, read_errno != 0 ? read_errno : EIO);
  auto r = decode_trace(bytes);
  if (!r.ok()) return Status(r.status().code(), path + ": " + message_of(r.status()));
  return r;
}

}  // namespace crucible::record
