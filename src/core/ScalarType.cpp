// ScalarType.cpp — the dtype / device / layout name tables.
#include "crucible/core/ScalarType.h"

#include <array>

#include <string>

namespace crucible {
namespace {

using K = DtypeKind;
// One row per c10::ScalarType ordinal, in order. The static_assert below pins the count.
constexpr std::array<ScalarTypeInfo, kNumKnownScalarTypes> kTable{{
    {0, "uint8", 8, K::UnsignedInt},       {1, "int8", 8, K::SignedInt},
    {2, "int16", 16, K::SignedInt},        {3, "int32", 32, K::SignedInt},
    {4, "int64", 64, K::SignedInt},        {5, "float16", 16, K::Float},
    {6, "float32", 32, K::Float},          {7, "float64", 64, K::Float},
    {8, "complex32", 32, K::Complex},      {9, "complex64", 64, K::Complex},
    {10, "complex128", 128, K::Complex},   {11, "bool", 8, K::Bool},
    {12, "qint8", 8, K::Opaque},           {13, "quint8", 8, K::Opaque},
    {14, "qint32", 32, K::Opaque},         {15, "bfloat16", 16, K::Float},
    {16, "quint4x2", 8, K::Opaque},        {17, "quint2x4", 8, K::Opaque},
    {18, "bits1x8", 8, K::Opaque},         {19, "bits2x4", 8, K::Opaque},
    {20, "bits4x2", 8, K::Opaque},         {21, "bits8", 8, K::Opaque},
    {22, "bits16", 16, K::Opaque},         {23, "float8_e5m2", 8, K::Opaque},
    {24, "float8_e4m3fn", 8, K::Opaque},   {25, "float8_e5m2fnuz", 8, K::Opaque},
    {26, "float8_e4m3fnuz", 8, K::Opaque}, {27, "uint16", 16, K::UnsignedInt},
    {28, "uint32", 32, K::UnsignedInt},    {29, "uint64", 64, K::UnsignedInt},
    {30, "uint1", 8, K::Opaque},           {31, "uint2", 8, K::Opaque},
    {32, "uint3", 8, K::Opaque},           {33, "uint4", 8, K::Opaque},
    {34, "uint5", 8, K::Opaque},           {35, "uint6", 8, K::Opaque},
    {36, "uint7", 8, K::Opaque},           {37, "int1", 8, K::Opaque},
    {38, "int2", 8, K::Opaque},            {39, "int3", 8, K::Opaque},
    {40, "int4", 8, K::Opaque},            {41, "int5", 8, K::Opaque},
    {42, "int6", 8, K::Opaque},            {43, "int7", 8, K::Opaque},
    {44, "float8_e8m0fnu", 8, K::Opaque},  {45, "float4_e2m1fn_x2", 8, K::Opaque},
}};
static_assert(kTable.size() == kNumKnownScalarTypes);
constexpr bool rows_in_order() {
  for (int i = 0; i < kNumKnownScalarTypes; ++i)
    if (kTable[i].ordinal != i) return false;
  return true;
}
static_assert(rows_in_order(), "row i must describe c10 ordinal i");

constexpr ScalarTypeInfo kUnknown{-1, "unknown", 0, K::Unknown};

struct Alias { std::string_view name; std::int8_t ordinal; };
constexpr std::array<Alias, 10> kAliases{{
    {"float", 6}, {"double", 7}, {"half", 5}, {"long", 4}, {"int", 3}, {"short", 2},
    {"cfloat", 9}, {"cdouble", 10}, {"chalf", 8}, {"byte", 0},
}};

constexpr std::array<std::string_view, kNumDeviceKinds> kDeviceNames{
    "cpu", "cuda", "mkldnn", "opengl", "opencl", "ideep", "hip", "fpga", "ort", "xla", "vulkan",
    "metal", "xpu", "mps", "meta", "hpu", "ve", "lazy", "ipu", "mtia", "privateuseone", "unknown"};
constexpr std::array<std::string_view, kNumLayoutKinds> kLayoutNames{
    "strided", "sparse_coo", "sparse_csr", "mkldnn", "sparse_csc", "sparse_bsr", "sparse_bsc",
    "jagged", "unknown"};

}  // namespace

const ScalarTypeInfo& scalar_type_info(std::int8_t ord) noexcept {
  if (ord < 0 || ord >= kNumKnownScalarTypes) return kUnknown;
  return kTable[static_cast<std::size_t>(ord)];
}

Result<std::uint32_t> element_size(std::int8_t ord) {
  const ScalarTypeInfo& info = scalar_type_info(ord);
  if (info.kind == DtypeKind::Unknown) {
    return invalid_input("dtype ordinal " + std::to_string(ord) + " is unknown to this build of Crucible",
                         "upgrade Crucible, or record with a PyTorch whose dtypes it knows");
  }
  return info.element_bits / 8u;
}

Result<std::int8_t> scalar_type_from_name(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  for (const auto& row : kTable)
    if (row.name == name) return row.ordinal;
  for (const auto& a : kAliases)
    if (a.name == name) return a.ordinal;
  return invalid_input("'" + std::string(name) + "' is not a PyTorch dtype name",
                       "use a name such as float32, bfloat16, int64 or bool");
}

std::string_view device_kind_name(DeviceKind k) noexcept {
  auto i = static_cast<std::size_t>(k);
  return i < kDeviceNames.size() ? kDeviceNames[i] : kDeviceNames.back();
}

std::string_view layout_kind_name(LayoutKind k) noexcept {
  auto i = static_cast<std::size_t>(k);
  return i < kLayoutNames.size() ? kLayoutNames[i] : kLayoutNames.back();
}

}  // namespace crucible
