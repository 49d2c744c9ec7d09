// CpuBackend.h — the CPU backend: an exec::Backend that runs generated native code for the
// plan kernels it covers and library calls through the provider for the rest.
//
// Covered today: chains of elementwise float32/float64 calls (PointwiseProgram.h), with
// broadcasting and any strides, compiled bit-exact (BITEXACT_STRICT), or within a stated bound
// of ATen's bits with CpuBackendOptions::fast (ORDERED). prepare() lowers every
// kernel, fetches each covered one from the kernel cache (CpuJit.h: memory, then disk, then
// LLVM) and keeps what each launch needs; run_kernel picks the contiguous loop when every
// operand is dense in the iteration order (or broadcast), else runs the strided loop over the
// innermost merged dim for each index of the outer dims; either splits over threads when large.
//
// One CpuBackend serves one Runner (its prepared state is the plan's); it must outlive it.
// Threads: as a Runner (one run at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/exec/Backend.h"
#include "crucible/forge/NumericalRecipe.h"
#include "crucible/mimic/CpuCodegen.h"
#include "crucible/mimic/CpuJit.h"
#include "crucible/mimic/WorkerPool.h"

namespace crucible::mimic {

struct Generated;  // a run's generated code (CpuBackend.cpp)
struct Run;  // a stretch of a kernel's calls: generated code or library calls (CpuBackend.cpp)

enum class AlphaRounding : std::uint8_t { Unknown = 0, Twice = 1, Once = 2 };

struct CpuBackendOptions {
  bool disk_cache = true;
  std::string cache_dir;  // empty: default_cache_dir(), under it "mimic-cpu"
  // How ATen rounds `a + alpha*b` in this process (Note [ATen's alpha rounding],
  // CpuBackend.cpp); unset: aten_alpha_rounding().
  std::optional<AlphaRounding> alpha_rounding;
  // Threads for one large contiguous generated loop (Note [Split loops], CpuBackend.cpp); 0: the
  // hardware's. The process shares one pool, sized by the first backend made (at least the
  // hardware's threads); a backend uses at most its own count of them. With `parallel` and
  // `current_threads` given, the host's count at each launch instead.
  unsigned threads = 0;
  // Runs body(arg, i) for i in [0, parts) on the host program's own threads, returning when all
  // are done (the Vessel passes ATen's parallel_for: one pool of threads for ATen's kernels and
  // the generated loops, none spinning while the other's run). Null: the backend's WorkerPool.
  using ParallelFn = void (*)(void* ctx, unsigned parts, void (*body)(void* arg, unsigned part),
                              void* arg);
  ParallelFn parallel = nullptr;
  void* parallel_ctx = nullptr;
  // The threads the host's own kernel would use at the time of a launch (the Vessel passes
  // ATen's count, 1 inside a parallel region, where ATen runs loops inline): float32
  // _softmax_backward_data's bits depend on it (Note [Generated softmax]), and with `parallel`
  // split loops and rows run in that many parts. Null: `threads`.
  unsigned (*current_threads)() = nullptr;
  // numerics="fast" (Note [Fast numerics], CpuBackend.cpp): also generate what is not ATen's
  // bits but within a stated bound of them (sqrt; a + c*b rounded once where ATen rounds twice).
  bool fast = false;
  // Runs of one program launch together as one table (Note [Launch tables], CpuBackend.cpp);
  // false: each run alone, in call order (the Vessel's CRUCIBLE_LAUNCH_TABLES=0, for comparison).
  bool launch_tables = true;

  static CpuBackendOptions memory_only() {  // no disk cache
    CpuBackendOptions o;
    o.disk_cache = false;
    return o;
  }
  static CpuBackendOptions with_cache_dir(std::string dir) {
    CpuBackendOptions o;
    o.cache_dir = std::move(dir);
    return o;
  }
};

// How ATen's kernels here round `a + alpha*b`, as ATen picks its CPU kernels: Once with its AVX2
// and AVX-512 kernels (x86-64 with AVX2 and FMA), Twice with its default kernels (no AVX2+FMA,
// or ATEN_CPU_CAPABILITY=default), Unknown off x86-64.
AlphaRounding aten_alpha_rounding();

// What prepare decided for one plan kernel.
struct CpuKernelState {
  bool generated = false;             // every call of the kernel runs generated code
  std::uint32_t generated_calls = 0;  // the calls that do (Note [Kernel runs], CpuBackend.cpp)
  std::uint32_t generated_runs = 0;   // the generated programs they make up
  // Note [Launch tables] (CpuBackend.cpp): tables of two runs or more of one program, launched
  // as one, and the runs in them.
  std::uint32_t table_launches = 0, table_runs = 0;
  // Note [Sum prologues] (PointwiseProgram.h): runs that are a pointwise chain and the sum it
  // feeds, the chain's result never written.
  std::uint32_t prologue_sums = 0;
  const forge::NumericalRecipe* recipe = nullptr;  // generated: the recipe the code realizes
  std::string why;  // not every call generated: why the first library call is not
  // generated: where its code came from — "memory" (this process had it), "disk" (the kernel
  // cache's second level), "compiled"
  std::string_view cache;
};

class CpuBackend {
 public:
  // Errors: a disk cache directory that cannot be made.
  static Result<std::unique_ptr<CpuBackend>> make(CpuBackendOptions options = {});
  ~CpuBackend();
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  // The slots, bound to this object.
  exec::Backend backend();

  const CacheStats& stats() const { return stats_; }
  std::span<const CpuKernelState> kernels() const { return states_; }
  std::uint32_t generated_kernels() const;
  // Per plan call, whether generated code runs it (hoisted calls of a run excluded).
  std::vector<bool> generated_call_mask() const;
  // Launches of generated kernels run as library calls instead, because an alpha was not 1 or
  // -1 in that run (Note [Pointwise programs]).
  std::uint64_t library_launches() const { return library_launches_; }
  // Launches of a kernel with launch tables that ran in call order instead, because distinct
  // Input or Output slots were overlapping memory (Note [Launch tables], CpuBackend.cpp).
  std::uint64_t call_order_launches() const { return call_order_launches_; }
  // Bytes of the backend's own buffers outside the plan's arena, as held now: layer norm
  // backward's part buffers (Note [Generated layer norm backward], CpuBackend.cpp), grown at a
  // launch to the parts of that launch's thread count and kept: the most a launch needed so far.
  std::uint64_t scratch_bytes() const;

 private:
  struct Prepared;
  struct TableRow;
  CpuBackend() = default;
  static Status prepare(void* self, const exec::ExecutionPlan& plan);
  static Status run_kernel(void* self, const exec::KernelLaunch& launch);
  static Status memory_use(void* self, const exec::ExecutionPlan& plan, exec::MemoryUse& use);
  struct GeneratedRun;
  bool may_run_library_calls(const Generated& g) const;
  Status prepare_kernel(const exec::ExecutionPlan& plan, std::uint32_t k);
  Result<std::unique_ptr<GeneratedRun>> generate(const exec::ExecutionPlan& plan, std::uint32_t k,
                                                 std::uint32_t begin, std::uint32_t count,
                                                 std::span<const std::uint32_t> hoisted,
                                                 std::string_view* cache);
  Result<std::unique_ptr<GeneratedRun>> generate_lowered(const PointwiseKernel& pk, std::string_view* cache);
  void schedule_tables(const exec::ExecutionPlan& plan, const exec::Kernel& kn, Prepared& pr) const;
  Status launch_run(Run& r, const exec::KernelLaunch& launch);
  static bool bound_memory_apart(Prepared& pr, const exec::KernelLaunch& launch);
  Status launch_table(Prepared& pr, std::span<const std::uint32_t> step,
                      const exec::KernelLaunch& launch);
  bool pointwise_launch(Generated& g, const exec::KernelLaunch& launch, ContigFn* fn);
  static bool program_params(const Generated& g, const exec::KernelLaunch& launch,
                             std::uint64_t* out);
  bool launch_generated(Generated& g, const exec::KernelLaunch& launch);
  void run_contig(Generated& g, ContigFn fn);
  void run_rows(Generated& g);
  void run_layer_norm_backward(Generated& g);
  static void run_lines(const Generated& g, std::int64_t begin, std::int64_t end,
                        std::vector<std::int64_t>& index, std::vector<char*>& ptrs);
  unsigned split_threads() const;
  void run_parts(unsigned parts, const std::function<void(unsigned)>& part);

  std::unique_ptr<ObjectCache> disk_;
  AlphaRounding alpha_rounding_ = AlphaRounding::Unknown;
  const exec::ExecutionPlan* plan_ = nullptr;
  std::vector<CpuKernelState> states_;
  std::vector<std::unique_ptr<Prepared>> prepared_;  // per plan kernel; null: library calls
  CacheStats stats_;
  std::uint64_t library_launches_ = 0;
  std::uint64_t call_order_launches_ = 0;
  std::vector<TableRow> table_;  // launch_table's rows (scratch)
  bool fast_ = false;
  bool launch_tables_ = true;
  WorkerPool* pool_ = nullptr;  // Note [Split loops]; unused with parallel_
  CpuBackendOptions::ParallelFn parallel_ = nullptr;
  void* parallel_ctx_ = nullptr;
  unsigned (*current_threads_)() = nullptr;
  unsigned threads_ = 1;        // parts a loop may run in (on the pool, or on the host's without current_threads)
};

}  // namespace crucible::mimic
