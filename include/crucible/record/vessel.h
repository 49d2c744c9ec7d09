/* vessel.h — the C API of libcrucible_vessel.so: record ops from any host, export a trace.
 *
 * Plain C (C99), no PyTorch. A host creates a vessel, feeds it ops (each with tensor
 * descriptions and scalar arguments) from one or more threads, and exports a .crtrace file
 * that crucible.load_trace() and the C++ loader read back.
 *
 * Threads: crucible_vessel_record_op may be called concurrently from any number of threads
 * (each gets its own lock-free rings). create/destroy must not race with other calls.
 * Errors: functions return 0 on success and non-zero on error; the message is available from
 * crucible_vessel_last_error() on the calling thread.
 */
#ifndef CRUCIBLE_RECORD_VESSEL_H
#define CRUCIBLE_RECORD_VESSEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct crucible_vessel crucible_vessel;

typedef struct {
  uint32_t ring_entries;  /* power of two; 0 = default 65536 */
  uint32_t meta_cells;    /* power of two; 0 = default 131072 */
  uint32_t scalar_slots;  /* power of two; 0 = default 65536 */
  int drop_when_full;     /* 0 = back-pressure (wait for the drain), 1 = count and drop */
} crucible_vessel_config;

typedef struct {
  const int64_t* sizes;   /* ndim values */
  const int64_t* strides; /* ndim values, in elements; NULL = contiguous */
  uint32_t ndim;
  int8_t dtype;           /* PyTorch ScalarType ordinal: 6 = float32, 4 = int64, ... */
  uint8_t device_kind;    /* 0 = cpu, 1 = cuda (crucible DeviceKind) */
  int8_t device_index;
  uint8_t requires_grad;
  uint64_t storage_id;    /* host's identity of the buffer; equal ids share storage */
  int64_t storage_offset; /* elements */
  uint32_t version;       /* bumped by the host on each in-place write */
  uint64_t data_ptr;      /* optional, for debugging */
} crucible_tensor_desc;

typedef enum {
  CRUCIBLE_SCALAR_NONE = 0,
  CRUCIBLE_SCALAR_INT = 1,
  CRUCIBLE_SCALAR_DOUBLE = 2,
  CRUCIBLE_SCALAR_BOOL = 3,
  CRUCIBLE_SCALAR_STRING = 6 /* value.s is hashed */
} crucible_scalar_kind;

typedef struct {
  int32_t kind; /* a crucible_scalar_kind value */
  union {
    int64_t i;
    double d;
    int b;
    const char* s;
  } value;
} crucible_scalar;

typedef enum { CRUCIBLE_PHASE_FORWARD = 0, CRUCIBLE_PHASE_BACKWARD = 1, CRUCIBLE_PHASE_OPTIMIZER = 2 } crucible_phase;

/* NULL config = defaults. Returns NULL on error (see crucible_vessel_last_error). */
crucible_vessel* crucible_vessel_create(const crucible_vessel_config* config);
void crucible_vessel_destroy(crucible_vessel* v);

/* Interns "ns::name.overload" and returns its 64-bit schema id (stable across runs). */
uint64_t crucible_vessel_schema(crucible_vessel* v, const char* qualified_name);
/* Interns a module path ("encoder.layer0") and returns its id; "" or NULL is 0. A path a
 * .crtrace file cannot hold (over 65536 bytes or 256 levels) returns UINT32_MAX (see
 * crucible_vessel_last_error), which crucible_vessel_record_op refuses. */
uint32_t crucible_vessel_module(crucible_vessel* v, const char* path);

/* Records one op. Returns 0 when recorded, 1 when dropped (drop mode, rings full), -1 on error. */
int crucible_vessel_record_op(crucible_vessel* v, uint64_t schema, crucible_phase phase,
                              uint32_t module_id, const crucible_tensor_desc* inputs,
                              uint32_t n_inputs, const crucible_tensor_desc* outputs,
                              uint32_t n_outputs, const crucible_scalar* scalars,
                              uint32_t n_scalars);

/* Waits until every op recorded before the call is drained. */
int crucible_vessel_flush(crucible_vessel* v);
/* Flushes, then writes everything recorded so far to path (.crtrace). */
int crucible_vessel_export(crucible_vessel* v, const char* path);
/* Ops recorded so far (all threads, all phases) and ops dropped. */
uint64_t crucible_vessel_ops_recorded(crucible_vessel* v);
uint64_t crucible_vessel_ops_dropped(crucible_vessel* v);

/* The calling thread's last error message ("" if none). Valid until its next failing call. */
const char* crucible_vessel_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* CRUCIBLE_RECORD_VESSEL_H */
