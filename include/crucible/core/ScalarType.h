// ScalarType.h — dtype, device type and layout tables that cover every PyTorch value.
//
// Ordinals are PyTorch's own (c10::ScalarType, c10::Layout), which PyTorch only ever appends
// to: 0..17 are identical in 1.13 and 2.x, 2.x appends 18..45. A trace therefore stores the
// raw c10 ordinal and this table names it. A value past the table (a dtype newer than this
// build) is not a crash and not `unreachable`: lookup returns DtypeKind::Unknown with size 0,
// and callers that need a size get an error Status saying which ordinal was unknown.
//
// Device types are NOT stored as c10 ordinals: PrivateUse1 is 19 in 1.13 and 20 in 2.x. The
// Vessel maps c10::DeviceType by enumerator name into the stable DeviceKind below.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "crucible/core/Status.h"

namespace crucible {

// What the bits of an element mean. Opaque: named and sized, but Crucible does no arithmetic
// on it (quantized, float8/float4, bit containers, sub-byte ints).
enum class DtypeKind : std::uint8_t { Unknown, Bool, SignedInt, UnsignedInt, Float, Complex, Opaque };

struct ScalarTypeInfo {
  std::int8_t ordinal;        // c10::ScalarType value
  std::string_view name;      // PyTorch's name without "torch.": "float32", "bfloat16", ...
  std::uint8_t element_bits;  // 0 for Unknown; 4 for packed float4 pairs' half
  DtypeKind kind;
};

// The table. Index = c10 ordinal. kNumKnownScalarTypes = 46 (through Float4_e2m1fn_x2).
inline constexpr int kNumKnownScalarTypes = 46;

// Always returns an entry; ordinals outside the table give kind Unknown and name "unknown".
const ScalarTypeInfo& scalar_type_info(std::int8_t c10_ordinal) noexcept;

// Bytes per element, or an error naming the ordinal for Unknown (and for sub-byte packed types
// whose bytes per element is not an integer).
Result<std::uint32_t> element_size(std::int8_t c10_ordinal);

// Looks a dtype up by PyTorch name ("float32" or alias "float", "int64" or "long", ...).
Result<std::int8_t> scalar_type_from_name(std::string_view name);

// Common ordinals, spelled out so code reads well without c10.
namespace dtype {
inline constexpr std::int8_t kUInt8 = 0, kInt8 = 1, kInt16 = 2, kInt32 = 3, kInt64 = 4,
                             kFloat16 = 5, kFloat32 = 6, kFloat64 = 7, kComplex32 = 8,
                             kComplex64 = 9, kComplex128 = 10, kBool = 11, kBFloat16 = 15;
}

// Stable device kinds (Crucible's own ordinals, frozen).
enum class DeviceKind : std::uint8_t {
  CPU = 0, CUDA, MKLDNN, OpenGL, OpenCL, IDEEP, HIP, FPGA, ORT, XLA, Vulkan, Metal, XPU, MPS,
  Meta, HPU, VE, Lazy, IPU, MTIA, PrivateUse1, Unknown,
};
inline constexpr int kNumDeviceKinds = 22;
std::string_view device_kind_name(DeviceKind k) noexcept;  // "unknown" past the table

// Layouts: c10::Layout ordinals (Strided 0 ... Jagged 7, stable across versions).
enum class LayoutKind : std::uint8_t {
  Strided = 0, Sparse, SparseCsr, Mkldnn, SparseCsc, SparseBsr, SparseBsc, Jagged, Unknown,
};
inline constexpr int kNumLayoutKinds = 9;
std::string_view layout_kind_name(LayoutKind k) noexcept;
inline LayoutKind layout_from_ordinal(std::int8_t c10_ordinal) noexcept {  // per recorded tensor
  if (c10_ordinal < 0 || c10_ordinal >= static_cast<int>(LayoutKind::Unknown)) return LayoutKind::Unknown;
  return static_cast<LayoutKind>(c10_ordinal);
}

}  // namespace crucible
