/* c_host.c — a pure C program using the ptload C API (ptload_c.h) on a torch.save file.
 * Usage: ptload_c_host VIEWS.pt BAD.pt   (views.pt from make_fixtures.py; BAD.pt must be refused)
 * Exit 0 when every check passes, else a message on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crucible/ptload/ptload_c.h"

static int fail(const char* what) {
  fprintf(stderr, "ptload_c_host: %s (last error: %s)\n", what, crucible_ptload_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s VIEWS.pt BAD.pt\n", argv[0]);
    return 2;
  }
  crucible_ptload* f = NULL;
  if (crucible_ptload_open(argv[1], &f) != 0) return fail("open views.pt");
  size_t n = crucible_ptload_tensor_count(f);
  for (size_t i = 0; i < n; ++i) {
    crucible_ptload_tensor t;
    if (crucible_ptload_tensor_at(f, i, &t) != 0) return fail("tensor_at");
    printf("%-12s %-8s ndim=%u numel=%lld\n", t.name, t.dtype_name, t.ndim, (long long)t.numel);
  }
  /* views.pt: base = arange(60).reshape(3, 4, 5); sliced = base[1:, 1:3, ::2]. Walk its strides
   * over the raw pointer and compare with the formula, then with materialize_f32. */
  size_t idx;
  if (crucible_ptload_find(f, "sliced", &idx) != 0) return fail("find sliced");
  crucible_ptload_tensor s;
  if (crucible_ptload_tensor_at(f, idx, &s) != 0) return fail("tensor_at sliced");
  if (s.dtype != 6 || s.ndim != 3 || s.shape[0] != 2 || s.shape[1] != 2 || s.shape[2] != 3)
    return fail("sliced has the wrong dtype or shape");
  float dense[12];
  if (crucible_ptload_materialize_f32(f, idx, dense, 12) != 0) return fail("materialize");
  int k = 0;
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t c = 0; c < 3; ++c, ++k) {
        float v;
        const char* p =
            (const char*)s.data + (a * s.strides[0] + b * s.strides[1] + c * s.strides[2]) * 4;
        memcpy(&v, p, sizeof v);
        const float want = (float)(20 * (a + 1) + 5 * (b + 1) + 2 * c);
        if (v != want || dense[k] != want) return fail("sliced value differs from arange");
      }
  if (crucible_ptload_materialize_f32(f, idx, dense, 11) != -1 ||
      strstr(crucible_ptload_last_error(), "needs 12") == NULL)
    return fail("a too-small output buffer was not refused");
  if (crucible_ptload_find(f, "nope", &idx) != -1) return fail("a missing name was found");
  crucible_ptload_close(f);

  /* A refused file: -1, a message, and *out untouched (no partial state). */
  crucible_ptload* sentinel = (crucible_ptload*)&n;
  crucible_ptload* g = sentinel;
  if (crucible_ptload_open(argv[2], &g) != -1) return fail("bad file was accepted");
  if (g != sentinel) return fail("a failed open wrote *out");
  if (strstr(crucible_ptload_last_error(), "not on the allowlist") == NULL)
    return fail("unexpected error");
  printf("c_host: %zu tensors, strided walk ok, refusal ok: %s\n", n, crucible_ptload_last_error());
  return 0;
}
