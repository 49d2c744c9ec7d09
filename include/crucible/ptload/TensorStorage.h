// TensorStorage.h — one storage record of a .pt file: typed bytes that tensors view.
//
// The bytes are either the memory map of a stored zip entry (no copy) or an owned buffer
// (inflated, or byte-swapped from a big-endian file). `owner` keeps whichever alive, so a
// TensorView stays valid after the StateDict that produced it is gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace crucible::ptload {

struct TensorStorage {
  std::string key;          // record name under <archive>/data/
  std::string location;     // as saved: "cpu", "cuda:0", ... (data is always on CPU here)
  std::int8_t dtype = 0;    // c10::ScalarType ordinal
  std::uint64_t numel = 0;  // elements; bytes.size() == numel * itemsize
  std::span<const std::byte> bytes;
  std::shared_ptr<const void> owner;  // the MappedFile or the owned copy
};

}  // namespace crucible::ptload
