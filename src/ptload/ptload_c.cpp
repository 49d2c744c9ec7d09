// ptload_c.cpp — the C API over StateDict (ptload_c.h).
//
// No exception crosses the C boundary: every entry point runs its body through guarded(), which
// turns std::bad_alloc (a file that needs more memory than the process may use) and any other
// exception into an error return. The message for that case is written into a fixed per-thread
// buffer, since building a std::string could itself fail.
#include "crucible/ptload/ptload_c.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/ptload/StateDict.h"

struct crucible_ptload {
  crucible::ptload::StateDict sd;
};

namespace {
thread_local std::string g_error;
thread_local char g_fixed_error[320];
thread_local bool g_use_fixed = false;  // the last error is in g_fixed_error

int fail(std::string_view msg) noexcept {
  try {
    g_error.assign(msg.data(), msg.size());
    g_use_fixed = false;
  } catch (...) {
    std::snprintf(g_fixed_error, sizeof g_fixed_error,
                  "crucible_ptload: out of memory while recording an error message");
    g_use_fixed = true;
  }
  return -1;
}

template <class F>
int guarded(const char* fn, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    std::snprintf(g_fixed_error, sizeof g_fixed_error,
                  "%s: out of memory (std::bad_alloc): the file needs more memory than this "
                  "process may use; free memory or raise the process's limit (ulimit -v), and "
                  "check the file with `crucible pt check`",
                  fn);
  } catch (const std::exception& e) {
    std::snprintf(g_fixed_error, sizeof g_fixed_error, "%s: unexpected error: %s", fn, e.what());
  } catch (...) {
    std::snprintf(g_fixed_error, sizeof g_fixed_error, "%s: unexpected error", fn);
  }
  g_use_fixed = true;
  return -1;
}
}  // namespace

extern "C" {

int crucible_ptload_open(const char* path, crucible_ptload** out) {
  return guarded("crucible_ptload_open", [&] {
    if (path == nullptr || out == nullptr)
      return fail("crucible_ptload_open: path and out must not be NULL");
    auto sd = crucible::ptload::StateDict::open(path);
    if (!sd.ok()) {
      return fail(crucible::message_of(sd.status()));
    }
    *out = new crucible_ptload{std::move(*sd)};
    return 0;
  });
}

void crucible_ptload_close(crucible_ptload* f) { delete f; }

size_t crucible_ptload_tensor_count(const crucible_ptload* f) {
  return f == nullptr ? 0 : f->sd.tensors().size();
}

int crucible_ptload_tensor_at(const crucible_ptload* f, size_t index, crucible_ptload_tensor* out) {
  return guarded("crucible_ptload_tensor_at", [&] {
    if (f == nullptr || out == nullptr)
      return fail("crucible_ptload_tensor_at: NULL handle or out");
    if (index >= f->sd.tensors().size())
      return fail("crucible_ptload_tensor_at: index " + std::to_string(index) +
                  " >= tensor count " + std::to_string(f->sd.tensors().size()));
    const auto& nt = f->sd.tensors()[index];
    const auto& t = nt.tensor;
    out->name = nt.name.c_str();
    out->dtype = t.dtype();
    out->dtype_name = t.dtype_name().data();  // the dtype table's names are NUL-terminated
    out->itemsize = t.itemsize();
    out->ndim = static_cast<uint32_t>(t.ndim());
    out->shape = t.sizes().data();
    out->strides = t.strides().data();
    out->numel = t.numel();
    out->data = t.data();
    return 0;
  });
}

int crucible_ptload_find(const crucible_ptload* f, const char* name, size_t* index) {
  return guarded("crucible_ptload_find", [&] {
    if (f == nullptr || name == nullptr || index == nullptr)
      return fail("crucible_ptload_find: NULL argument");
    const auto& ts = f->sd.tensors();
    for (size_t i = 0; i < ts.size(); ++i) {
      if (ts[i].name == name) {
        *index = i;
        return 0;
      }
    }
    return fail(std::string("crucible_ptload_find: no tensor named '") + name + "'");
  });
}

int crucible_ptload_materialize_f32(const crucible_ptload* f, size_t index, float* out,
                                    size_t out_len) {
  return guarded("crucible_ptload_materialize_f32", [&] {
    if (f == nullptr || out == nullptr)
      return fail("crucible_ptload_materialize_f32: NULL handle or out");
    if (index >= f->sd.tensors().size())
      return fail("crucible_ptload_materialize_f32: index out of range");
    const auto& t = f->sd.tensors()[index].tensor;
    const auto n = static_cast<size_t>(t.numel());
    if (out_len < n)
      return fail("crucible_ptload_materialize_f32: out has " + std::to_string(out_len) +
                  " floats, tensor needs " + std::to_string(n));
    t.materialize_f32(std::span<float>(out, n));
    return 0;
  });
}

const char* crucible_ptload_last_error(void) {
  return g_use_fixed ? g_fixed_error : g_error.c_str();
}

}  // extern "C"
