/* c_host.c — a pure C host of libcrucible_vessel.so: records a tiny MLP step and exports it.
 * Usage: record_c_host OUT.crtrace   (exit 0 on success, message on stderr otherwise) */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "crucible/record/vessel.h"

static int check(int rc, const char* what) {
  if (rc < 0) fprintf(stderr, "c_host: %s failed: %s\n", what, crucible_vessel_last_error());
  return rc;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT.crtrace\n", argv[0]);
    return 2;
  }
  crucible_vessel_config cfg;
  memset(&cfg, 0, sizeof cfg);
  crucible_vessel* v = crucible_vessel_create(&cfg);
  if (!v) {
    fprintf(stderr, "c_host: create failed: %s\n", crucible_vessel_last_error());
    return 1;
  }
  const uint64_t addmm = crucible_vessel_schema(v, "aten::addmm");
  const uint64_t relu = crucible_vessel_schema(v, "aten::relu");
  const uint32_t fc1 = crucible_vessel_module(v, "fc1");

  const int64_t x_sz[2] = {32, 64}, w_sz[2] = {64, 128}, b_sz[1] = {128}, y_sz[2] = {32, 128};
  crucible_tensor_desc in[3], out[1];
  memset(in, 0, sizeof in);
  memset(out, 0, sizeof out);
  in[0].sizes = b_sz; in[0].ndim = 1; in[0].dtype = 6; in[0].storage_id = 1;
  in[1].sizes = x_sz; in[1].ndim = 2; in[1].dtype = 6; in[1].storage_id = 2;
  in[2].sizes = w_sz; in[2].ndim = 2; in[2].dtype = 6; in[2].storage_id = 3; in[2].requires_grad = 1;
  out[0].sizes = y_sz; out[0].ndim = 2; out[0].dtype = 6; out[0].storage_id = 4;
  crucible_scalar sc[2];
  sc[0].kind = CRUCIBLE_SCALAR_INT; sc[0].value.i = 1;      /* beta */
  sc[1].kind = CRUCIBLE_SCALAR_DOUBLE; sc[1].value.d = 0.5; /* alpha */
  if (check(crucible_vessel_record_op(v, addmm, CRUCIBLE_PHASE_FORWARD, fc1, in, 3, out, 1, sc, 2), "record addmm")) return 1;
  crucible_tensor_desc relu_out = out[0];
  relu_out.storage_id = 5;
  if (check(crucible_vessel_record_op(v, relu, CRUCIBLE_PHASE_FORWARD, fc1, out, 1, &relu_out, 1, NULL, 0), "record relu")) return 1;

  /* Bad input is an error with a message, not a crash. */
  crucible_scalar bad;
  bad.kind = 42;
  bad.value.i = 0;
  if (crucible_vessel_record_op(v, relu, CRUCIBLE_PHASE_FORWARD, 0, NULL, 0, NULL, 0, &bad, 1) != -1 ||
      strstr(crucible_vessel_last_error(), "unknown kind 42") == NULL) {
    fprintf(stderr, "c_host: a bad scalar kind was not refused\n");
    return 1;
  }
  /* A module id that was never interned would make an export the loader refuses. */
  if (crucible_vessel_record_op(v, relu, CRUCIBLE_PHASE_FORWARD, fc1 + 7, NULL, 0, NULL, 0, NULL, 0) != -1 ||
      strstr(crucible_vessel_last_error(), "was not interned") == NULL) {
    fprintf(stderr, "c_host: an unknown module id was not refused\n");
    return 1;
  }
  /* Sizes whose contiguous strides overflow (NULL strides: they are computed). */
  {
    int64_t huge[3] = {2, (int64_t)1 << 40, (int64_t)1 << 40};
    crucible_tensor_desc big = out[0];
    big.ndim = 3;
    big.sizes = huge;
    big.strides = NULL;
    if (crucible_vessel_record_op(v, relu, CRUCIBLE_PHASE_FORWARD, 0, &big, 1, NULL, 0, NULL, 0) != -1 ||
        strstr(crucible_vessel_last_error(), "strides overflow") == NULL) {
      fprintf(stderr, "c_host: contiguous strides overflowing 64 bits were not refused\n");
      return 1;
    }
  }
  /* A module path deeper than a .crtrace file holds (256 levels) is refused when interned, so
   * that the export below never refuses what was recorded. */
  {
    static char deep[2 * 300];
    int k;
    for (k = 0; k < 300; ++k) {
      deep[2 * k] = 'm';
      deep[2 * k + 1] = '.';
    }
    deep[2 * 300 - 1] = '\0'; /* "m.m.....m": 300 levels */
    if (crucible_vessel_module(v, deep) != UINT32_MAX ||
        strstr(crucible_vessel_last_error(), "300 levels deep") == NULL) {
      fprintf(stderr, "c_host: a module path of 300 levels was not refused\n");
      return 1;
    }
    if (crucible_vessel_record_op(v, relu, CRUCIBLE_PHASE_FORWARD, UINT32_MAX, NULL, 0, NULL, 0, NULL, 0) != -1 ||
        strstr(crucible_vessel_last_error(), "was not interned") == NULL) {
      fprintf(stderr, "c_host: the refused module's id was accepted\n");
      return 1;
    }
  }
  if (check(crucible_vessel_flush(v), "flush")) return 1;
  if (crucible_vessel_ops_recorded(v) != 2 || crucible_vessel_ops_dropped(v) != 0) {
    fprintf(stderr, "c_host: %llu ops recorded and %llu dropped, not 2 and 0\n",
            (unsigned long long)crucible_vessel_ops_recorded(v), (unsigned long long)crucible_vessel_ops_dropped(v));
    return 1;
  }
  if (check(crucible_vessel_export(v, argv[1]), "export")) return 1;
  printf("c_host: recorded %llu ops, dropped %llu, exported %s\n",
         (unsigned long long)crucible_vessel_ops_recorded(v),
         (unsigned long long)crucible_vessel_ops_dropped(v), argv[1]);
  crucible_vessel_destroy(v);
  return 0;
}
