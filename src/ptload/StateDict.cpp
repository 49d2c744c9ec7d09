// StateDict.cpp — ties the zip reader, the storage records and the restricted unpickler together.
#include "crucible/ptload/StateDict.h"

#include <algorithm>
#include <unordered_set>

#include "crucible/core/Contract.h"
#include "crucible/core/ScalarType.h"
#include "crucible/ptload/MappedFile.h"
#include "crucible/ptload/Unpickler.h"
#include "crucible/ptload/ZipArchive.h"

namespace crucible::ptload {
namespace {

constexpr std::string_view kResave = "re-save it with torch.save in a current PyTorch";
// How a caller raises each limit, named in the refusal.
constexpr std::string_view kRaisePickle =
    "LoadOptions::max_pickle_bytes (crucible pt: --max-pickle-bytes N)";
constexpr std::string_view kRaiseRatio =
    "LoadOptions::max_inflate_ratio (crucible pt: --max-inflate-ratio N)";
constexpr std::string_view kRaiseMemory =
    "LoadOptions::max_pickle_memory (crucible pt: --max-pickle-memory N)";
constexpr std::string_view kAllowZeroCrc =
    "LoadOptions::allow_zero_crc (crucible pt: --allow-zero-crc)";
static_assert(LoadOptions{}.max_pickle_memory == UnpickleLimits{}.max_memory_bytes,
              "one default for the unpickler's memory");
// What one listed tensor holds beyond its name and dims: its NamedTensor in the list and the
// name's node in the duplicate check (Note [Unpickler memory budget] in Unpickler.cpp).
constexpr std::uint64_t kListedTensorBytes = sizeof(NamedTensor) + 64;
// "little" or "big": a longer record is refused before it is read.
constexpr std::uint64_t kMaxByteorderBytes = 6;

// Walking the tree to list tensors visits shared subtrees once per path, so a crafted DAG could
// ask for 2^depth visits. Real trees are visited about once per pickle byte or less: the budget
// is 16 visits per pickle byte (plus 4096 for tiny pickles), each byte of a dict key's text
// made on the way counting as one; past it the load is refused.
constexpr std::uint64_t kVisitsPerPickleByte = 16, kMinVisits = 4096;

Status in_file(const Status& s, std::string_view path) {
  return Status(s.code(), std::string(path) + ": " + message_of(s));
}

void swap_bytes(std::vector<std::byte>& v, std::uint32_t item) {
  if (item == 1) return;
  for (std::size_t i = 0; i + item <= v.size(); i += item)
    std::reverse(v.begin() + i, v.begin() + i + item);
}

// Lists the tensors of the tree. One path buffer is extended and cut back as the walk goes down
// and up, so a deep tree of long keys holds one path, not one per level; each listed tensor's
// name and dims are charged to what is left of the memory budget.
struct Flattener {
  std::vector<NamedTensor>& out;
  std::unordered_set<std::string> names;
  std::uint64_t visits_left;
  std::uint64_t memory_left;
  std::uint64_t memory_limit;
  std::string path;

  Status charge(std::uint64_t bytes) {
    if (bytes <= memory_left) {
      memory_left -= bytes;
      return ok_status();
    }
    return exhausted("pt: listing the tensors would take unpickling memory over the limit of " +
                         std::to_string(memory_limit) + " bytes (" + std::to_string(out.size()) +
                         " tensors listed so far, the latest named with " +
                         std::to_string(path.size()) + " bytes)",
                     "if you trust the file, raise " + std::string(kRaiseMemory));
  }

  Status walk(const PickleValue& v) {
    if (visits_left-- == 0)
      return exhausted(
          "pt: listing the tensors revisits shared containers too often (a crafted "
          "object graph?)",
          "load root() and walk it yourself, or re-save the file "
          "without shared nested containers");
    auto child = [&](std::string_view part, const PickleValue& c) {
      const std::size_t keep = path.size();
      if (!path.empty()) path += '.';
      path += part;
      Status s = walk(c);
      path.resize(keep);
      return s;
    };
    switch (v.kind()) {
      case PickleValue::Kind::Tensor: {
        const TensorView& t = v.as_tensor();
        const std::uint64_t name_bytes = path.size() > 15 ? path.size() + 1 + kHeapBlockBytes : 0;
        CRUCIBLE_RETURN_IF_ERROR(charge(
            kListedTensorBytes + 2 * name_bytes +
            (t.ndim() ? 2 * (t.ndim() * sizeof(std::int64_t) + kHeapBlockBytes) : 0) +
            (out.size() == out.capacity() ? out.capacity() * sizeof(NamedTensor) : 0)));
        if (!names.insert(path).second)
          return invalid_input(
              "pt: two tensors are both named '" + path + "' ('.'-joined keys collide)",
              "re-save with keys that stay unique when joined with '.'");
        out.push_back(NamedTensor{path, t});
        return ok_status();
      }
      case PickleValue::Kind::Tuple:
      case PickleValue::Kind::List:
      case PickleValue::Kind::Set: {
        const auto items = v.items();
        for (std::size_t i = 0; i < items.size(); ++i)
          CRUCIBLE_RETURN_IF_ERROR(child(std::to_string(i), items[i]));
        return ok_status();
      }
      case PickleValue::Kind::Dict: {
        // A key's text is made at each visit: its length counts as visits, so a large key in a
        // dict reached by many paths (2 bytes of pickle each) is bounded by the same budget.
        auto keyed = [&](const PickleValue& k, const PickleValue& val) {
          const std::string part = k.repr();
          if (part.size() > visits_left)
            visits_left = 0;
          else
            visits_left -= part.size();
          return child(part, val);
        };
        for (const auto& [k, val] : v.entries()) CRUCIBLE_RETURN_IF_ERROR(keyed(k, val));
        if (v.attributes().is(PickleValue::Kind::Dict))
          for (const auto& [k, val] : v.attributes().entries())
            CRUCIBLE_RETURN_IF_ERROR(keyed(k, val));
        return ok_status();
      }
      default:
        return ok_status();
    }
  }
};

}  // namespace

Result<StateDict> StateDict::open(const std::string& path, const LoadOptions& options) {
  auto file = MappedFile::open(path);
  if (!file.ok()) return file.status();
  auto sd = from_bytes((*file)->bytes(), *file, options);
  if (!sd.ok()) return in_file(sd.status(), path);
  return sd;
}

Result<StateDict> StateDict::from_bytes(std::span<const std::byte> bytes,
                                        std::shared_ptr<const void> owner,
                                        const LoadOptions& options) {
  auto starts = [&](std::string_view magic) {
    return bytes.size() >= magic.size() &&
           std::memcmp(bytes.data(), magic.data(), magic.size()) == 0;
  };
  if (!starts("PK\x03\x04")) {
    if (starts("\x80"))
      return unsupported(
          "pt: a legacy (PyTorch < 1.6, non-zip) torch.save file: its pickle stream "
          "is not read here (at byte offset 0)",
          std::string(kResave) + " (torch.save writes the zip format by default since 1.6)");
    return invalid_input("pt: not a torch.save zip archive: no zip local header at byte offset 0",
                         "pass a file written by torch.save (PyTorch >= 1.6)");
  }
  ZipOptions zip_options;
  zip_options.allow_zero_crc = options.allow_zero_crc;
  zip_options.allow_zero_crc_option = kAllowZeroCrc;
  auto zip = ZipArchive::parse(bytes, zip_options);
  if (!zip.ok()) return zip.status();
  const auto& entries = zip->entries();
  if (entries.empty())
    return invalid_input("pt: the zip archive is empty", "pass a file written by torch.save");

  // Every record lives under one folder, <archive>/ (torch names it after the file).
  const std::string& first = entries.front().name;
  const auto slash = first.find('/');
  if (slash == std::string::npos)
    return invalid_input("pt: entry '" + first +
                             "' is not inside an archive folder (at byte offset " +
                             std::to_string(entries.front().local_header_offset) + ")",
                         "pass a file written by torch.save");
  const std::string prefix = first.substr(0, slash + 1);
  for (const auto& e : entries) {
    if (e.name.compare(0, prefix.size(), prefix) != 0)
      return invalid_input("pt: entry '" + e.name + "' is outside the archive folder '" + prefix +
                               "' (at byte offset " + std::to_string(e.local_header_offset) + ")",
                           "pass a file written by torch.save");
    if (e.name.compare(prefix.size(), 5, "code/") == 0 || e.name == prefix + "constants.pkl")
      return unsupported(
          "pt: a TorchScript archive (torch.jit.save; entry '" + e.name + "' at byte offset " +
              std::to_string(e.local_header_offset) + "): it holds code, which is never run here",
          "load it with torch.jit.load in PyTorch, then torch.save(model.state_dict(), path)");
  }

  bool big = false;
  if (const ZipEntry* bo = zip->find(prefix + "byteorder")) {
    if (bo->uncompressed_size > kMaxByteorderBytes)
      return invalid_input("pt: byteorder record is " + std::to_string(bo->uncompressed_size) +
                               " bytes (at byte offset " + std::to_string(bo->data_offset) +
                               "), not 'little' or 'big'",
                           std::string(kResave));
    auto text = zip->extract(*bo);
    if (!text.ok()) return text.status();
    const std::string_view s(reinterpret_cast<const char*>(text->data()), text->size());
    if (s == "big") {
      big = true;
    } else if (s != "little") {
      std::string shown;
      for (char c : s.substr(0, 32)) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
      return invalid_input("pt: byteorder record says '" + shown + "' (at byte offset " +
                               std::to_string(bo->data_offset) + "), not 'little' or 'big'",
                           std::string(kResave));
    }
  }

  const ZipEntry* pkl = zip->find(prefix + "data.pkl");
  if (pkl == nullptr)
    return invalid_input("pt: no '" + prefix + "data.pkl' record in the archive",
                         "pass a file written by torch.save");
  InflateLimits limits;
  limits.max_ratio = options.max_inflate_ratio;
  limits.max_ratio_option = kRaiseRatio;
  InflateLimits pickle_limits = limits;
  pickle_limits.max_bytes = options.max_pickle_bytes;
  pickle_limits.max_bytes_option = kRaisePickle;
  auto pickle = zip->extract(*pkl, pickle_limits);
  if (!pickle.ok()) return pickle.status();

  const ZipArchive& z = *zip;
  StorageResolver resolve =
      [&](const StorageRequest& r) -> Result<std::shared_ptr<const TensorStorage>> {
    const std::string name = prefix + "data/" + std::string(r.key);
    const ZipEntry* e = z.find(name);
    if (e == nullptr)
      return invalid_input("storage record '" + name + "' named by the pickle is missing",
                           "the file is truncated or crafted; " + std::string(kResave));
    const std::uint32_t item = *element_size(r.dtype);
    std::uint64_t want = 0;
    if (__builtin_mul_overflow(r.numel, std::uint64_t{item}, &want) || want != e->uncompressed_size)
      return invalid_input("storage record '" + name + "' (at byte offset " +
                               std::to_string(e->data_offset) + ") holds " +
                               std::to_string(e->uncompressed_size) +
                               " bytes but the pickle says " + std::to_string(r.numel) +
                               " elements of " + std::string(scalar_type_info(r.dtype).name) +
                               " (" + std::to_string(item) + " bytes each)",
                           "the file is corrupt or crafted; " + std::string(kResave));
    auto s = std::make_shared<TensorStorage>();
    s->key = std::string(r.key);
    s->location = std::string(r.location);
    s->dtype = r.dtype;
    s->numel = r.numel;
    if (e->stored() && !big) {
      s->bytes = z.stored_view(*e);
      if (options.verify_checksums) CRUCIBLE_RETURN_IF_ERROR(z.check_crc(*e, s->bytes));
      s->owner = owner;
    } else {
      auto copy = z.extract(*e, limits);
      if (!copy.ok()) return copy.status();
      if (big) swap_bytes(*copy, item);
      auto held = std::make_shared<std::vector<std::byte>>(std::move(*copy));
      s->bytes = *held;
      s->owner = held;
    }
    return std::shared_ptr<const TensorStorage>(std::move(s));
  };
  UnpickleLimits unpickle_limits;
  unpickle_limits.max_memory_bytes = options.max_pickle_memory;
  unpickle_limits.max_memory_option = kRaiseMemory;
  UnpickleStats used;
  auto root = unpickle(*pickle, resolve, unpickle_limits, &used);
  if (!root.ok()) return root.status();

  StateDict sd;
  sd.root_ = std::move(*root);
  sd.big_endian_ = big;
  sd.crc_unverified_ = zip->crc_unverified();
  // The VM is gone; the tree stays beside the list.
  Flattener f{sd.tensors_,
              {},
              kMinVisits + kVisitsPerPickleByte * pickle->size(),
              options.max_pickle_memory - std::min(options.max_pickle_memory, used.result_bytes),
              options.max_pickle_memory,
              {}};
  CRUCIBLE_RETURN_IF_ERROR(f.walk(sd.root_));
  return sd;
}

const TensorView* StateDict::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t.tensor;
  return nullptr;
}

}  // namespace crucible::ptload
