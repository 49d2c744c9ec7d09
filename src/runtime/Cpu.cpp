// Cpu.cpp — CPUID-based ISA choice for the runtime kernels, overridable by CRUCIBLE_RUNTIME_ISA.
#include "crucible/runtime/Cpu.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace crucible::runtime {
namespace {

Isa initial_isa() noexcept {
  Isa isa = best_isa();
  if (const char* env = std::getenv("CRUCIBLE_RUNTIME_ISA"); env != nullptr && *env != '\0') {
    if (std::strcmp(env, "portable") == 0) {
      isa = Isa::Portable;
    } else if (std::strcmp(env, "avx2") == 0 && isa_available(Isa::Avx2Fma)) {
      isa = Isa::Avx2Fma;
    } else {
      // Not an error value: this runs before main. Say it once, on stderr, and keep the best.
      std::fprintf(stderr,
                   "crucible: CRUCIBLE_RUNTIME_ISA=%s is not 'portable' or an available 'avx2'; "
                   "using %s\n",
                   env, std::string(isa_name(isa)).c_str());
    }
  }
  return isa;
}

std::atomic<Isa>& active() {
  static std::atomic<Isa> isa{initial_isa()};
  return isa;
}

}  // namespace

std::string_view isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::Portable: return "portable";
    case Isa::Avx2Fma: return "avx2";
  }
  return "?";
}

bool isa_available(Isa isa) noexcept {
  switch (isa) {
    case Isa::Portable: return true;
    case Isa::Avx2Fma:
#if defined(__x86_64__) || defined(__i386__)
      // __builtin_cpu_supports checks CPUID and that the OS saves the YMM state (XGETBV).
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
}

Isa best_isa() noexcept {
  return isa_available(Isa::Avx2Fma) ? Isa::Avx2Fma : Isa::Portable;
}

Isa current_isa() noexcept { return active().load(std::memory_order_relaxed); }

Status set_isa(Isa isa) {
  if (!isa_available(isa)) {
    return unsupported("this CPU lacks the " + std::string(isa_name(isa)) + " instruction set",
                       "use Isa::Portable (or best_isa())");
  }
  active().store(isa, std::memory_order_relaxed);
  return ok_status();
}

std::string_view activation_name(Activation a) noexcept {
  switch (a) {
    case Activation::None: return "none";
    case Activation::Relu: return "relu";
    case Activation::Gelu: return "gelu";
    case Activation::GeluTanh: return "gelu_tanh";
    case Activation::Sigmoid: return "sigmoid";
    case Activation::Tanh: return "tanh";
  }
  return "?";
}

}  // namespace crucible::runtime
