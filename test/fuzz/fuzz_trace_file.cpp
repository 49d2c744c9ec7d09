// fuzz_trace_file.cpp — libFuzzer harness for the .crtrace reader (untrusted bytes).
// Any crash, sanitizer report or contract violation is a bug; errors are the expected outcome.
#include <cstddef>
#include <cstdint>

#include "crucible/record/TraceFile.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto r = crucible::record::decode_trace(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size));
  if (r.ok()) {
    // Whatever the reader accepts must be safe to walk through every accessor.
    for (std::size_t op = 0; op < r->num_ops(); ++op) {
      for (const auto& m : r->inputs(op)) (void)r->strides(r->tensor_index(&m));
      for (const auto& m : r->outputs(op)) (void)r->sizes(r->tensor_index(&m));
      (void)r->scalars_of(op);
      (void)r->schema_name(r->ops[op].schema_hash);
      (void)r->module_path(r->ops[op].module_id);
    }
    // And must re-encode to the same bytes it came from.
    auto again = crucible::record::encode_trace(*r);
    auto back = crucible::record::decode_trace(again);
    if (!back.ok() || !(*back == *r)) __builtin_trap();
  }
  return 0;
}
