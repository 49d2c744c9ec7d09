/* ptload_c.h — plain C API of the torch-free .pt loader (crucible::ptload::StateDict).
 *
 * Functions returning int give 0 on success and -1 on error; crucible_ptload_last_error() then
 * holds the message (per thread, valid until the next call on that thread). Nothing throws
 * across this API: running out of memory (a file needing more than the process may use) is an
 * error return with a message like any other. Pointers handed out (names, shapes, strides,
 * data) stay valid until crucible_ptload_close(). */
#ifndef CRUCIBLE_PTLOAD_PTLOAD_C_H
#define CRUCIBLE_PTLOAD_PTLOAD_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct crucible_ptload crucible_ptload;

typedef struct crucible_ptload_tensor {
  const char* name;       /* NUL-terminated, '.'-joined path */
  int32_t dtype;          /* c10::ScalarType ordinal: 6 float32, 7 float64, ... */
  const char* dtype_name; /* "float32", ... */
  uint32_t itemsize;      /* bytes per element */
  uint32_t ndim;
  const int64_t* shape;   /* ndim entries */
  const int64_t* strides; /* ndim entries, in elements */
  int64_t numel;
  const void* data; /* element [0,...,0]; may be unaligned: read with memcpy */
} crucible_ptload_tensor;

/* Opens a .pt file; *out is set on success only. */
int crucible_ptload_open(const char* path, crucible_ptload** out);
void crucible_ptload_close(crucible_ptload* f); /* NULL is fine */
size_t crucible_ptload_tensor_count(const crucible_ptload* f);
/* Fills *out for tensor `index` (0 <= index < count). */
int crucible_ptload_tensor_at(const crucible_ptload* f, size_t index, crucible_ptload_tensor* out);
/* Finds a tensor by name; sets *index. */
int crucible_ptload_find(const crucible_ptload* f, const char* name, size_t* index);
/* Writes the tensor as contiguous float32 into out[0..numel); out_len must be >= numel. */
int crucible_ptload_materialize_f32(const crucible_ptload* f, size_t index, float* out,
                                    size_t out_len);
const char* crucible_ptload_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CRUCIBLE_PTLOAD_PTLOAD_C_H */
