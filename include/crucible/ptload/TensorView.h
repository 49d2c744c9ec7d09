// TensorView.h — a strided view of a .pt storage: dtype, sizes, strides, offset, bytes.
//
// Built only through make(), which checks what torch's own as_strided would assume: sizes,
// strides and offset are non-negative, and every element the view can address lies inside the
// storage, computed with overflow-checked 64-bit math. A view never copies; materialize_f32()
// does, into a contiguous float32 buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/ptload/TensorStorage.h"

namespace crucible::ptload {

// The dtypes a .pt storage may hold here: f32 f64 f16 bf16 i64 i32 i16 i8 u8 bool.
bool is_supported_dtype(std::int8_t c10_ordinal) noexcept;

class TensorView {
 public:
  // Tensors of more dimensions than this are refused (reported, not truncated): real weights
  // have 1-5, and a cap bounds the per-tensor work a crafted file can ask for.
  static constexpr std::size_t kMaxDims = 64;
  // A view may address an element more than once (a stride of 0: an expanded tensor) and so
  // hold more elements than its storage; beyond max(the storage's elements, this many) it is
  // refused: materializing it would cost memory and time out of proportion to the file (a
  // 106-byte pickle asked for 2^27 floats; sizes of 2^31 x 2^31 over one element).
  static constexpr std::int64_t kMaxExpandedNumel = std::int64_t{1} << 24;

  static Result<TensorView> make(std::shared_ptr<const TensorStorage> storage,
                                 std::int64_t storage_offset, std::vector<std::int64_t> sizes,
                                 std::vector<std::int64_t> strides, bool requires_grad);

  std::int8_t dtype() const { return storage_->dtype; }
  std::string_view dtype_name() const;  // "float32", "bfloat16", ...
  std::uint32_t itemsize() const { return itemsize_; }
  std::size_t ndim() const { return sizes_.size(); }
  std::span<const std::int64_t> sizes() const { return sizes_; }
  std::span<const std::int64_t> strides() const { return strides_; }  // in elements
  std::int64_t storage_offset() const { return offset_; }             // in elements
  std::int64_t numel() const { return numel_; }
  bool is_contiguous() const;
  bool requires_grad() const { return requires_grad_; }
  bool is_parameter() const { return is_parameter_; }

  // Element [0, ..., 0]: storage bytes + offset * itemsize. Not necessarily aligned to the
  // dtype (torch aligns records to 64 bytes, a crafted file need not): read with memcpy.
  const std::byte* data() const;
  const TensorStorage& storage() const { return *storage_; }
  const std::shared_ptr<const TensorStorage>& storage_ptr() const { return storage_; }

  // Every element converted to float32, in row-major (contiguous) order. bool is 0/1, integers
  // round to nearest like static_cast<float>.
  std::vector<float> materialize_f32() const;
  void materialize_f32(std::span<float> out) const;  // out.size() == numel()

  TensorView as_parameter(bool requires_grad) const;

 private:
  TensorView() = default;
  std::shared_ptr<const TensorStorage> storage_;
  std::vector<std::int64_t> sizes_, strides_;
  std::int64_t offset_ = 0, numel_ = 0;
  std::uint32_t itemsize_ = 0;
  bool requires_grad_ = false, is_parameter_ = false;
};

}  // namespace crucible::ptload
