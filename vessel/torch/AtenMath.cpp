// AtenMath.cpp — see AtenMath.h.
#include "AtenMath.h"

#include <ATen/Version.h>
#include <dlfcn.h>

#include "crucible/mimic/CpuJit.h"

namespace crucible::vessel {
namespace {

std::string find_and_give() {
  // ATen runs its softmax kernels (registered for AVX-512 too, misc/ATEN_ORDER.md 1.1) at the
  // process's capability; under DEFAULT they use libm's exp, which is not these functions.
  const std::string cap = at::get_cpu_capability();
  const bool avx512 = cap == "AVX512";
  if (!avx512 && cap != "AVX2") return "ATen's CPU capability is " + cap + ", not AVX512 or AVX2";
  // libtorch_cpu is loaded (this module links it); RTLD_NOLOAD finds it by its soname whether
  // or not Python loaded it into the global scope.
  void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return std::string("libtorch_cpu.so is not loaded by that name: ") + dlerror();
  const char* isa = avx512 ? "avx512f" : "avx2";
  auto sym = [&](const std::string& base) { return dlsym(lib, (base + isa).c_str()); };
  mimic::VectorMath m;
  m.name = "sleef_u10/" + cap;
  m.vector_bytes = avx512 ? 64 : 32;
  m.exp_f32 = sym(avx512 ? "Sleef_expf16_u10" : "Sleef_expf8_u10");
  m.exp_f64 = sym(avx512 ? "Sleef_expd8_u10" : "Sleef_expd4_u10");
  m.log_f32 = sym(avx512 ? "Sleef_logf16_u10" : "Sleef_logf8_u10");
  m.log_f64 = sym(avx512 ? "Sleef_logd8_u10" : "Sleef_logd4_u10");
  dlclose(lib);  // the module's own reference keeps it loaded
  if (m.exp_f32 == nullptr || m.exp_f64 == nullptr || m.log_f32 == nullptr || m.log_f64 == nullptr)
    return "this libtorch_cpu.so does not export SLEEF's " + std::string(isa) + " exp and log";
  const Status st = mimic::set_vector_math(m);
  return st.ok() ? std::string() : message_of(st);
}

}  // namespace

const std::string& provide_aten_vector_math() {
  static const std::string why_not = [] {
    std::string why = find_and_give();
    if (!why.empty()) mimic::set_no_vector_math(why);  // said by each softmax not generated
    return why;
  }();
  return why_not;
}

}  // namespace crucible::vessel
