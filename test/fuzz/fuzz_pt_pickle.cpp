// fuzz_pt_pickle.cpp — libFuzzer harness for the restricted pickle VM alone (the data.pkl
// bytes), with a resolver that hands out float32 storages of the requested size, so fuzzed
// tensors reach TensorView's extent checks and materialize_f32.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "crucible/core/ScalarType.h"
#include "crucible/ptload/Unpickler.h"

namespace {
using namespace crucible::ptload;

// Storages past 1 Mi elements are refused like a missing record, keeping runs fast.
constexpr std::uint64_t kMaxFuzzNumel = 1u << 20;

crucible::Result<std::shared_ptr<const TensorStorage>> resolve(const StorageRequest& r) {
  if (r.numel > kMaxFuzzNumel) return crucible::invalid_input("fuzz: storage too large", "smaller");
  const std::uint32_t item = *crucible::element_size(r.dtype);
  auto held = std::make_shared<std::vector<std::byte>>(r.numel * item, std::byte{0x3c});
  auto s = std::make_shared<TensorStorage>();
  s->key = std::string(r.key);
  s->dtype = r.dtype;
  s->numel = r.numel;
  s->bytes = *held;
  s->owner = held;
  return std::shared_ptr<const TensorStorage>(std::move(s));
}

void touch(const PickleValue& v, int depth) {
  if (depth > 300) __builtin_trap();  // the VM caps nesting at 256
  switch (v.kind()) {
    case PickleValue::Kind::Tensor:
      (void)v.as_tensor().materialize_f32();
      break;
    case PickleValue::Kind::Tuple:
    case PickleValue::Kind::List:
    case PickleValue::Kind::Set:
      for (const auto& i : v.items()) touch(i, depth + 1);
      break;
    case PickleValue::Kind::Dict:
      for (const auto& [k, val] : v.entries()) {
        touch(k, depth + 1);
        touch(val, depth + 1);
      }
      break;
    default:
      break;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto r = unpickle(std::as_bytes(std::span<const std::uint8_t>(data, size)), resolve);
  if (r.ok()) touch(*r, 0);
  return 0;
}
