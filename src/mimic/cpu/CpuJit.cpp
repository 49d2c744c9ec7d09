// CpuJit.cpp — the process's compiled kernels: memory, then disk, then the code generator; one
// ORC LLJIT links every object (CpuJit.h).
#include "crucible/mimic/CpuJit.h"

#include <chrono>
#include <mutex>

#include "crucible/graph/KernelCache.h"
#include "crucible/mimic/CpuTarget.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

namespace crucible::mimic {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string message(llvm::Error e) { return llvm::toString(std::move(e)); }

struct Jit {
  std::mutex mu;  // loading and compiling
  std::unique_ptr<llvm::orc::LLJIT> lljit;
  graph::KernelCache<CompiledPointwise> memory;
  std::mutex math_mu;
  std::optional<VectorMath> math;  // Note [Vector math]
  std::string no_math;             // why the host gave none
  bool math_defined = false;       // in lljit's main JITDylib (under mu)
};

Jit& jit() {
  static Jit* j = new Jit();  // never destroyed: generated code may run during static dtors
  return *j;
}

Result<void*> lookup(llvm::orc::LLJIT& lljit, const std::string& name) {
  auto sym = lljit.lookup(name);
  if (!sym)
    return bad_state("the JIT has no " + name + ": " + message(sym.takeError()), "report it");
#if LLVM_VERSION_MAJOR >= 15
  return sym->toPtr<void*>();
#else
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(sym->getAddress()));
#endif
}

// Note [Vector math]: the process's functions, as absolute symbols of the JIT's main JITDylib.
Status define_vector_math(Jit& j) {
  std::optional<VectorMath> m = vector_math();
  if (!m || j.math_defined) return ok_status();
  llvm::orc::SymbolMap syms;
  auto add = [&](const char* name, void* fn) {
#if LLVM_VERSION_MAJOR >= 17
    syms[j.lljit->mangleAndIntern(name)] = {llvm::orc::ExecutorAddr::fromPtr(fn),
                                            llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable};
#else
    syms[j.lljit->mangleAndIntern(name)] = llvm::JITEvaluatedSymbol(
        static_cast<llvm::JITTargetAddress>(reinterpret_cast<std::uintptr_t>(fn)),
        llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable);
#endif
  };
  add("crucible_vexp_f32", m->exp_f32);
  add("crucible_vexp_f64", m->exp_f64);
  add("crucible_vlog_f32", m->log_f32);
  add("crucible_vlog_f64", m->log_f64);
  if (llvm::Error e = j.lljit->getMainJITDylib().define(llvm::orc::absoluteSymbols(std::move(syms))))
    return bad_state("cannot give the JIT the vector math: " + message(std::move(e)), "report it");
  j.math_defined = true;
  return ok_status();
}

// The JIT, started once, with the C library's and the vector math's symbols.
Status ensure_jit(Jit& j) {
  if (!j.lljit) {
    auto made = llvm::orc::LLJITBuilder().create();
    if (!made)
      return bad_state("cannot start the ORC JIT: " + message(made.takeError()), "report it");
    // LLVM turns a loop that stores one byte pattern (zero_, zeros_like) or copies contiguous
    // memory into a call to memset or memcpy: the JIT is given those three from the process's
    // C library (ELF names: no global prefix on the Linux targets this runs on).
    auto libc = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
        (*made)->getDataLayout().getGlobalPrefix(), [](const llvm::orc::SymbolStringPtr& name) {
          return *name == "memset" || *name == "memcpy" || *name == "memmove";
        });
    if (!libc) return bad_state("cannot give the JIT the C library: " + message(libc.takeError()), "report it");
    (*made)->getMainJITDylib().addGenerator(std::move(*libc));
    j.lljit = std::move(*made);
  }
  return define_vector_math(j);
}

// Links `object` into the started JIT and finds its entry points.
Result<CompiledPointwise> link(Jit& j, const std::string& object, const std::string& prefix,
                               bool fused, bool reduction) {
  auto buf = llvm::MemoryBuffer::getMemBufferCopy(object, prefix);
  // The object's symbols are tracked: an object that does not provide the entry points (a
  // cache entry holding another kernel's code) is removed again, or its symbols would stay
  // defined and the real kernel of that name could never be added ("Duplicate definition").
  llvm::orc::ResourceTrackerSP tracker = j.lljit->getMainJITDylib().createResourceTracker();
  if (llvm::Error e = j.lljit->addObjectFile(tracker, std::move(buf)))
    return bad_state("the JIT refused the object of " + prefix + ": " + message(std::move(e)),
                     "remove the kernel cache directory's entry and run again");
  CompiledPointwise r;
  Status missing = ok_status();
  auto find = [&](const char* suffix) -> void* {
    if (!missing.ok()) return nullptr;
    auto f = lookup(*j.lljit, prefix + suffix);
    if (!f.ok()) missing = f.status();
    return f.ok() ? *f : nullptr;
  };
  r.contig = reinterpret_cast<ContigFn>(find("_contig"));
  if (!reduction) {  // Note [Generated sums]: a reduction has one function
    r.strided = reinterpret_cast<StridedFn>(find("_strided"));
    if (fused) r.contig_fused = reinterpret_cast<ContigFn>(find("_contig_fused"));
  }
  if (!missing.ok()) {
    if (llvm::Error e = tracker->remove()) llvm::consumeError(std::move(e));
    return missing;
  }
  return r;
}

}  // namespace

Status set_vector_math(const VectorMath& m) {
  if (m.vector_bytes != 32 && m.vector_bytes != 64)
    return invalid_input("vector math of " + std::to_string(m.vector_bytes) + "-byte vectors",
                         "give functions over 32-byte (AVX2) or 64-byte (AVX-512) vectors");
  if (m.name.empty() || m.exp_f32 == nullptr || m.exp_f64 == nullptr || m.log_f32 == nullptr ||
      m.log_f64 == nullptr)
    return invalid_input("vector math \"" + m.name + "\" without a name or one of its four functions",
                         "give exp and log for float32 and float64, and a name");
  if (m.vector_bytes == 64 && !runs_on("+avx512f", host_target()))
    return invalid_input("vector math over 64-byte vectors on a CPU without AVX-512",
                         "give the 32-byte (AVX2) functions");
  if (!runs_on("+avx2", host_target()))
    return invalid_input("vector math on a CPU without AVX2", "softmax runs as a library call here: give none");
  Jit& j = jit();
  std::lock_guard<std::mutex> lock(j.math_mu);
  if (j.math) {
    const VectorMath& o = *j.math;
    if (o.name == m.name && o.vector_bytes == m.vector_bytes && o.exp_f32 == m.exp_f32 &&
        o.exp_f64 == m.exp_f64 && o.log_f32 == m.log_f32 && o.log_f64 == m.log_f64)
      return ok_status();
    return bad_state("this process was given vector math \"" + o.name + "\" already, now \"" + m.name + "\"",
                     "give one set of functions per process (compiled kernels call them by name)");
  }
  j.math = m;
  return ok_status();
}

std::optional<VectorMath> vector_math() {
  Jit& j = jit();
  std::lock_guard<std::mutex> lock(j.math_mu);
  return j.math;
}

void set_no_vector_math(std::string why) {
  Jit& j = jit();
  std::lock_guard<std::mutex> lock(j.math_mu);
  j.no_math = std::move(why);
}

std::string no_vector_math() {
  Jit& j = jit();
  std::lock_guard<std::mutex> lock(j.math_mu);
  return j.no_math;
}

Result<std::shared_ptr<const CompiledPointwise>> get_pointwise(const PointwiseProgram& program,
                                                               std::string_view recipe,
                                                               const ObjectCache* disk,
                                                               CacheStats* stats) {
  const CpuTarget& host = host_target();
  const ContentHash content = program.hash();
  // In memory a kernel is found by its program and recipe (the host, LLVM and the options are
  // the process's own); the full key's text, with the host's features, is made on a miss only: a
  // plan's prepare looks up every run, and a bound size's plan (Note [Bound exec plans]) a
  // hundred or more of them, each hit cheap this way.
  const graph::KernelKey mem_key{content, content_hash(recipe)};
  Jit& j = jit();
  if (auto hit = j.memory.find(mem_key)) {
    ++stats->memory_hits;
    return hit;
  }
  std::lock_guard<std::mutex> lock(j.mu);
  if (auto hit = j.memory.find(mem_key)) {  // another thread made it while this one waited
    ++stats->memory_hits;
    return hit;
  }
  CRUCIBLE_RETURN_IF_ERROR(ensure_jit(j));
  const CpuKernelKey key = cpu_kernel_key(content, recipe, host, kCpuOptLevel);
  const std::string prefix = "crucible_pw_" + key.hash.hex();
  std::string object;
  bool from_disk = false;
  if (disk != nullptr) {
    const auto t = Clock::now();
    ObjectCache::Loaded l = disk->load(key, host);
    if (l.outcome == ObjectCache::Outcome::Hit) {
      object = std::move(l.object);
      from_disk = true;
      stats->load_seconds += seconds_since(t);
    } else if (l.outcome == ObjectCache::Outcome::Rejected) {
      ++stats->disk_rejected;
      stats->last_disk_problem = l.why;
    }
  }
  auto compile = [&]() -> Status {
    const auto t = Clock::now();
    auto obj = compile_pointwise(program, prefix, host);
    if (!obj.ok()) return obj.status();
    object = std::move(*obj);
    ++stats->compiled;
    stats->compile_seconds += seconds_since(t);
    if (disk != nullptr)
      if (Status st = disk->store(key, object); !st.ok()) {
        ++stats->disk_write_failures;
        stats->last_disk_problem = st.ToString();
      }
    return ok_status();
  };
  if (!from_disk) CRUCIBLE_RETURN_IF_ERROR(compile());
  const bool scaled = program.scaled(), reduction = program.reduce != ReduceKind::None;
  auto t = Clock::now();
  auto linked = link(j, object, prefix, scaled, reduction);
  if (!linked.ok() && from_disk) {
    // A whole entry (its checksum right) whose object does not link as this kernel: rejected
    // like a corrupt one, compiled again, and the entry replaced.
    ++stats->disk_rejected;
    stats->last_disk_problem = "the cached object of " + prefix + " did not link: " + linked.status().ToString();
    from_disk = false;
    CRUCIBLE_RETURN_IF_ERROR(compile());
    t = Clock::now();
    linked = link(j, object, prefix, scaled, reduction);
  }
  if (!linked.ok()) return linked.status();
  linked->key = key.text;
  stats->load_seconds += seconds_since(t);
  if (from_disk) ++stats->disk_hits;
  auto shared = std::make_shared<const CompiledPointwise>(std::move(*linked));
  j.memory.insert(mem_key, shared);
  return shared;
}

}  // namespace crucible::mimic
