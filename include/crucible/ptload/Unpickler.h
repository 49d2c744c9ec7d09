// Unpickler.h — a restricted pickle VM for the data.pkl of a torch.save file.
//
// Not a Python unpickler: it cannot import or call anything. It runs exactly the protocol-2
// opcodes torch.load(weights_only=True) allows (PROTO STOP GLOBAL REDUCE NEWOBJ BUILD MARK TUPLE
// TUPLE1-3 EMPTY_{TUPLE,LIST,DICT,SET} APPEND(S) SETITEM(S) NONE NEWTRUE NEWFALSE BININT BININT1
// BININT2 LONG1 BINFLOAT BINUNICODE SHORT_BINSTRING BINPERSID BINGET LONG_BINGET BINPUT
// LONG_BINPUT); GLOBAL is an exact lookup in a fixed table (collections.OrderedDict,
// torch._utils._rebuild_tensor_v2 / _rebuild_parameter / _rebuild_parameter_with_state,
// torch.<T>Storage for the ten supported dtypes, torch.Size, torch.<dtype>), and
// REDUCE/NEWOBJ/BUILD apply only to the callables that table marks as such. Anything else —
// another opcode, another global, SETITEM on a non-dict, a malformed persistent id, a memo
// miss, a stack underflow, a length past the end — is an error naming the data.pkl offset and
// the reason. A failed run returns only the error. See Note [Why an arena] in Unpickler.cpp.
// Memory is bounded by UnpickleLimits::max_memory_bytes, and nesting by max_depth: the VM's
// loop is iterative, and only the conversion to PickleValues (depth-capped) recurses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "crucible/core/Status.h"
#include "crucible/ptload/PickleValue.h"
#include "crucible/ptload/TensorStorage.h"

namespace crucible::ptload {

// What malloc adds to each heap block (glibc, 64-bit): the memory budget's estimates of what a
// string or vector costs count it (Note [Unpickler memory budget], Unpickler.cpp).
inline constexpr std::uint64_t kHeapBlockBytes = 16;

// A BINPERSID ('storage', torch.<T>Storage, key, location, numel), already checked for shape.
struct StorageRequest {
  std::string_view key;
  std::string_view location;
  std::int8_t dtype;
  std::uint64_t numel;
};
// Maps a request to the record's bytes; must check numel * itemsize against the record size.
using StorageResolver =
    std::function<Result<std::shared_ptr<const TensorStorage>>(const StorageRequest&)>;

struct UnpickleLimits {
  // Nesting of containers in the result. Real checkpoints nest 2-4 deep; the cap bounds the
  // recursion that turns the VM's objects into PickleValues (about 200 bytes of stack a level).
  std::size_t max_depth = 256;
  // Heap bytes the VM and its result may hold: objects, stack, MARKs, memo, dict keys, item
  // lists, then the PickleValue tree (Note [Unpickler memory budget] in Unpickler.cpp). Each
  // growth is charged before it is allocated; past the limit the run is refused with what was in
  // use. torch.save's pickles take 2-3 KB a tensor (resnet18: 302 KiB).
  std::uint64_t max_memory_bytes = std::uint64_t{256} << 20;
  // How the caller raises max_memory_bytes, named in the refusal.
  std::string_view max_memory_option = "UnpickleLimits::max_memory_bytes";
};

// What a run charged to UnpickleLimits::max_memory_bytes (nothing is released before it ends,
// so this is also the peak).
struct UnpickleStats {
  std::uint64_t memory_bytes = 0;  // VM and result together
  std::uint64_t result_bytes = 0;  // the part the returned PickleValue tree keeps
};

// `stats`, when given, is filled whether or not the run succeeds.
Result<PickleValue> unpickle(std::span<const std::byte> pickle, const StorageResolver& storages,
                             const UnpickleLimits& limits = {}, UnpickleStats* stats = nullptr);

}  // namespace crucible::ptload
