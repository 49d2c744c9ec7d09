// TensorView.cpp — extent checks and conversion to float32.
#include "crucible/ptload/TensorView.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "crucible/core/Contract.h"
#include "crucible/core/ScalarType.h"

namespace crucible::ptload {

static_assert(std::endian::native == std::endian::little,
              "views read storage bytes as host integers: .pt data is little-endian (big-endian "
              "files are swapped to little on load), so a big-endian host needs a swap here too");

bool is_supported_dtype(std::int8_t d) noexcept {
  using namespace dtype;
  switch (d) {
    case kFloat32:
    case kFloat64:
    case kFloat16:
    case kBFloat16:
    case kInt64:
    case kInt32:
    case kInt16:
    case kInt8:
    case kUInt8:
    case kBool:
      return true;
    default:
      return false;
  }
}

namespace {

Status bad_view(const TensorStorage& s, const std::string& what) {
  return invalid_input("pt tensor on storage '" + s.key + "': " + what,
                       "the file is corrupt or crafted; re-save it with torch.save");
}

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN payloads).
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float element_to_f32(std::int8_t d, const std::byte* p) {
  using namespace dtype;
  switch (d) {
    case kFloat32:
      return load<float>(p);
    case kFloat64:
      return static_cast<float>(load<double>(p));
    case kFloat16:
      return half_to_float(load<std::uint16_t>(p));
    case kBFloat16:
      return std::bit_cast<float>(static_cast<std::uint32_t>(load<std::uint16_t>(p)) << 16);
    case kInt64:
      return static_cast<float>(load<std::int64_t>(p));
    case kInt32:
      return static_cast<float>(load<std::int32_t>(p));
    case kInt16:
      return static_cast<float>(load<std::int16_t>(p));
    case kInt8:
      return static_cast<float>(load<std::int8_t>(p));
    case kUInt8:
      return static_cast<float>(load<std::uint8_t>(p));
    case kBool:
      return load<std::uint8_t>(p) != 0 ? 1.0f : 0.0f;
    default:
      CRUCIBLE_ASSERT(false, "dtype was checked in make()");
      return 0.0f;
  }
}

}  // namespace

Result<TensorView> TensorView::make(std::shared_ptr<const TensorStorage> storage,
                                    std::int64_t storage_offset, std::vector<std::int64_t> sizes,
                                    std::vector<std::int64_t> strides, bool requires_grad) {
  CRUCIBLE_PRE(storage != nullptr, "a view needs a storage");
  const TensorStorage& s = *storage;
  if (!is_supported_dtype(s.dtype))
    return unsupported("pt storage '" + s.key + "' has dtype " +
                           std::string(scalar_type_info(s.dtype).name) + ", which is not loaded",
                       "convert the tensor to float32, float16, bfloat16 or an integer type "
                       "before torch.save");
  const std::uint32_t item = *element_size(s.dtype);
  CRUCIBLE_PRE(s.bytes.size() / item == s.numel && s.bytes.size() % item == 0,
               "the storage resolver checks numel * itemsize against the record size");
  if (sizes.size() != strides.size())
    return bad_view(s, std::to_string(sizes.size()) + " sizes but " +
                           std::to_string(strides.size()) + " strides");
  if (sizes.size() > kMaxDims)
    return bad_view(s, std::to_string(sizes.size()) + " dimensions, more than the " +
                           std::to_string(kMaxDims) + " this loader accepts");
  if (storage_offset < 0)
    return bad_view(s, "negative storage offset " + std::to_string(storage_offset));
  // numel, and the last element the view reaches: offset + sum((size_i - 1) * stride_i).
  std::int64_t numel = 1, last = storage_offset;
  bool overflow = false;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0)
      return bad_view(s,
                      "negative size " + std::to_string(sizes[i]) + " in dim " + std::to_string(i));
    if (strides[i] < 0)
      return bad_view(
          s, "negative stride " + std::to_string(strides[i]) + " in dim " + std::to_string(i));
    overflow |= __builtin_mul_overflow(numel, sizes[i], &numel);
  }
  if (overflow) return bad_view(s, "the product of the sizes overflows 64 bits");
  const auto storage_numel = static_cast<std::int64_t>(s.numel);  // <= bytes, < 2^63
  if (numel > std::max(storage_numel, kMaxExpandedNumel))
    return unsupported("pt storage '" + s.key + "' is viewed with " + std::to_string(numel) +
                           " elements but holds " + std::to_string(storage_numel) +
                           " (an expanded or overlapping view); more than " +
                           std::to_string(kMaxExpandedNumel) + " such elements are not loaded",
                       "save the tensor with .contiguous() (or .clone()) before torch.save");
  if (numel == 0) {
    if (storage_offset > storage_numel)
      return bad_view(s, "storage offset " + std::to_string(storage_offset) +
                             " is past the storage's " + std::to_string(storage_numel) +
                             " elements");
  } else {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::int64_t reach = 0;
      overflow |= __builtin_mul_overflow(sizes[i] - 1, strides[i], &reach);
      overflow |= __builtin_add_overflow(last, reach, &last);
    }
    if (overflow) return bad_view(s, "offset + (size - 1) * stride overflows 64 bits");
    if (last >= storage_numel)
      return bad_view(s, "the view reaches element " + std::to_string(last) +
                             " but the storage has " + std::to_string(storage_numel) + " elements");
  }
  TensorView v;
  v.storage_ = std::move(storage);
  v.sizes_ = std::move(sizes);
  v.strides_ = std::move(strides);
  v.offset_ = storage_offset;
  v.numel_ = numel;
  v.itemsize_ = item;
  v.requires_grad_ = requires_grad;
  return v;
}

std::string_view TensorView::dtype_name() const { return scalar_type_info(dtype()).name; }

bool TensorView::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (strides_[i] != expected) return numel_ == 0;
    expected *= sizes_[i];
  }
  return true;
}

const std::byte* TensorView::data() const {
  // offset <= numel was checked, so this stays within (or one past) the storage bytes.
  return storage_->bytes.data() + static_cast<std::size_t>(offset_) * itemsize_;
}

TensorView TensorView::as_parameter(bool requires_grad) const {
  TensorView v = *this;
  v.is_parameter_ = true;
  v.requires_grad_ = requires_grad;
  return v;
}

std::vector<float> TensorView::materialize_f32() const {
  std::vector<float> out(static_cast<std::size_t>(numel_));
  materialize_f32(out);
  return out;
}

void TensorView::materialize_f32(std::span<float> out) const {
  CRUCIBLE_PRE(out.size() == static_cast<std::size_t>(numel_), "out must hold numel() floats");
  if (numel_ == 0) return;
  const std::byte* base = storage_->bytes.data();
  const std::int8_t d = dtype();
  if (is_contiguous() && d == dtype::kFloat32) {
    std::memcpy(out.data(), data(), out.size() * sizeof(float));
    return;
  }
  // Odometer over the indices: the innermost dimension runs in a tight loop.
  const std::size_t nd = sizes_.size();
  std::vector<std::int64_t> idx(nd, 0);
  const std::int64_t inner = nd ? sizes_[nd - 1] : 1, inner_stride = nd ? strides_[nd - 1] : 0;
  std::int64_t pos = offset_;  // element index of idx[0..nd-1) with inner index 0
  std::size_t o = 0;
  bool done = false;
  while (!done) {
    for (std::int64_t j = 0; j < inner; ++j)
      out[o++] =
          element_to_f32(d, base + static_cast<std::size_t>(pos + j * inner_stride) * itemsize_);
    // Advance the outer indices. Only (size - 1) * stride is ever added or removed: that much was
    // checked against the storage, while size * stride may overflow (a size-1 dim may carry any
    // stride).
    done = true;
    for (std::size_t k = nd > 0 ? nd - 1 : 0; k-- > 0;) {
      if (idx[k] + 1 < sizes_[k]) {
        ++idx[k];
        pos += strides_[k];
        done = false;
        break;
      }
      pos -= strides_[k] * (sizes_[k] - 1);
      idx[k] = 0;
    }
  }
  CRUCIBLE_POST(o == out.size(), "every element written once");
}

}  // namespace crucible::ptload
