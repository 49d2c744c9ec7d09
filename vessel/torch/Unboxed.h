// Unboxed.h — registration of the unboxed recording kernels (Unboxed.cpp).
#pragma once

#include <cstddef>

namespace torch { class Library; }

namespace crucible::vessel::detail {
// Registers one typed recording kernel per hot op on `lib` (an IMPL library for "aten" on the
// recording key). Throws c10::Error if another kernel is registered there.
void register_unboxed(torch::Library& lib);
// The same hot ops with kernels that only exclude the key and redispatch, recording nothing:
// what the key alone costs (Note [Key floor], Dispatch.cpp).
void register_passthrough(torch::Library& lib);
std::size_t unboxed_op_count();
// Registers a fallthrough on the key for the composite ops of the hot models that this PyTorch
// decomposes above Autograd (Note [Composite fallthroughs]); registered with or without the
// typed kernels, so both record the same ops.
void register_composite_fallthroughs(torch::Library& lib);
std::size_t composite_fallthrough_count();
}  // namespace crucible::vessel::detail
