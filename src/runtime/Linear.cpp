// Linear.cpp — fully connected layer: own GEMV for few rows, OpenBLAS sgemm from kBlasRows on.
#include "crucible/runtime/Linear.h"

#include <cblas.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/auxv.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

#include "Microkernels.h"
#include "crucible/core/Contract.h"

namespace crucible::runtime {
namespace {

// Note [Lazy OpenBLAS] in Linear.h. CRUCIBLE_OPENBLAS_PATH is the library CMake found.
using SgemmFn = decltype(&cblas_sgemm);
struct Blas {
  SgemmFn sgemm = nullptr;
  std::string status = "not loaded yet";
};
std::once_flag g_blas_once;
Blas g_blas;
std::atomic<bool> g_blas_tried{false};

void load_blas();

// A program without an ELF interpreter is linked statically (crucible_deploy_binary): dlopen()
// there would need the build machine's exact glibc at run time, so it is not attempted.
bool statically_linked() {
  const auto* ph = reinterpret_cast<const ElfW(Phdr)*>(getauxval(AT_PHDR));
  const unsigned long n = getauxval(AT_PHNUM);
  if (ph == nullptr) return false;
  for (unsigned long i = 0; i < n; ++i) {
    if (ph[i].p_type == PT_INTERP) return false;
  }
  return true;
}

const Blas& blas() {
  std::call_once(g_blas_once, [] {
    load_blas();
    g_blas_tried.store(true, std::memory_order_release);
  });
  return g_blas;
}

void load_blas() {
  if (statically_linked()) {
    g_blas.status = "this binary is linked statically, so OpenBLAS cannot be loaded; linear "
                    "layers use the built-in kernel for every row count";
    return;
  }
  {  // tries the configured library, then the soname on the default search path
    const char* paths[] = {CRUCIBLE_OPENBLAS_PATH, "libopenblas.so.0"};
    std::string errors;
    for (const char* path : paths) {
      void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        const char* e = dlerror();
        errors += std::string(errors.empty() ? "" : "; ") + (e ? e : path);
        continue;
      }
      if (auto* fn = reinterpret_cast<SgemmFn>(dlsym(h, "cblas_sgemm"))) {
        g_blas.sgemm = fn;
        g_blas.status = std::string("loaded from ") + path;
        return;
      }
      errors += std::string(errors.empty() ? "" : "; ") + path + " has no cblas_sgemm";
    }
    g_blas.status = "OpenBLAS could not be loaded (" + errors +
                    "); linear layers use the built-in kernel for every row count";
  }
}

}  // namespace

std::string blas_status() {
  // Reports without forcing a load; g_blas is written once, before g_blas_tried is released.
  return g_blas_tried.load(std::memory_order_acquire) ? g_blas.status : "not loaded yet";
}

Result<PackedLinear> PackedLinear::make(std::int64_t in_features, std::int64_t out_features,
                                        std::span<const float> weight, std::span<const float> bias,
                                        Activation act) {
  constexpr std::int64_t kMax = std::int64_t{1} << 30;
  if (in_features < 1 || out_features < 1 || in_features > kMax || out_features > kMax) {
    return invalid_input("linear: in_features=" + std::to_string(in_features) +
                             " out_features=" + std::to_string(out_features) + " out of range",
                         "pass the sizes of the torch.nn.Linear the weights came from");
  }
  if (static_cast<std::int64_t>(weight.size()) != in_features * out_features) {
    return invalid_input("linear: weight has " + std::to_string(weight.size()) +
                             " elements, expected out_features*in_features = " +
                             std::to_string(in_features * out_features),
                         "pass the [out_features, in_features] weight");
  }
  if (!bias.empty() && static_cast<std::int64_t>(bias.size()) != out_features) {
    return invalid_input("linear: bias has " + std::to_string(bias.size()) + " elements, expected " +
                             std::to_string(out_features),
                         "pass the [out_features] bias, or none");
  }
  PackedLinear p;
  p.in_ = in_features;
  p.out_ = out_features;
  p.act_ = act;
  p.weight_ = std::make_shared<const std::vector<float>>(weight.begin(), weight.end());
  p.bias_ = bias.empty() ? std::make_shared<const std::vector<float>>(static_cast<std::size_t>(out_features), 0.0f)
                         : std::make_shared<const std::vector<float>>(bias.begin(), bias.end());
  return p;
}

PackedLinear PackedLinear::with_activation(Activation act) const {
  PackedLinear p = *this;
  p.act_ = act;
  return p;
}

void PackedLinear::run(const float* x, std::int64_t rows, float* y) const {
  CRUCIBLE_PRE(x != nullptr && y != nullptr && rows >= 0, "linear: null buffer or negative rows");
  const SgemmFn sgemm = rows >= kBlasRows ? blas().sgemm : nullptr;
  if (sgemm == nullptr) {
    detail::GemvBlock g;
    g.x = x;
    g.rows = rows;
    g.in = in_;
    g.out = out_;
    g.w = weight_->data();
    g.bias = bias_->data();
    g.act = act_;
    g.y = y;
    detail::gemv(g);
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) std::copy(bias_->begin(), bias_->end(), y + r * out_);
  // cblas takes int sizes: rows go in chunks that fit (in_ and out_ are <= 2^30 by make()).
  constexpr std::int64_t kChunk = std::int64_t{1} << 30;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kChunk) {
    const std::int64_t m = std::min(kChunk, rows - r0);
    sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(out_),
          static_cast<int>(in_), 1.0f, x + r0 * in_, static_cast<int>(in_), weight_->data(),
          static_cast<int>(in_), 1.0f, y + r0 * out_, static_cast<int>(out_));
  }
  detail::apply_activation(act_, y, rows * out_);
}

}  // namespace crucible::runtime
