// fuzz_pt_pickle.cpp — libFuzzer harness for the restricted pickle VM alone (the data.pkl
// bytes), with a resolver that hands out float32 storages of the requested size, so fuzzed
// tensors reach TensorView's extent checks and materialize_f32.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_set>
#include <vector>

#include "crucible/core/ScalarType.h"
#include "crucible/ptload/Unpickler.h"

namespace {
using namespace crucible::ptload;

// Storages past 1 Mi elements are refused like a missing record, keeping runs fast; so is any
// storage once one input's storages reach 64 MiB in all. A real file holds each storage's
// bytes (StateDict's resolver maps zip records), where this resolver makes them up: 400
// 8-MiB storages from 14 bytes each took 3 GB.
constexpr std::uint64_t kMaxFuzzNumel = 1u << 20, kMaxFuzzStorageBytes = 64u << 20;
std::uint64_t storage_bytes = 0;  // of this input

crucible::Result<std::shared_ptr<const TensorStorage>> resolve(const StorageRequest& r) {
  if (r.numel > kMaxFuzzNumel) return crucible::invalid_input("fuzz: storage too large", "smaller");
  const std::uint32_t item = *crucible::element_size(r.dtype);
  storage_bytes += r.numel * item;
  if (storage_bytes > kMaxFuzzStorageBytes)
    return crucible::invalid_input("fuzz: storages too large in all", "fewer");
  auto held = std::make_shared<std::vector<std::byte>>(r.numel * item, std::byte{0x3c});
  auto s = std::make_shared<TensorStorage>();
  s->key = std::string(r.key);
  s->dtype = r.dtype;
  s->numel = r.numel;
  s->bytes = *held;
  s->owner = held;
  return std::shared_ptr<const TensorStorage>(std::move(s));
}

// Reads every value once: shared containers (a DAG of 2^k paths in k nodes, which the VM
// builds in linear time) are visited once each, by the address of their items.
void touch(const PickleValue& v, int depth, std::unordered_set<const void*>& seen) {
  if (depth > 300) __builtin_trap();  // the VM caps nesting at 256
  switch (v.kind()) {
    case PickleValue::Kind::Tensor:
      if (seen.insert(&v.as_tensor()).second) (void)v.as_tensor().materialize_f32();
      break;
    case PickleValue::Kind::Tuple:
    case PickleValue::Kind::List:
    case PickleValue::Kind::Set:
      if (v.items().empty() || !seen.insert(v.items().data()).second) break;
      for (const auto& i : v.items()) touch(i, depth + 1, seen);
      break;
    case PickleValue::Kind::Dict:
      if (v.entries().empty() || !seen.insert(v.entries().data()).second) break;
      for (const auto& [k, val] : v.entries()) {
        touch(k, depth + 1, seen);
        touch(val, depth + 1, seen);
      }
      break;
    default:
      break;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A 64 MiB budget: under libFuzzer's 2 GB RSS limit with room for ASan, so an input that
  // outgrows it is a budget that leaks, not a slow run.
  UnpickleLimits limits;
  limits.max_memory_bytes = std::uint64_t{64} << 20;
  UnpickleStats stats;
  storage_bytes = 0;
  auto r = unpickle(std::as_bytes(std::span<const std::uint8_t>(data, size)), resolve, limits,
                    &stats);
  if (stats.result_bytes > stats.memory_bytes) __builtin_trap();
  if (r.ok() && stats.memory_bytes > limits.max_memory_bytes) __builtin_trap();  // checked first
  if (r.ok()) {
    std::unordered_set<const void*> seen;
    touch(*r, 0, seen);
  }
  return 0;
}
