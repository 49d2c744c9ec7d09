// vessel_c.cpp — the C API of libcrucible_vessel.so over record::Recorder.
#include "crucible/record/vessel.h"

#include <string>
#include <vector>

#include "crucible/record/OpBuilder.h"
#include "crucible/record/Recorder.h"
#include "crucible/record/TraceFile.h"

struct crucible_vessel {
  std::unique_ptr<crucible::record::Recorder> rec;
};

namespace {
thread_local std::string t_error;
int fail(const std::string& msg) {
  t_error = msg;
  return -1;
}
}  // namespace

extern "C" {

crucible_vessel* crucible_vessel_create(const crucible_vessel_config* c) {
  crucible::record::RecorderConfig cfg;
  if (c != nullptr) {
    if (c->ring_entries != 0) cfg.ring_entries = c->ring_entries;
    if (c->meta_cells != 0) cfg.meta_cells = c->meta_cells;
    if (c->scalar_slots != 0) cfg.scalar_slots = c->scalar_slots;
    cfg.drop_when_full = c->drop_when_full != 0;
  }
  auto r = crucible::record::Recorder::create(cfg);
  if (!r.ok()) {
    t_error = crucible::message_of(r.status());
    return nullptr;
  }
  return new crucible_vessel{std::move(*r)};
}

void crucible_vessel_destroy(crucible_vessel* v) { delete v; }

uint64_t crucible_vessel_schema(crucible_vessel* v, const char* name) {
  if (v == nullptr || name == nullptr) return 0;
  return v->rec->intern_schema(name);
}

uint32_t crucible_vessel_module(crucible_vessel* v, const char* path) {
  if (v == nullptr || path == nullptr) return 0;
  auto id = v->rec->intern_module(path);
  if (!id.ok()) {
    fail("crucible_vessel_module: " + crucible::message_of(id.status()));
    return UINT32_MAX;
  }
  return *id;
}

int crucible_vessel_record_op(crucible_vessel* v, uint64_t schema, crucible_phase phase,
                              uint32_t module_id, const crucible_tensor_desc* inputs,
                              uint32_t n_inputs, const crucible_tensor_desc* outputs,
                              uint32_t n_outputs, const crucible_scalar* scalars,
                              uint32_t n_scalars) {
  using namespace crucible::record;
  if (v == nullptr) return fail("crucible_vessel_record_op: vessel is NULL; create one first");
  if (static_cast<unsigned>(phase) > 2)
    return fail("crucible_vessel_record_op: phase " + std::to_string(phase) + " is not 0, 1 or 2");
  if ((n_inputs != 0 && inputs == nullptr) || (n_outputs != 0 && outputs == nullptr) ||
      (n_scalars != 0 && scalars == nullptr))
    return fail("crucible_vessel_record_op: a count is non-zero but its array is NULL");
  // Argument positions are 16-bit in the trace (TensorMeta::arg_index, TraceEntry::n_args).
  if (std::uint64_t{n_inputs} + n_scalars > 0xFFFF || n_outputs > 0xFFFF)
    return fail("crucible_vessel_record_op: " + std::to_string(n_inputs) + " inputs + " +
                std::to_string(n_scalars) + " scalars, " + std::to_string(n_outputs) +
                " outputs: an op takes at most 65535 arguments and returns "
                "at most 65535 tensors");
  if (const std::uint32_t modules = v->rec->num_modules(); module_id >= modules)
    return fail("crucible_vessel_record_op: module id " + std::to_string(module_id) +
                " was not interned (" + std::to_string(modules) +
                " module ids exist); use 0 or an id from crucible_vessel_module");
  thread_local OpBuilder b;
  b.reset();
  // Empty on success, else what is wrong with the tensor.
  auto add = [&](const crucible_tensor_desc& d, std::uint16_t arg, bool out) -> std::string {
    if (d.ndim != 0 && d.sizes == nullptr) return "has ndim > 0 but sizes is NULL";
    if (d.ndim > 0xFFFF) return "has ndim > 65535";
    TensorMeta m;
    m.storage_id = d.storage_id;
    m.storage_offset = d.storage_offset;
    m.version = d.version;
    m.data_ptr = d.data_ptr;
    m.dtype = d.dtype;
    m.device_kind = d.device_kind;
    m.device_index = d.device_index;
    m.arg_index = arg;
    m.flags = static_cast<std::uint8_t>((d.requires_grad ? tensor_flag::kRequiresGrad : 0) |
                                        (out ? tensor_flag::kOutput : 0));
    std::vector<std::int64_t> strides(d.ndim);
    if (d.strides != nullptr) {
      for (std::uint32_t i = 0; i < d.ndim; ++i) strides[i] = d.strides[i];
    } else {
      std::int64_t s = 1;  // contiguous strides; a stride that overflows is refused
      for (std::uint32_t i = d.ndim; i-- > 0;) {
        strides[i] = s;
        if (i > 0 && __builtin_mul_overflow(s, d.sizes[i] > 0 ? d.sizes[i] : 1, &s))
          return "has sizes whose contiguous strides overflow 64 bits; pass strides, or real sizes";
      }
    }
    b.add_tensor(m, std::span<const std::int64_t>(d.sizes, d.ndim), strides);
    return {};
  };
  for (std::uint32_t i = 0; i < n_inputs; ++i)
    if (std::string why = add(inputs[i], static_cast<std::uint16_t>(i), false); !why.empty())
      return fail("crucible_vessel_record_op: input " + std::to_string(i) + " " + why);
  b.end_inputs();
  for (std::uint32_t i = 0; i < n_outputs; ++i)
    if (std::string why = add(outputs[i], static_cast<std::uint16_t>(i), true); !why.empty())
      return fail("crucible_vessel_record_op: output " + std::to_string(i) + " " + why);
  for (std::uint32_t i = 0; i < n_scalars; ++i) {
    const crucible_scalar& s = scalars[i];
    const auto arg = static_cast<std::uint16_t>(n_inputs + i);
    switch (s.kind) {
      case CRUCIBLE_SCALAR_NONE: b.add_scalar(ScalarKind::None, arg, 0); break;
      case CRUCIBLE_SCALAR_INT: b.add_int(arg, s.value.i); break;
      case CRUCIBLE_SCALAR_DOUBLE: b.add_double(arg, s.value.d); break;
      case CRUCIBLE_SCALAR_BOOL: b.add_scalar(ScalarKind::Bool, arg, s.value.b != 0); break;
      case CRUCIBLE_SCALAR_STRING:
        if (s.value.s == nullptr) return fail("crucible_vessel_record_op: string scalar " + std::to_string(i) + " is NULL");
        b.add_string(arg, s.value.s);
        break;
      default:
        return fail("crucible_vessel_record_op: scalar " + std::to_string(i) + " has unknown kind " +
                    std::to_string(static_cast<int>(s.kind)) + "; use a crucible_scalar_kind value");
    }
  }
  TraceEntry e = b.entry(schema, static_cast<Phase>(phase), 0);
  e.module_id = module_id;
  e.n_args = static_cast<std::uint16_t>(n_inputs + n_scalars);
  return v->rec->commit(v->rec->thread_log(), e, b.cells(), b.scalars()) ? 0 : 1;
}

int crucible_vessel_flush(crucible_vessel* v) {
  if (v == nullptr) return fail("crucible_vessel_flush: vessel is NULL");
  v->rec->flush();
  return 0;
}

int crucible_vessel_export(crucible_vessel* v, const char* path) {
  if (v == nullptr || path == nullptr) return fail("crucible_vessel_export: vessel or path is NULL");
  auto st = crucible::record::save_trace(v->rec->snapshot(), path);
  if (!st.ok()) return fail(crucible::message_of(st));
  return 0;
}

uint64_t crucible_vessel_ops_recorded(crucible_vessel* v) {
  if (v == nullptr) return 0;
  std::uint64_t n = 0;
  for (const auto& s : v->rec->thread_stats()) n += s.total_ops();
  return n;
}

uint64_t crucible_vessel_ops_dropped(crucible_vessel* v) {
  if (v == nullptr) return 0;
  std::uint64_t n = 0;
  for (const auto& s : v->rec->thread_stats()) n += s.dropped;
  return n;
}

const char* crucible_vessel_last_error(void) { return t_error.c_str(); }

}  // extern "C"
