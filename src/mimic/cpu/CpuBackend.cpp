// CpuBackend.cpp — prepare lowers and compiles the covered kernels; run_kernel launches them
// over the plan's memory, or sends the kernel's calls to the provider (CpuBackend.h).
//
// Note [ATen's alpha rounding]
// ATen's add/sub compute a + alpha*b (sub: alpha negated). Measured on torch 2.13's AVX-512 and
// AVX2 kernels, element by element against both roundings: an op whose inputs all have the
// output's sizes (any layout, dtypes mixed or not) rounds it once at every element — its
// vectorized loop uses vec::fmadd, and the compiler contracted its scalar loop too. An op with a
// broadcast input (a 0-d tensor or Python number, a [3, 1] against [3, 28]) rounds once at some
// elements and twice at others, in a pattern set by how the compiler vectorized ATen's scalar
// loop. ATen's default kernels (no AVX2+FMA) round twice everywhere. So a kernel whose alpha is
// 1 or -1 (alpha*b exact: both roundings agree) runs its code; another alpha runs
// P_contig_fused where ATen rounds once (contiguous operands, no broadcast input to a scaled
// op), P_contig or P_strided where it rounds twice, and the kernel's calls as library calls
// otherwise (CpuBackend::library_launches). addcmul and lerp round their product into the sum the
// same way (measured the same way, float32 and float64, sizes 3 to 1000003), whatever their
// value or weight. aten_conformance_test checks this against ATen.

// Note [Fast numerics]
// numerics="fast" (CpuBackendOptions::fast) generates two things bit-exact kernels leave to
// ATen, each within a bound per operation that aten_conformance_test checks: sqrt, as IEEE sqrt
// (ATen's is within 1 ulp of it), and `a + c*b` (add/sub with an alpha, addcmul, lerp) rounded
// once in a contiguous loop and twice in a strided one whatever ATen does there (the two differ
// by at most 1 ulp of c*b, after the rounding of c*b itself). Its kernels are pinned to an
// ORDERED recipe (the same bits run after run on one machine, not ATen's) and cached apart from
// the bit-exact ones.

// Note [Kernel runs]
// A plan kernel (an IR002 group) may hold calls the backend does not generate (a GEMM, a
// reduction) beside pointwise ones, and pointwise calls of several iteration shapes (an
// optimizer's group over every parameter). prepare splits a kernel's calls into runs: each
// maximal stretch of consecutive covered calls whose outputs have one size is lowered as one
// program (lower_pointwise_calls), every other call is a run of library calls, and a stretch
// the lowering refuses becomes library calls too. A host read inside a stretch (AdamW's
// step.item() between a parameter's moments and its update: op_trait::kHostRead, no output)
// whose inputs no earlier call of the stretch writes runs as a library call just before it
// instead of splitting it. run_kernel runs the runs in call order. A
// value a later run reads is stored by the run that makes it (the plan gives every value
// memory). CpuKernelState says whether every call of the kernel is generated, how many are, and
// why the first call that is not is not.

// Note [Launch tables]
// An optimizer's group makes the same runs for every parameter (AdamW bit-exact: the step's
// increment, the moments, ATen's step.item() and sqrt, the update), each a launch of its own
// beside the library calls between them. Its programs are shape-free (a parameter's size is a
// launch argument), so runs of one contiguous program launch together as one table: a row per
// run (its operands' addresses, its element count, its parameters), split over threads by the
// table's total elements in parts of whole 64-element blocks of a row, as one split loop is
// (Note [Split loops]): every element is computed by the same code as alone, so the bits do not
// change. The schedule keeps call order but for the rows a table takes from later in the kernel:
// a run in call order takes every later run of its program that is ready (every earlier run
// touching a slot it touches has run: reads and writes alike, Constant slots no call writes
// read-only), that always runs its own code and that stores no Arena slot, up to kTableElements.
// So no value lives longer than in call order and the arena placement stands as it is: library
// calls (and the memory ATen takes in them) keep their places. Bit-exact AdamW makes two tables,
// the increments and the moments; each update waits for its sqrt and runs alone. A kernel with no
// table keeps call order. The order holds while distinct Input and Output slots are distinct
// memory (a caller may bind one tensor to two arguments): a launch whose bound memory overlaps
// runs the kernel in call order.
#include "crucible/mimic/CpuBackend.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <thread>
#include <vector>

#include "crucible/core/OpTable.h"
#include "crucible/core/ScalarType.h"

namespace crucible::mimic {

// The generated code of one run and what a launch of it needs.
struct Generated {
  std::shared_ptr<const CompiledPointwise> fns;
  std::vector<std::uint32_t> operand_tensor;
  std::vector<std::int64_t> elem_bytes;  // per operand
  std::vector<std::uint32_t> param_scalar;
  std::vector<record::ScalarRecord> fixed_scalars;  // PointwiseKernel::kFixedScalar's
  std::vector<std::pair<std::uint32_t, std::uint64_t>> fixed_from;  // and the scalars they follow
  std::vector<std::int8_t> param_dtype;
  std::vector<std::uint32_t> unit_params;  // alpha parameters
  bool always_scaled = false;              // addcmul, lerp: no alpha makes the roundings agree
  // No scaled op has a broadcast input (Note [ATen's alpha rounding]).
  bool scaled_unbroadcast = false;
  std::int64_t numel = 0;
  bool contig = false;
  std::vector<std::uint8_t> advance;  // per operand: 0 for a broadcast one (every part reads it whole)
  // Strided: the iteration's dims of size > 1 with mergeable neighbours merged, innermost
  // last, and each operand's strides over them (operand-major).
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  // Scratch for one launch.
  std::vector<char*> base, ptrs;
  std::vector<std::int64_t> inner, index;
  std::vector<std::uint64_t> params;
  bool reduction = false;  // Note [Generated sums]: contig(base, rows, {cols})
  // Note [Sum prologues]: params[1 + j] is parameter j, passed as a pointwise program's are
  bool prologue = false;
  std::int64_t rows = 0;
  // Note [Split rows]: per operand, its elements per row (0: read whole by every row); empty
  // for a reduction whose rows are not independent (column sums).
  std::vector<std::int64_t> row_elems;
  bool tail_flag = false;  // params[1]: float32 softmax backward's tail fused (Note [Generated softmax])
  // params[2]: set by the kernel when it wrote nothing and its call must run as ATen's (Note
  // [Generated nll_loss]: a target out of range, for ATen to raise its error).
  bool may_refuse = false;
  // Note [Generated var and std]: params[1] is the correction (an int64 when `int_correction`);
  // a launch over at most `correction` elements per result runs ATen's call, which warns that
  // the degrees of freedom are <= 0.
  bool dof_check = false, int_correction = false;
  // Note [Generated layer norm backward]: part buffers after the operands (one per grad_weight
  // and grad_bias), in `part_buffers`.
  std::size_t layer_norm_buffers = 0;
  std::vector<char> part_buffers;
};

struct Run {
  std::uint32_t call_begin = 0, call_count = 0;
  std::unique_ptr<Generated> gen;  // null: library calls
  std::vector<std::uint32_t> hoisted;  // calls in the range run before it (Note [Kernel runs])
};

struct CpuBackend::Prepared {
  std::vector<Run> runs;  // in call order
  // Note [Launch tables]: the runs in launch order, each step one run or a table of runs of one
  // program (indices in `runs`); empty: call order.
  std::vector<std::vector<std::uint32_t>> steps;
  // The Input and Output slots the kernel touches, a tensor on each, and where their memory
  // started at the last launch that followed `steps` (unchanged: no overlap to look for).
  std::vector<std::uint32_t> bound_slots, bound_tensors;
  std::vector<const char*> bound_seen;
  std::vector<const char*> bound_now;                       // scratch: this launch's
  std::vector<std::pair<const char*, const char*>> ranges;  // scratch
};

// One row of a launch table (Note [Launch tables]).
struct CpuBackend::TableRow {
  ContigFn fn = nullptr;
  Generated* g = nullptr;
  std::int64_t first_block = 0;  // of the table's 64-element blocks
};

struct CpuBackend::GeneratedRun {
  std::unique_ptr<Generated> code;
  const forge::NumericalRecipe* recipe = nullptr;
};

namespace {

const forge::NumericalRecipe* pinned_recipe(std::int8_t io, bool fast, bool reduction = false) {
  forge::NumericalRecipe r = *forge::recipe_by_name(fast ? "f32_ordered" : "f32_strict");
  r.accum_dtype = r.io_dtype = io;
  if (reduction) {  // ATen's cascade (Note [Generated sums]): bit-exact, accumulated in io dtype
    r = *forge::recipe_by_name("f32_strict");
    r.accum_dtype = r.io_dtype = io;
    r.reduction = forge::ReductionAlgo::Blocked;
    r.block = 16;
  }
  return forge::intern_recipe(r);
}

std::uint64_t param_bits(const record::ScalarRecord& r, std::int8_t dt) {
  const double d = r.kind == record::ScalarKind::Double ? std::bit_cast<double>(r.bits) : 0.0;
  const auto i = static_cast<std::int64_t>(r.bits);
  if (dt == dtype::kFloat64)
    return std::bit_cast<std::uint64_t>(
        r.kind == record::ScalarKind::Double ? d : static_cast<double>(i));
  // float32: converted from the scalar's own type once (ATen's Scalar::to<float>).
  const float f =
      r.kind == record::ScalarKind::Double ? static_cast<float>(d) : static_cast<float>(i);
  return std::bit_cast<std::uint32_t>(f);
}

// The parameter, as passed, is 1 or -1.
bool is_unit(std::uint64_t bits, std::int8_t dt) {
  const double v = dt == dtype::kFloat64
                       ? std::bit_cast<double>(bits)
                       : static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  return v == 1.0 || v == -1.0;
}

}  // namespace

Result<std::unique_ptr<CpuBackend>> CpuBackend::make(CpuBackendOptions options) {
  std::unique_ptr<CpuBackend> b(new CpuBackend());
  b->alpha_rounding_ = options.alpha_rounding ? *options.alpha_rounding : aten_alpha_rounding();
  b->fast_ = options.fast;
  b->launch_tables_ = options.launch_tables;
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  b->threads_ = options.threads != 0 ? options.threads : hardware;
  b->parallel_ = options.parallel;
  b->parallel_ctx_ = options.parallel_ctx;
  b->current_threads_ = options.current_threads;
  if (b->parallel_ == nullptr) b->pool_ = &WorkerPool::shared(std::max(b->threads_, hardware));
  if (options.disk_cache) {
    std::string dir = options.cache_dir.empty() ? default_cache_dir() : options.cache_dir;
    if (dir.empty())
      return invalid_input(
          "no kernel cache directory: CRUCIBLE_CACHE_DIR, XDG_CACHE_HOME and "
          "HOME are unset",
          "set CRUCIBLE_CACHE_DIR, or make the backend with disk_cache = false");
    auto c = ObjectCache::open(dir + "/mimic-cpu");
    if (!c.ok()) return c.status();
    b->disk_ = std::make_unique<ObjectCache>(std::move(*c));
  }
  return b;
}

CpuBackend::~CpuBackend() = default;

exec::Backend CpuBackend::backend() {
  exec::Backend b;
  b.name = "cpu";
  b.self = this;
  b.prepare = &CpuBackend::prepare;
  b.alloc_arena = exec::default_alloc_arena;
  b.free_arena = exec::default_free_arena;
  b.run_kernel = &CpuBackend::run_kernel;
  b.synchronize = exec::default_synchronize;
  b.memory_use = &CpuBackend::memory_use;
  return b;
}

std::uint32_t CpuBackend::generated_kernels() const {
  std::uint32_t n = 0;
  for (const CpuKernelState& s : states_) n += s.generated ? 1 : 0;
  return n;
}

Status CpuBackend::prepare(void* self, const exec::ExecutionPlan& plan) {
  auto* b = static_cast<CpuBackend*>(self);
  if (b->plan_ != nullptr)
    return bad_state("this CPU backend already serves a Runner",
                     "make one CpuBackend per Runner (compiled kernels are shared through the "
                     "kernel cache)");
  b->plan_ = &plan;
  b->states_.assign(plan.kernels.size(), CpuKernelState{});
  b->prepared_.resize(plan.kernels.size());
  for (std::uint32_t k = 0; k < plan.kernels.size(); ++k)
    CRUCIBLE_RETURN_IF_ERROR(b->prepare_kernel(plan, k));
  return ok_status();
}

Status CpuBackend::prepare_kernel(const exec::ExecutionPlan& plan, std::uint32_t k) {
  const exec::Kernel& kn = plan.kernels[k];
  CpuKernelState& state = states_[k];
  auto prepared = std::make_unique<Prepared>();
  auto library = [&](std::uint32_t begin, std::uint32_t count, std::string why) {
    if (state.why.empty()) state.why = std::move(why);
    if (!prepared->runs.empty() && !prepared->runs.back().gen &&
        prepared->runs.back().call_begin + prepared->runs.back().call_count == begin) {
      prepared->runs.back().call_count += count;
    } else {
      prepared->runs.push_back(Run{begin, count, nullptr, {}});
    }
  };
  // Why call c is a library call, as its lowering says; only the kernel's first reason is kept,
  // so it is asked only while there is none (lowering a call to hear its refusal costs ~1 us).
  auto refusal = [&](std::uint32_t c) -> std::string {
    if (!state.why.empty()) return {};
    auto refused = lower_pointwise_calls(plan, k, c, 1, fast_);
    return refused.ok() ? std::string() : message_of(refused.status());
  };
  std::string_view cache;
  auto sizes_of = [&](std::uint32_t c) { return plan.sizes(plan.tensors[plan.outputs_of(plan.calls[c])[0].tensor]); };
  for (std::uint32_t c = kn.call_begin; c < kn.call_begin + kn.call_count;) {
    const exec::Call& call = plan.calls[c];
    const bool layer_norm = plan.op_names[call.op] == "aten::native_layer_norm";
    const bool layer_norm_bwd = plan.op_names[call.op] == "aten::native_layer_norm_backward";
    const bool softmax = is_softmax_op(plan.op_names[call.op]);
    const bool nll = plan.op_names[call.op] == "aten::nll_loss_forward" || plan.op_names[call.op] == "aten::nll_loss_backward";
    const bool batch_norm = is_batch_norm_op(plan.op_names[call.op]);
    const bool arg_extreme = is_arg_extreme_op(plan.op_names[call.op]);
    const bool variance = is_variance_op(plan.op_names[call.op]);
    const bool extreme = is_extreme_values_op(plan.op_names[call.op]);
    const bool mse = is_mse_loss_sum(plan, c);  // reduction none: a pointwise op
    if (is_reduction_op(plan.op_names[call.op]) || layer_norm || layer_norm_bwd || softmax || nll ||
        batch_norm || arg_extreme || variance || extreme || mse) {
      // Note [Generated sums], Note [Generated layer norm], Note [Generated softmax]: a run of
      // its own. ATen's order is the one of its x86 kernels; elsewhere (16-byte NEON) it differs.
      auto lower = [&]() -> Result<PointwiseKernel> {
        if (layer_norm) return lower_layer_norm(plan, c);
        if (layer_norm_bwd) return lower_layer_norm_backward(plan, c);
        if (nll) return lower_nll_loss(plan, c);
        if (batch_norm) return lower_batch_norm(plan, c);
        if (arg_extreme) return lower_arg_extreme(plan, c);
        if (variance) return lower_variance(plan, c);
        if (extreme) return lower_extreme_values(plan, c);
        if (mse) return lower_mse_loss(plan, c);
        if (!softmax) return lower_reduction(plan, c);
        const std::optional<VectorMath> vm = vector_math();
        if (!vm) return lower_softmax(plan, c, 0, "", no_vector_math());
        return lower_softmax(plan, c, vm->vector_bytes, vm->name);
      };
      auto lowered = host_target().triple.rfind("x86_64", 0) == 0
                         ? lower()
                         : Result<PointwiseKernel>(unsupported(
                               "call " + std::to_string(c) + " (" + plan.op_names[call.op] +
                                   "): ATen's order of operations is known for x86-64 hosts only",
                               "it runs as a library call"));
      auto gen = lowered.ok() ? generate_lowered(*lowered, &cache) : Result<std::unique_ptr<GeneratedRun>>(lowered.status());
      if (!gen.ok()) {
        if (gen.status().code() != absl::StatusCode::kUnimplemented) return gen.status();
        library(c, 1, message_of(gen.status()));
      } else {
        if (state.recipe == nullptr) state.recipe = (*gen)->recipe;
        ++state.generated_calls;
        ++state.generated_runs;
        prepared->runs.push_back(Run{c, 1, std::move((*gen)->code), {}});
      }
      ++c;
      continue;
    }
    if (!covers_op(plan.op_names[call.op], fast_) || call.out_count != 1) {
      library(c, 1, refusal(c));
      ++c;
      continue;
    }
    std::uint32_t end = c + 1;
    std::vector<std::uint32_t> hoisted;
    std::vector<std::uint32_t> written;  // slots the stretch writes so far
    auto write = [&](std::uint32_t call) {
      for (const exec::Arg& a : plan.outputs_of(plan.calls[call])) written.push_back(plan.tensors[a.tensor].slot);
    };
    write(c);
    while (end < kn.call_begin + kn.call_count) {
      const exec::Call& e = plan.calls[end];
      if (covers_op(plan.op_names[e.op], fast_) && e.out_count == 1 &&
          !is_mse_loss_sum(plan, end) && std::ranges::equal(sizes_of(end), sizes_of(c))) {
        write(end++);
        continue;
      }
      const bool host_read = e.out_count == 0 &&
                             (classify_op(plan.op_names[e.op]).traits & op_trait::kHostRead) != 0 &&
                             std::ranges::none_of(plan.inputs_of(e), [&](const exec::Arg& a) {
                               return std::ranges::find(written, plan.tensors[a.tensor].slot) != written.end();
                             });
      if (!host_read) break;
      hoisted.push_back(end++);
    }
    while (!hoisted.empty() && hoisted.back() == end - 1) hoisted.pop_back(), --end;  // none after
    // Note [Sum prologues]: a chain whose one stored result only the sum right after it reads
    // is that sum's prologue: one run, the result never written
    if (hoisted.empty() && end < kn.call_begin + kn.call_count &&
        is_reduction_op(plan.op_names[plan.calls[end].op]) &&
        host_target().triple.rfind("x86_64", 0) == 0) {
      auto merged = lower_sum_with_prologue(plan, k, c, end - c, fast_);
      auto gen = merged.ok() ? generate_lowered(*merged, &cache)
                             : Result<std::unique_ptr<GeneratedRun>>(merged.status());
      if (gen.ok()) {
        // An alpha no patch point reaches is what it is at every launch: 1 or -1, no check and no
        // library calls to keep the chain's intermediates for (memory_use); else the chain and
        // the sum run apart (the chain rounds its alpha as ATen, Note [ATen's alpha rounding])
        Generated& g = *(*gen)->code;
        bool fixed = true, unit = true;
        for (std::uint32_t j : g.unit_params) {
          const std::uint32_t s = g.param_scalar[j];
          fixed = fixed && (s & PointwiseKernel::kFixedScalar) == 0 &&
                  std::ranges::none_of(plan.patches, [&](const exec::PatchPoint& q) {
                    return q.kind == exec::PatchKind::Scalar && q.index == s;
                  });
          unit = unit && (s & PointwiseKernel::kFixedScalar) == 0 &&
                 is_unit(param_bits(plan.scalars[s], g.param_dtype[j]), g.param_dtype[j]);
        }
        if (fixed && unit) g.unit_params.clear();
        if (fixed && !unit)
          gen = Result<std::unique_ptr<GeneratedRun>>(unsupported("an alpha other than 1", ""));
      }
      if (gen.ok()) {
        if (state.recipe == nullptr) state.recipe = (*gen)->recipe;
        state.generated_calls += end - c + 1;
        ++state.generated_runs;
        ++state.prologue_sums;
        prepared->runs.push_back(Run{c, end - c + 1, std::move((*gen)->code), {}});
        c = end + 1;
        continue;
      }
      if (gen.status().code() != absl::StatusCode::kUnimplemented) return gen.status();
    }
    auto gen = generate(plan, k, c, end - c, hoisted, &cache);
    if (!gen.ok()) {
      if (gen.status().code() != absl::StatusCode::kUnimplemented) return gen.status();
      library(c, end - c, message_of(gen.status()));
    } else {
      if (state.recipe == nullptr) state.recipe = (*gen)->recipe;
      for (std::uint32_t h : hoisted) {
        library(h, 1, refusal(h));
      }
      state.generated_calls += end - c - static_cast<std::uint32_t>(hoisted.size());
      ++state.generated_runs;
      prepared->runs.push_back(Run{c, end - c, std::move((*gen)->code), hoisted});
    }
    c = end;
  }
  state.generated = kn.call_count > 0 && state.generated_calls == kn.call_count;
  state.cache = cache;
  if (state.generated) state.why.clear();
  if (kn.call_count == 0) state.why = "kernel " + std::to_string(k) + " has no calls";
  if (launch_tables_) schedule_tables(plan, kn, *prepared);
  for (const auto& step : prepared->steps)
    if (step.size() > 1) {
      ++state.table_launches;
      state.table_runs += static_cast<std::uint32_t>(step.size());
    }
  prepared_[k] = std::move(prepared);
  return ok_status();
}

// Note [Launch tables]: a table holds at most this many elements (1 MB of float32 per operand),
// so a group of large parameters keeps each one's runs close together, its values still in
// cache from one run to the next (bench/PERFLOG.md, "launch tables").
constexpr std::int64_t kTableElements = std::int64_t{1} << 18;

// Note [Launch tables]: the steps of a kernel's runs, or none (call order).
void CpuBackend::schedule_tables(const exec::ExecutionPlan& plan, const exec::Kernel& kn,
                                 Prepared& pr) const {
  const auto n = static_cast<std::uint32_t>(pr.runs.size());
  if (n < 2) return;
  // What a run launches with in a table: its program's contiguous loop; null: alone.
  auto program = [&](std::uint32_t u) -> const void* {
    const Generated* g = pr.runs[u].gen.get();
    return g != nullptr && g->contig && !g->reduction ? g->fns.get() : nullptr;
  };
  {  // most kernels hold no two runs of one program: nothing to schedule
    std::vector<const void*> programs;
    for (std::uint32_t u = 0; u < n; ++u)
      if (const void* p = program(u)) programs.push_back(p);
    std::ranges::sort(programs);
    if (std::adjacent_find(programs.begin(), programs.end()) == programs.end()) return;
  }
  // Constant slots a call of the kernel writes are slots like any other.
  std::vector<bool> read_only(plan.slots.size(), false);
  for (std::uint32_t s = 0; s < plan.slots.size(); ++s)
    read_only[s] = plan.slots[s].kind == exec::SlotKind::Constant;
  for (std::uint32_t c = kn.call_begin; c < kn.call_begin + kn.call_count; ++c)
    for (const exec::Arg& a : plan.outputs_of(plan.calls[c]))
      read_only[plan.tensors[a.tensor].slot] = false;
  std::vector<std::uint32_t> last(plan.slots.size(), exec::kNone);  // the last run touching a slot
  std::vector<std::vector<std::uint32_t>> next(n);                  // the runs depending on a run
  std::vector<std::uint32_t> waits(n, 0);                           // its dependencies not yet run
  std::vector<std::uint32_t> touched, before;
  std::vector<bool> bound(plan.slots.size(), false);
  for (std::uint32_t u = 0; u < n; ++u) {
    const Run& r = pr.runs[u];
    touched.clear();
    before.clear();
    for (std::uint32_t c = r.call_begin; c < r.call_begin + r.call_count; ++c) {
      if (std::ranges::find(r.hoisted, c) != r.hoisted.end()) continue;  // a library run of its own
      const exec::Call& call = plan.calls[c];
      for (std::uint32_t a = call.in_begin; a < call.out_begin + call.out_count; ++a) {
        const std::uint32_t t = plan.args[a].tensor, s = plan.tensors[t].slot;
        touched.push_back(s);
        const exec::SlotKind kind = plan.slots[s].kind;
        if ((kind == exec::SlotKind::Input || kind == exec::SlotKind::Output) && !bound[s]) {
          bound[s] = true;
          pr.bound_slots.push_back(s);
          pr.bound_tensors.push_back(t);
        }
      }
    }
    std::ranges::sort(touched);
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (std::uint32_t s : touched) {
      if (read_only[s]) continue;
      if (last[s] != exec::kNone) before.push_back(last[s]);
      last[s] = u;
    }
    std::ranges::sort(before);
    before.erase(std::unique(before.begin(), before.end()), before.end());
    for (std::uint32_t b : before) next[b].push_back(u);
    waits[u] = static_cast<std::uint32_t>(before.size());
  }
  // Whether a run may launch before its place: it stores no Arena slot (so no value lives longer
  // than in call order) and always runs its own code (never its calls through the provider).
  auto movable = [&](std::uint32_t u) {
    const Run& r = pr.runs[u];
    if (may_run_library_calls(*r.gen)) return false;
    for (std::uint32_t c = r.call_begin; c < r.call_begin + r.call_count; ++c)
      for (const exec::Arg& a : plan.outputs_of(plan.calls[c])) {
        const std::uint32_t s = plan.tensors[a.tensor].slot;
        if (plan.slots[s].kind != exec::SlotKind::Arena) continue;
        for (std::uint32_t t : r.gen->operand_tensor)
          if (plan.tensors[t].slot == s) return false;
      }
    return true;
  };
  std::vector<std::vector<std::uint32_t>> steps;
  std::vector<bool> done(n, false);
  bool table = false;
  for (std::uint32_t u = 0; u < n; ++u) {
    if (done[u]) continue;
    std::vector<std::uint32_t> step{u};
    if (const void* p = program(u)) {
      std::int64_t elements = pr.runs[u].gen->numel;
      for (std::uint32_t v = u + 1; v < n; ++v) {
        if (done[v] || waits[v] != 0 || program(v) != p || !movable(v)) continue;
        if ((elements += pr.runs[v].gen->numel) > kTableElements) break;
        step.push_back(v);
      }
    }
    for (std::uint32_t v : step) done[v] = true;
    for (std::uint32_t v : step)
      for (std::uint32_t w : next[v]) --waits[w];
    table = table || step.size() > 1;
    steps.push_back(std::move(step));
  }
  if (!table) {
    pr.bound_slots.clear();
    pr.bound_tensors.clear();
    return;
  }
  pr.steps = std::move(steps);
}

// Note [Memory use] (ExecutionPlan.h): a generated run's calls run together, element by element,
// so a slot live in it is live over all of it; a library call runs alone. An Arena slot no
// library call names, no generated run loads or stores (an intermediate its program keeps in a
// register, never stored: Note [Pointwise programs]) and no result stands on gets no memory.
Status CpuBackend::memory_use(void* self, const exec::ExecutionPlan& plan, exec::MemoryUse& use) {
  auto* b = static_cast<CpuBackend*>(self);
  if (b->plan_ != &plan)
    return bad_state("memory_use of a plan this CPU backend did not prepare", "call prepare first");
  use.spans.resize(plan.calls.size());
  for (std::uint32_t c = 0; c < plan.calls.size(); ++c) use.spans[c] = {c, c};
  use.untouched.assign(plan.slots.size(), false);
  for (std::uint32_t s = 0; s < plan.slots.size(); ++s)
    use.untouched[s] = plan.slots[s].kind == exec::SlotKind::Arena;
  auto touch_call = [&](std::uint32_t c) {
    const exec::Call& call = plan.calls[c];
    for (std::uint32_t a = call.in_begin; a < call.out_begin + call.out_count; ++a)
      use.untouched[plan.tensors[plan.args[a].tensor].slot] = false;
  };
  for (const auto& prepared : b->prepared_) {
    if (!prepared) continue;
    for (const Run& r : prepared->runs) {
      if (!r.gen) continue;
      const bool library_too = b->may_run_library_calls(*r.gen);
      for (std::uint32_t c = r.call_begin; c < r.call_begin + r.call_count; ++c) {
        use.spans[c] = {r.call_begin, r.call_begin + r.call_count - 1};
        if (library_too) touch_call(c);  // its calls may run as library calls too
      }
      for (std::uint32_t t : r.gen->operand_tensor) use.untouched[plan.tensors[t].slot] = false;
    }
  }
  std::vector<bool> generated = b->generated_call_mask();  // by code of its own, always or at times
  generated.resize(plan.calls.size(), false);
  use.library_only.assign(plan.calls.size(), false);
  for (std::uint32_t c = 0; c < plan.calls.size(); ++c)
    if (!generated[c]) {
      touch_call(c);
      use.library_only[c] = true;
    }
  for (std::uint32_t t : plan.results) use.untouched[plan.tensors[t].slot] = false;
  return ok_status();
}

// One run's program, compiled or found in the kernel cache; `cache` keeps the coldest source
// among a kernel's runs (compiled over disk over memory).
Result<std::unique_ptr<CpuBackend::GeneratedRun>> CpuBackend::generate(
    const exec::ExecutionPlan& plan, std::uint32_t k, std::uint32_t begin, std::uint32_t count,
    std::span<const std::uint32_t> hoisted, std::string_view* cache) {
  auto lowered = lower_pointwise_calls(plan, k, begin, count, fast_, hoisted);
  if (!lowered.ok()) return lowered.status();
  return generate_lowered(*lowered, cache);
}

Result<std::unique_ptr<CpuBackend::GeneratedRun>> CpuBackend::generate_lowered(const PointwiseKernel& pk,
                                                                               std::string_view* cache) {
  bool any_f64 = false;
  for (const PwOperand& o : pk.program.operands) any_f64 |= o.dtype == dtype::kFloat64;
  const bool reduction = pk.program.reduce != ReduceKind::None;
  if (reduction && !pk.program.insts.empty() && !sum_prologue_ok(pk.program))
    return unsupported(
        "a reduction's prologue holds an instruction the sum's code generator does not "
        "take (Note [Sum prologues])",
        "it runs as a library call");
  const forge::NumericalRecipe* recipe =
      pinned_recipe(any_f64 ? dtype::kFloat64 : dtype::kFloat32, fast_, reduction);
  const CacheStats before = stats_;
  auto fns = get_pointwise(pk.program, forge::recipe_text(*recipe), disk_.get(), &stats_);
  if (!fns.ok()) return fns.status();
  const std::string_view source = stats_.compiled != before.compiled     ? "compiled"
                                  : stats_.disk_hits != before.disk_hits ? "disk"
                                                                         : "memory";
  if (cache->empty() || source == "compiled" || (source == "disk" && *cache == "memory"))
    *cache = source;

  auto p = std::make_unique<Generated>();
  p->fns = std::move(*fns);
  p->operand_tensor = pk.operand_tensor;
  for (const PwOperand& o : pk.program.operands)
    p->elem_bytes.push_back(o.dtype == dtype::kFloat32 ? 4 : 8);  // float64, int64
  p->param_scalar = pk.param_scalar;
  p->fixed_scalars = pk.fixed_scalars;
  p->fixed_from = pk.fixed_from;
  p->param_dtype = pk.program.params;
  p->unit_params = pk.unit_params;
  p->always_scaled = pk.always_scaled;
  p->scaled_unbroadcast = !pk.scaled_broadcast;
  p->numel = 1;
  for (std::int64_t s : pk.shape) p->numel *= s;
  if (reduction) {
    p->reduction = true;
    p->rows = pk.reduce_rows;
    p->numel = pk.reduce_rows * pk.reduce_cols;
    p->params = {static_cast<std::uint64_t>(pk.reduce_cols), 0};
    p->prologue = !pk.program.insts.empty();
    if (p->prologue) p->params.resize(std::max<std::size_t>(2, 1 + pk.param_scalar.size()));
    // params[1 + j] is param_scalar[j]'s value, read each launch
    if (pk.program.reduce == ReduceKind::LayerNorm) p->param_scalar = {pk.eps_scalar};
    const bool batch_norm =
        pk.program.reduce == ReduceKind::BatchNorm || pk.program.reduce == ReduceKind::BatchNormBwd;
    if (batch_norm) {  // Note [Generated batch norm]: eps, momentum, images, channels
      p->params = {static_cast<std::uint64_t>(pk.reduce_cols), 0, 0,
                   static_cast<std::uint64_t>(pk.images),
                   static_cast<std::uint64_t>(pk.reduce_rows)};
      p->numel *= pk.images;
    }
    if (pk.program.reduce == ReduceKind::ArgExtreme) {  // Note [Generated max and argmax]
      p->params = {static_cast<std::uint64_t>(pk.reduce_cols),
                   static_cast<std::uint64_t>(pk.reduce_inner)};
      p->numel *= pk.reduce_inner;
    }
    if (pk.program.reduce == ReduceKind::Variance) {  // Note [Generated var and std]
      p->params = {static_cast<std::uint64_t>(pk.reduce_cols), pk.fixed_param,
                   static_cast<std::uint64_t>(pk.reduce_inner)};
      p->numel *= pk.reduce_inner;
      p->dof_check = true;
      p->int_correction = pk.program.int_param;
    }
    p->tail_flag = pk.program.reduce == ReduceKind::SoftmaxBwd;
    p->may_refuse = pk.program.reduce == ReduceKind::NllLoss || pk.program.reduce == ReduceKind::NllLossBwd;
    if (p->may_refuse) p->params.push_back(0);
    const std::int64_t cols = pk.reduce_cols;
    switch (pk.program.reduce) {  // Note [Split rows]
      case ReduceKind::SumInner:
      case ReduceKind::ExtremeInner:
        p->row_elems = {cols, 1};
        if (p->prologue) {  // Note [Sum prologues]: the loads, then the output
          p->row_elems.clear();
          for (std::size_t o = 0; o + 1 < pk.program.operands.size(); ++o)
            p->row_elems.push_back(pk.program.operands[o].broadcast ? 0 : cols);
          p->row_elems.push_back(1);
        }
        break;
      case ReduceKind::Softmax:
      case ReduceKind::LogSoftmax: p->row_elems = {cols, cols}; break;
      case ReduceKind::SoftmaxBwd:
      case ReduceKind::LogSoftmaxBwd: p->row_elems = {cols, cols, cols}; break;
      case ReduceKind::LayerNorm:
        p->row_elems = pk.program.affine ? std::vector<std::int64_t>{cols, 0, 0, cols, 1, 1}
                                         : std::vector<std::int64_t>{cols, cols, 1, 1};
        break;
      case ReduceKind::LayerNormBwd: {  // Note [Generated layer norm backward]
        // grad_out, input, mean, rstd, [weight], [grad_input], [grad_weight], [grad_bias]
        p->row_elems = {cols, cols, 1, 1};
        if (pk.program.affine) p->row_elems.push_back(0);
        if ((pk.program.outputs & 1) != 0) p->row_elems.push_back(cols);
        for (unsigned bit : {2u, 4u})
          if ((pk.program.outputs & bit) != 0) {
            p->row_elems.push_back(0);
            ++p->layer_norm_buffers;
          }
        p->params = {static_cast<std::uint64_t>(cols), 0, 0};
        break;
      }
      case ReduceKind::BatchNorm:
      case ReduceKind::BatchNormBwd: {  // rows are channels: a plane of each image, or one element
        // the tensors of the input's size: input and Y; grad_out, input and grad_input
        const std::size_t nops = pk.operand_tensor.size();
        const std::size_t first_out =
            nops - static_cast<std::size_t>(std::popcount(pk.program.outputs));
        p->row_elems.assign(nops, 1);
        for (std::size_t o = 0; o < nops; ++o) {
          const bool full = pk.program.reduce == ReduceKind::BatchNorm
                                ? o == 0 || o == nops - 3
                                : o <= 1 || (o == first_out && (pk.program.outputs & 1) != 0);
          if (full) p->row_elems[o] = cols;
        }
        break;
      }
      case ReduceKind::ArgExtreme:
      case ReduceKind::Variance: {  // rows: a slab of the input, `inner` results each
        const std::int64_t inner = pk.reduce_inner;
        p->row_elems.assign(pk.operand_tensor.size(), inner);
        p->row_elems[0] = cols * inner;
        break;
      }
      default: break;
    }
    p->base.resize(pk.operand_tensor.size());
    auto r = std::make_unique<GeneratedRun>();
    r->code = std::move(p);
    r->recipe = recipe;
    return r;
  }

  // Dims of size > 1, then each operand dense in row-major order (or broadcast)?
  std::vector<std::size_t> dims;
  for (std::size_t d = 0; d < pk.shape.size(); ++d)
    if (pk.shape[d] > 1) dims.push_back(d);
  const std::size_t nops = pk.operand_tensor.size();
  p->advance.resize(nops);
  for (std::size_t o = 0; o < nops; ++o) p->advance[o] = pk.program.operands[o].broadcast ? 0 : 1;
  p->contig = true;
  for (std::size_t o = 0; o < nops && p->contig; ++o) {
    if (pk.program.operands[o].broadcast) continue;
    std::int64_t expect = 1;
    for (std::size_t i = dims.size(); i-- > 0;) {
      if (pk.strides[o][dims[i]] != expect) p->contig = false;
      expect *= pk.shape[dims[i]];
    }
  }
  if (!p->contig) {
    // Merge dim i into i+1 when every operand steps over i as over the whole of i+1.
    std::vector<std::int64_t> sizes;
    std::vector<std::vector<std::int64_t>> st(nops);
    for (std::size_t d : dims) {
      bool merge = !sizes.empty();
      for (std::size_t o = 0; o < nops && merge; ++o)
        merge = st[o].back() == pk.strides[o][d] * pk.shape[d];
      if (merge) {
        sizes.back() *= pk.shape[d];
        for (std::size_t o = 0; o < nops; ++o) st[o].back() = pk.strides[o][d];
      } else {
        sizes.push_back(pk.shape[d]);
        for (std::size_t o = 0; o < nops; ++o) st[o].push_back(pk.strides[o][d]);
      }
    }
    p->sizes = sizes;
    for (std::size_t o = 0; o < nops; ++o)
      p->strides.insert(p->strides.end(), st[o].begin(), st[o].end());
  }
  p->base.resize(nops);
  p->ptrs.resize(nops);
  p->inner.resize(nops);
  p->index.resize(p->sizes.size());
  p->params.resize(p->param_scalar.size());
  auto r = std::make_unique<GeneratedRun>();
  r->code = std::move(p);
  r->recipe = recipe;
  return r;
}

AlphaRounding aten_alpha_rounding() {
  const CpuTarget& host = host_target();
  if (host.triple.rfind("x86_64", 0) != 0) return AlphaRounding::Unknown;
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  if (cap != nullptr && std::string_view(cap) == "default") return AlphaRounding::Twice;
  return runs_on("+avx2,+fma", host) ? AlphaRounding::Once : AlphaRounding::Twice;
}

std::uint64_t CpuBackend::scratch_bytes() const {
  std::uint64_t bytes = 0;
  for (const auto& prepared : prepared_) {
    if (!prepared) continue;
    for (const Run& r : prepared->runs)
      if (r.gen) bytes += r.gen->part_buffers.capacity();
  }
  return bytes;
}

std::vector<bool> CpuBackend::generated_call_mask() const {
  std::vector<bool> mask;
  for (const auto& prepared : prepared_) {
    if (!prepared) continue;
    for (const Run& r : prepared->runs) {
      if (!r.gen) continue;
      for (std::uint32_t c = r.call_begin; c < r.call_begin + r.call_count; ++c) {
        if (c >= mask.size()) mask.resize(c + 1, false);
        mask[c] = std::ranges::find(r.hoisted, c) == r.hoisted.end();
      }
    }
  }
  return mask;
}

Status CpuBackend::run_kernel(void* self, const exec::KernelLaunch& launch) {
  auto* b = static_cast<CpuBackend*>(self);
  if (launch.plan != b->plan_)
    return bad_state("the CPU backend was prepared for another plan", "one CpuBackend per Runner");
  Prepared& pr = *b->prepared_[launch.kernel];
  if (!pr.steps.empty()) {  // Note [Launch tables]
    if (b->bound_memory_apart(pr, launch)) {
      for (const std::vector<std::uint32_t>& step : pr.steps)
        CRUCIBLE_RETURN_IF_ERROR(step.size() > 1 ? b->launch_table(pr, step, launch)
                                                 : b->launch_run(pr.runs[step[0]], launch));
      return ok_status();
    }
    ++b->call_order_launches_;
  }
  for (Run& r : pr.runs) CRUCIBLE_RETURN_IF_ERROR(b->launch_run(r, launch));
  return ok_status();
}

Status CpuBackend::launch_run(Run& r, const exec::KernelLaunch& launch) {
  if (r.gen && launch_generated(*r.gen, launch)) return ok_status();
  for (std::uint32_t c = r.call_begin; c < r.call_begin + r.call_count; ++c)
    if (std::ranges::find(r.hoisted, c) == r.hoisted.end())
      CRUCIBLE_RETURN_IF_ERROR(launch.library_call(launch.runner, c));
  return ok_status();
}

// Note [Launch tables]: whether the Input and Output slots a reordered kernel touches are
// memory apart in this launch (each slot from its start over its bytes).
bool CpuBackend::bound_memory_apart(Prepared& pr, const exec::KernelLaunch& launch) {
  const exec::ExecutionPlan& plan = *launch.plan;
  const std::size_t m = pr.bound_slots.size();
  pr.bound_now.resize(m);
  for (std::size_t i = 0; i < m; ++i) {
    const exec::TensorRef& t = plan.tensors[pr.bound_tensors[i]];
    pr.bound_now[i] = static_cast<const char*>(launch.tensor_data[pr.bound_tensors[i]]) -
                      t.offset * static_cast<std::int64_t>(*element_size(t.dtype));
  }
  if (pr.bound_now == pr.bound_seen) return true;
  pr.ranges.clear();
  for (std::size_t i = 0; i < m; ++i)
    pr.ranges.emplace_back(pr.bound_now[i], pr.bound_now[i] + plan.slots[pr.bound_slots[i]].bytes);
  std::ranges::sort(pr.ranges);
  const char* end = nullptr;  // the furthest end of the non-empty ranges so far
  for (const auto& [first, last] : pr.ranges) {
    if (last == first) continue;
    if (end != nullptr && end > first) return false;
    if (end == nullptr || last > end) end = last;
  }
  pr.bound_seen = pr.bound_now;
  return true;
}

// Note [Split loops]: a contiguous generated loop of many elements runs in parts on the shared
// worker pool, each part a range of whole 64-element blocks (every operand that is not
// broadcast advanced to the part's first element). Each element is computed by the same code as
// in one loop, so the bits are the same; below kSplitElements (ATen's grain for its pointwise
// kernels, 32768, twice) waking a worker costs more than it saves. A strided loop of two lines
// or more splits the same way, in parts of whole lines (a line: one index of the outer dims, the
// innermost dim); on the backend's own pool a split at that size can lose to one thread (a
// 256x256 transposed chain: 0.49-0.86x on a 2-vCPU VM), on ATen's threads it gains (231 -> 134 us).
// Under PyTorch the parts run on ATen's own threads (CpuBackendOptions::parallel): a pool of
// our own beside OpenMP's spinning workers gained nothing from a second thread (AdamW's update
// over 4.2 M values: 2.7 ms whole or split; 1.4 ms split on ATen's threads).
constexpr std::int64_t kSplitElements = 65536;

// Note [Split rows]: a reduction whose rows are independent (row sums, layer norm, softmax)
// runs in parts of whole rows, like a split loop (Note [Split loops]): each row is computed by
// the same code whichever part it falls in, so the bits are one thread's. Column sums run whole.
void CpuBackend::run_rows(Generated& g) {
  const unsigned threads = split_threads();
  if (threads < 2 || g.numel < kSplitElements || g.row_elems.empty() || g.rows < 2) {
    g.fns->contig(g.base.data(), g.rows, g.params.data());
    return;
  }
  const auto parts = static_cast<unsigned>(std::min<std::int64_t>(threads, g.rows));
  auto part = [&](unsigned i) {
    const std::int64_t begin = g.rows * i / parts, end = g.rows * (i + 1) / parts;
    if (end <= begin) return;
    std::vector<char*> ptrs(g.base.size());
    for (std::size_t o = 0; o < ptrs.size(); ++o) ptrs[o] = g.base[o] + begin * g.row_elems[o] * g.elem_bytes[o];
    g.fns->contig(ptrs.data(), end - begin, g.params.data());
  };
  run_parts(parts, part);
}

// Note [Generated layer norm backward]: grad_weight and grad_bias in ATen's parts: its
// parallel_for(0, M, grain 1) runs inline (one part) for one row or one thread at the call, else
// in parts of ceil(M / min(T, M)) rows, each summed from +0 into a buffer of its own; the parts
// are then folded in order. The parts run on threads as split rows do (Note [Split rows]).
void CpuBackend::run_layer_norm_backward(Generated& g) {
  const std::int64_t rows = g.rows, cols = static_cast<std::int64_t>(g.params[0]);
  const unsigned aten_threads = current_threads_ != nullptr ? current_threads_() : threads_;
  std::int64_t chunk = rows;
  if (rows > 1 && aten_threads > 1) {
    const std::int64_t nt = std::min<std::int64_t>(aten_threads, rows);
    chunk = (rows + nt - 1) / nt;
  }
  const std::int64_t parts = (rows + chunk - 1) / chunk;
  const std::size_t nops = g.base.size(), buffers = g.layer_norm_buffers;
  const auto buffer_bytes = static_cast<std::size_t>(cols * g.elem_bytes[0]);
  const std::size_t need = buffers * static_cast<std::size_t>(parts) * buffer_bytes;
  if (need > g.part_buffers.capacity()) g.part_buffers.reserve(need);  // no more than needed
  g.part_buffers.resize(need);
  auto buffer = [&](std::size_t b, std::int64_t t) {
    return g.part_buffers.data() +
           (b * static_cast<std::size_t>(parts) + static_cast<std::size_t>(t)) * buffer_bytes;
  };
  auto part = [&](unsigned t) {
    const std::int64_t begin = chunk * t, end = std::min(rows, begin + chunk);
    std::vector<char*> ptrs(nops + buffers);
    for (std::size_t o = 0; o < nops; ++o)
      ptrs[o] = g.base[o] + begin * g.row_elems[o] * g.elem_bytes[o];
    for (std::size_t b = 0; b < buffers; ++b) ptrs[nops + b] = buffer(b, t);
    std::array<std::uint64_t, 3> params{static_cast<std::uint64_t>(cols), 0, 0};
    g.fns->contig(ptrs.data(), end - begin, params.data());
  };
  const unsigned threads = split_threads();
  if (threads >= 2 && parts >= 2 && g.numel >= kSplitElements) {
    // as many tasks as threads (a pool runs at most that many), each taking every tasks-th part
    const auto tasks = static_cast<unsigned>(std::min<std::int64_t>(threads, parts));
    run_parts(tasks, [&](unsigned i) {
      for (std::int64_t t = i; t < parts; t += tasks) part(static_cast<unsigned>(t));
    });
  } else {
    for (std::int64_t t = 0; t < parts; ++t) part(static_cast<unsigned>(t));
  }
  std::vector<char*> ptrs(g.base);
  for (std::size_t b = 0; b < buffers; ++b) ptrs.push_back(buffer(b, 0));
  std::array<std::uint64_t, 3> fold{static_cast<std::uint64_t>(cols), 1,
                                    static_cast<std::uint64_t>(parts)};
  g.fns->contig(ptrs.data(), 0, fold.data());
}

void CpuBackend::run_contig(Generated& g, ContigFn fn) {
  const unsigned threads = split_threads();
  if (threads < 2 || g.numel < kSplitElements) {
    fn(g.base.data(), g.numel, g.params.data());
    return;
  }
  const std::int64_t blocks = (g.numel + 63) / 64;
  const auto parts = static_cast<unsigned>(std::min<std::int64_t>(threads, blocks));
  auto part = [&](unsigned i) {
    const std::int64_t begin = std::min(g.numel, blocks * i / parts * 64);
    const std::int64_t end = std::min(g.numel, blocks * (i + 1) / parts * 64);
    if (end <= begin) return;
    std::vector<char*> ptrs(g.base.size());
    for (std::size_t o = 0; o < ptrs.size(); ++o)
      ptrs[o] = g.base[o] + (g.advance[o] ? begin * g.elem_bytes[o] : 0);
    fn(ptrs.data(), end - begin, g.params.data());
  };
  run_parts(parts, part);
}

// Note [Launch tables]: the runs of `step` (one contiguous program), each as launch_generated
// would run it alone, as one table.
Status CpuBackend::launch_table(Prepared& pr, std::span<const std::uint32_t> step,
                                const exec::KernelLaunch& launch) {
  table_.clear();
  std::int64_t blocks = 0, total = 0;
  for (std::uint32_t i : step) {
    Run& r = pr.runs[i];
    Generated& g = *r.gen;
    if (g.numel == 0) continue;
    for (std::size_t o = 0; o < g.base.size(); ++o)
      g.base[o] = static_cast<char*>(launch.tensor_data[g.operand_tensor[o]]);
    ContigFn fn = nullptr;
    if (!pointwise_launch(g, launch, &fn)) {
      for (std::uint32_t c = r.call_begin; c < r.call_begin + r.call_count; ++c)
        if (std::ranges::find(r.hoisted, c) == r.hoisted.end())
          CRUCIBLE_RETURN_IF_ERROR(launch.library_call(launch.runner, c));
      continue;
    }
    table_.push_back(TableRow{fn, &g, blocks});
    blocks += (g.numel + 63) / 64;
    total += g.numel;
  }
  const unsigned threads = split_threads();
  if (threads < 2 || total < kSplitElements) {
    for (const TableRow& t : table_) t.fn(t.g->base.data(), t.g->numel, t.g->params.data());
    return ok_status();
  }
  const auto parts = static_cast<unsigned>(std::min<std::int64_t>(threads, blocks));
  run_parts(parts, [&](unsigned i) {
    const std::int64_t b0 = blocks * i / parts, b1 = blocks * (i + 1) / parts;
    auto row =
        std::upper_bound(table_.begin(), table_.end(), b0,
                         [](std::int64_t b, const TableRow& t) { return b < t.first_block; });
    std::vector<char*> ptrs;
    for (--row; row != table_.end() && row->first_block < b1; ++row) {
      const Generated& g = *row->g;
      const std::int64_t begin = (std::max(b0, row->first_block) - row->first_block) * 64;
      const std::int64_t end = std::min(g.numel, (b1 - row->first_block) * 64);
      if (end <= begin) continue;
      ptrs.resize(g.base.size());
      for (std::size_t o = 0; o < ptrs.size(); ++o)
        ptrs[o] = g.base[o] + (g.advance[o] ? begin * g.elem_bytes[o] : 0);
      row->fn(ptrs.data(), end - begin, g.params.data());
    }
  });
  return ok_status();
}

// The threads a split loop or split rows may use, and running their parts on them: on the
// host's threads, as many as the host's own kernel would use at this launch (its count may
// have changed since the backend was made; 1 inside its parallel region); on the pool, the
// backend's own count.
unsigned CpuBackend::split_threads() const {
  if (parallel_ != nullptr) return current_threads_ != nullptr ? std::max(1u, current_threads_()) : threads_;
  return pool_ != nullptr ? std::min(threads_, pool_->threads()) : 1;
}

void CpuBackend::run_parts(unsigned parts, const std::function<void(unsigned)>& part) {
  if (parallel_ != nullptr) {
    parallel_(parallel_ctx_, parts,
              [](void* arg, unsigned i) { (*static_cast<const std::function<void(unsigned)>*>(arg))(i); },
              const_cast<std::function<void(unsigned)>*>(&part));
    return;
  }
  pool_->run(parts, part);
}

// Whether launch_generated may return false for `g` (its parameters are patchable, so whether
// an alpha is 1 is not known before a run).
bool CpuBackend::may_run_library_calls(const Generated& g) const {
  if (g.may_refuse || g.dof_check || !g.fixed_from.empty()) return true;
  if (g.prologue) return !g.unit_params.empty();  // Note [Sum prologues]: an alpha not 1 or -1
  if (fast_ || alpha_rounding_ == AlphaRounding::Twice) return false;
  if (!g.always_scaled && g.unit_params.empty()) return false;
  return !(alpha_rounding_ == AlphaRounding::Once && g.contig && g.scaled_unbroadcast);
}

// Runs `g` over this launch's memory; false when its alpha needs the library calls instead
// (Note [ATen's alpha rounding]), or a scalar a parameter was fixed from was patched.
bool CpuBackend::launch_generated(Generated& g, const exec::KernelLaunch& launch) {
  Generated* p = &g;
  if (p->numel == 0) return true;
  const std::size_t nops = p->base.size();
  for (std::size_t o = 0; o < nops; ++o)
    p->base[o] = static_cast<char*>(launch.tensor_data[p->operand_tensor[o]]);
  if (p->reduction) {  // Note [Generated sums], Note [Generated layer norm], Note [Split rows]
    if (p->prologue) {  // Note [Sum prologues]: a pointwise program's parameters, after cols
      bool ok = program_params(*p, launch, p->params.data() + 1);
      for (std::uint32_t j : p->unit_params)  // an alpha of 1 or -1 rounds as ATen's a ± b
        ok = ok && is_unit(p->params[1 + j], p->param_dtype[j]);
      if (!ok) {
        ++library_launches_;
        return false;
      }
    } else {
      for (std::size_t j = 0; j < p->param_scalar.size(); ++j)  // eps, ignore_index, momentum
        p->params[1 + j] = launch.scalars[p->param_scalar[j]].bits;
    }
    if (p->tail_flag) {  // ATen's loop over rows runs inline for one row or on one thread
      const unsigned now = current_threads_ != nullptr ? current_threads_() : threads_;
      p->params[1] = p->rows == 1 || now <= 1 ? 1 : 0;
    }
    if (p->dof_check) {  // ATen warns when the reduced count minus the correction is <= 0
      const double correction = p->int_correction
                                    ? static_cast<double>(static_cast<std::int64_t>(p->params[1]))
                                    : std::bit_cast<double>(p->params[1]);
      if (static_cast<double>(static_cast<std::int64_t>(p->params[0])) - correction <= 0) {
        ++library_launches_;
        return false;
      }
    }
    if (p->layer_norm_buffers != 0) {
      run_layer_norm_backward(*p);
      return true;
    }
    run_rows(*p);
    if (p->may_refuse && p->params[2] != 0) {  // Note [Generated nll_loss]: ATen's call says why
      p->params[2] = 0;
      ++library_launches_;
      return false;
    }
    return true;
  }
  ContigFn fn = nullptr;
  if (!pointwise_launch(*p, launch, &fn)) return false;
  if (p->contig) {
    run_contig(*p, fn);
    return true;
  }
  const std::size_t nd = p->sizes.size();  // >= 1: a single element is contiguous
  for (std::size_t o = 0; o < nops; ++o) p->inner[o] = p->strides[o * nd + nd - 1];
  const std::int64_t n = p->sizes[nd - 1];
  const std::int64_t lines = n > 0 ? p->numel / n : 0;  // a call per index of the outer dims
  const unsigned threads = split_threads();
  if (threads < 2 || p->numel < kSplitElements || lines < 2) {
    run_lines(*p, 0, lines, p->index, p->ptrs);
    return true;
  }
  // Note [Split loops]: in parts of whole lines
  const auto parts = static_cast<unsigned>(std::min<std::int64_t>(threads, lines));
  run_parts(parts, [&](unsigned i) {
    std::vector<std::int64_t> index(nd);
    std::vector<char*> ptrs(nops);
    run_lines(*p, lines * i / parts, lines * (i + 1) / parts, index, ptrs);
  });
  return true;
}

// A pointwise run's parameters for this launch, and its contiguous loop (contiguous runs); false
// when its calls must run as library calls instead: an alpha that is not 1 (Note [ATen's alpha
// rounding]) or a scalar a parameter was fixed from that was patched.
bool CpuBackend::pointwise_launch(Generated& g, const exec::KernelLaunch& launch, ContigFn* fn) {
  if (!program_params(g, launch, g.params.data())) {
    ++library_launches_;
    return false;
  }
  bool unit = !g.always_scaled && !fast_;
  for (std::uint32_t j : g.unit_params) unit = unit && is_unit(g.params[j], g.param_dtype[j]);
  if (fast_ && g.contig) {  // Note [Fast numerics]
    *fn = g.fns->contig_fused != nullptr ? g.fns->contig_fused : g.fns->contig;
    return true;
  }
  if (!unit && !fast_ && alpha_rounding_ != AlphaRounding::Twice) {  // Note [ATen's alpha rounding]
    if (alpha_rounding_ == AlphaRounding::Once && g.contig && g.scaled_unbroadcast) {
      *fn = g.fns->contig_fused;
      return true;
    }
    ++library_launches_;
    return false;
  }
  if (g.contig) *fn = g.fns->contig;
  return true;
}

// A pointwise program's parameters for this launch into out[0 .. param_scalar.size()), or false
// when a scalar a value was fixed from at lowering was patched to another value.
bool CpuBackend::program_params(const Generated& g, const exec::KernelLaunch& launch,
                                std::uint64_t* out) {
  for (const auto& [scalar, bits] : g.fixed_from)
    if (launch.scalars[scalar].bits != bits) return false;
  for (std::size_t j = 0; j < g.param_scalar.size(); ++j)
    out[j] = param_bits((g.param_scalar[j] & PointwiseKernel::kFixedScalar) != 0
                            ? g.fixed_scalars[g.param_scalar[j] & ~PointwiseKernel::kFixedScalar]
                            : launch.scalars[g.param_scalar[j]],
                        g.param_dtype[j]);
  return true;
}

// Lines [begin, end) of a strided loop (row-major over the outer dims), each one call of its
// strided function over the innermost dim; `index` and `ptrs` are the caller's scratch.
void CpuBackend::run_lines(const Generated& g, std::int64_t begin, std::int64_t end,
                           std::vector<std::int64_t>& index, std::vector<char*>& ptrs) {
  if (end <= begin) return;
  const std::size_t nd = g.sizes.size(), nops = g.base.size();
  std::int64_t rest = begin;
  for (std::size_t d = nd - 1; d-- > 0;) {
    index[d] = rest % g.sizes[d];
    rest /= g.sizes[d];
  }
  for (std::int64_t line = begin; line < end; ++line) {
    for (std::size_t o = 0; o < nops; ++o) {
      std::int64_t off = 0;
      for (std::size_t d = 0; d + 1 < nd; ++d) off += index[d] * g.strides[o * nd + d];
      ptrs[o] = g.base[o] + off * g.elem_bytes[o];
    }
    g.fns->strided(ptrs.data(), g.inner.data(), g.sizes[nd - 1], g.params.data());
    for (std::size_t d = nd - 1; d-- > 0;) {
      if (++index[d] < g.sizes[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace crucible::mimic
