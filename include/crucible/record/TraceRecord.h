// TraceRecord.h — the fixed-size records a recording thread writes, one op at a time.
//
// Per op the foreground writes:
//   * one TraceEntry (64 B, one cache line) into the thread's TraceRing;
//   * for every tensor argument and result, one TensorMeta cell (64 B) plus
//     ceil(2*ndim/8) DimsCell cells (sizes then strides, 8 int64 per cell) into its MetaLog;
//   * for every non-tensor argument, one or more ScalarRecord (16 B) into its ScalarLog.
// The same records, unchanged, are the body of a .crtrace file (misc/CRTRACE.md), so the
// layouts are pinned with static_asserts and carry no pointers into the recording process
// except the data_ptr value kept for debugging and aliasing checks.
#pragma once

#include <cstdint>
#include <type_traits>

namespace crucible::record {

enum class Phase : std::uint8_t { Forward = 0, Backward = 1, Optimizer = 2 };
inline constexpr int kNumPhases = 3;
const char* phase_name(Phase p) noexcept;

// TraceEntry::flags
namespace op_flag {
inline constexpr std::uint8_t kMutable = 1;        // schema has a written-to argument
inline constexpr std::uint8_t kGradMode = 2;       // GradMode was enabled
inline constexpr std::uint8_t kInferenceMode = 4;  // InferenceMode was enabled
inline constexpr std::uint8_t kAfterDrop = 8;      // ops were dropped just before this one
}  // namespace op_flag

struct alignas(64) TraceEntry {
  std::uint64_t schema_hash = 0;  // hash64("ns::name.overload"); names in the trace's table
  std::uint64_t seq = 0;          // per-thread op sequence number, from 0
  std::uint32_t n_tensors = 0;    // TensorMeta records that follow: inputs first, then outputs
  std::uint32_t n_inputs = 0;     // how many of n_tensors are inputs
  std::uint32_t n_meta_cells = 0; // MetaLog cells used (TensorMeta + DimsCell)
  std::uint32_t n_scalars = 0;    // ScalarRecords in the ScalarLog
  std::uint32_t module_id = 0;    // interned module path ("" = 0: outside any tracked module)
  std::uint32_t thread = 0;       // recording thread's index in the recorder
  std::uint16_t n_args = 0;       // schema arguments (for argument positions)
  Phase phase = Phase::Forward;
  std::uint8_t flags = 0;
  std::uint32_t reserved0 = 0;
  // The StreamId (c10::Stream::id()) current on the device of the op's first tensor that is
  // not on the CPU, as the op ran; 0 when every tensor is on the CPU (that device's
  // TensorMeta says which device the stream is of; 0 is also CUDA's default stream).
  std::uint64_t stream = 0;
  std::uint64_t reserved1 = 0;
};
static_assert(sizeof(TraceEntry) == 64 && std::is_trivially_copyable_v<TraceEntry>);

// TensorMeta::flags
namespace tensor_flag {
inline constexpr std::uint8_t kRequiresGrad = 1;
inline constexpr std::uint8_t kIsView = 2;
inline constexpr std::uint8_t kWrappedNumber = 4;  // a Python scalar turned into a 0-d tensor
inline constexpr std::uint8_t kInference = 8;      // inference tensor: no version counter
inline constexpr std::uint8_t kOutput = 16;        // result of the op (else an argument)
inline constexpr std::uint8_t kNoStorage = 32;     // sparse / meta-less: storage fields are 0
}  // namespace tensor_flag

struct alignas(64) TensorMeta {
  std::uint64_t data_ptr = 0;       // address of element 0; debugging only, never an identity
  std::uint64_t storage_id = 0;     // unique per storage for the whole recording (0: none)
  std::int64_t storage_offset = 0;  // in elements
  std::uint64_t storage_nbytes = 0;
  double wrapped_value = 0;         // the value when kWrappedNumber (real part)
  std::uint32_t version = 0;        // version counter when seen (pre-op for inputs)
  std::uint32_t list_index = 0;     // position inside a TensorList argument, else 0
  std::uint16_t arg_index = 0;      // schema argument / return position
  std::uint16_t ndim = 0;
  std::int8_t dtype = -1;           // c10 ScalarType ordinal (see core/ScalarType.h)
  std::uint8_t device_kind = 0;     // crucible::DeviceKind
  std::int8_t device_index = -1;
  std::uint8_t layout = 0;          // crucible::LayoutKind
  std::uint8_t flags = 0;
  std::uint8_t reserved[7] = {};
};
static_assert(sizeof(TensorMeta) == 64 && std::is_trivially_copyable_v<TensorMeta>);

struct alignas(64) DimsCell {
  std::int64_t v[8] = {};
};
static_assert(sizeof(DimsCell) == 64);

// One MetaLog slot: either a TensorMeta or a DimsCell (the count in TraceEntry says which).
union MetaCell {
  TensorMeta meta;
  DimsCell dims;
  MetaCell() : dims() {}
};
static_assert(sizeof(MetaCell) == 64 && std::is_trivially_copyable_v<MetaCell>);

constexpr std::uint32_t dims_cells(std::uint32_t ndim) { return (2 * ndim + 7) / 8; }

enum class ScalarKind : std::uint8_t {
  None = 0,        // optional argument not given
  Int = 1,         // bits = int64
  Double = 2,      // bits = IEEE-754 double
  Bool = 3,        // bits = 0/1
  ComplexReal = 4, // real part (double); the next record is ComplexImag
  ComplexImag = 5,
  String = 6,      // bits = hash64(string)
  ListBegin = 7,   // aux = element count; that many element records follow
  Device = 8,      // bits = kind << 8 | (uint8)index
  TensorList = 9,  // aux = length; the tensors are TensorMeta records with list_index
  Other = 10,      // bits = hash64(type name): generators, custom classes, ...
  Unknown = 11,    // a kind this build cannot name (never produced by this build)
};

struct ScalarRecord {
  ScalarKind kind = ScalarKind::None;
  std::uint8_t reserved = 0;
  std::uint16_t arg_index = 0;
  std::uint32_t aux = 0;
  std::uint64_t bits = 0;
};
static_assert(sizeof(ScalarRecord) == 16 && std::is_trivially_copyable_v<ScalarRecord>);

}  // namespace crucible::record
