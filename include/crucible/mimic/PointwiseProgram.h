// PointwiseProgram.h — a plan kernel's chain of elementwise calls as one per-element program:
// what the CPU code generator compiles, and how it binds to the plan's tensors and scalars.
//
// Note [Pointwise programs]: every call of the kernel writes a tensor of one iteration shape
// (the first call's output shape); each input broadcasts to it (right-aligned, size-1 dims).
// The program is SSA over one element: loads of memory operands (float32, float64, or a Python
// int as a wrapped int64 number, converted to the compute dtype in one rounding as ATen does),
// runtime parameters (a call's scalar arguments, patchable), arithmetic in the call's compute dtype
// (ATen's type promotion: dimensioned tensors first, then 0-d tensors, then Python numbers; inputs
// converted to it, the result converted to the output's dtype), and stores. A value an earlier call
// of the kernel wrote is read from its register, not from memory. An output no call outside the
// kernel touches (an Arena slot, not a result) is not stored at all.
//
// Operands are memory locations keyed by (slot, element offset, strides in iteration space);
// distinct slots are distinct memory. A slot the kernel writes is touched through one key
// only: an elementwise loop that wrote through one view and read another of the same memory
// would read elements in another order than the calls did, so such a kernel is refused.
//
// Semantics (BITEXACT_STRICT: ATen's bits, checked against ATen by aten_conformance_test): each
// operation is one IEEE-754 operation rounded to nearest in its dtype, in call order, with no
// contraction (a*b+c is two roundings) and no reassociation. relu(x) = x < 0 ? +0 : x (NaN and
// -0 pass through, as ATen's clamp_min(x, 0)); abs clears and neg flips the sign bit;
// threshold_backward(grad, self, t) is self <= t ? +0 : grad (a NaN self passes grad), as ATen's
// threshold kernel blends.
// add/sub with alpha are AddScaled/SubScaled, `a + alpha*b` (sub: alpha negated), which ATen
// rounds once or twice depending on its kernels and on broadcasting (Note [ATen's alpha
// rounding], CpuBackend.cpp). A program with them has a third loop: P_contig and P_strided round
// twice (a + (alpha*b)), P_contig_fused once (fma); the backend picks the one that gives ATen's
// bits, or runs the calls as library calls. Where alpha*b is exact for every b (alpha 1 or -1)
// both roundings agree. The alpha parameters are listed (`unit_params`).
// addcmul(self, t1, t2, value) is AddScaled(self, t2, value*t1): ATen rounds value*t1, then
// self + that*t2 as it rounds an alpha. addcdiv is self + (value*t1)/t2, three roundings in
// every ATen kernel. lerp.Scalar is Lerp, whose product ATen rounds into the sum as an alpha
// (its vectorized loop uses fmadd on the weight or the weight minus 1; its scalar loop's
// `end - (end-self)*(1-w)` is the same value rounded twice). Neither addcmul nor lerp has a
// parameter that makes the roundings agree (`always_scaled`).
// clone and copy_ are the source element converted to the output's dtype (one rounding, or
// none); zero_, zeros_like and ones_like are the constant, the input's elements not read.
// mse_loss_backward(grad_output, self, target, reduction) is (norm * (self - target)) *
// grad_output, as ATen's mse_backward_cpu_kernel, with norm = 2/numel(self) for a mean (the
// double quotient, rounded once to float32 as ATen's Scalar::to) and 2 for none or sum: a parameter
// fixed at lowering (`fixed_scalars`), not a plan scalar, so the program holds no size (a launch
// whose reduction was patched to another value runs ATen's call). Its three tensors must have
// one dtype (ATen also takes a float64 target or grad beside float32: left to it).
// sqrt is not bit-exact: ATen's is not IEEE sqrt (one ulp away on about 0.7 % of random float32
// and float64 inputs, in its vectorized and its default kernels alike: MKL's vector math), so
// only numerics="fast" generates it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "crucible/core/ContentHash.h"
#include "crucible/core/Status.h"
#include "crucible/exec/ExecutionPlan.h"

namespace crucible::mimic {

enum class PwOp : std::uint8_t {
  Load = 0,     // a = operand
  Param = 1,    // a = parameter
  Convert = 2,  // a = instruction; to `dtype` (from float32, float64 or int64)
  Add = 3,
  Sub = 4,
  Mul = 5,
  Div = 6,  // a, b = instructions
  Neg = 7,
  Abs = 8,
  Relu = 9,           // a = instruction
  Store = 10,         // a = instruction, b = operand
  AddScaled = 11,     // a + c*b: a, b, c = instructions (c: alpha), rounded as the loop says
  SubScaled = 12,     // a - c*b, as a + (-c)*b
  ThresholdBwd = 13,  // a <= c ? +0 : b (threshold_backward: a = self, b = grad, c = threshold)
  Lerp = 14,   // lerp(a, b, c): |c| < 0.5 ? a + c*(b-a) : b + (c-1)*(b-a), rounded as the loop says
  Sqrt = 15,   // IEEE sqrt (numerics="fast" only: not ATen's bits)
  Const = 16,  // the number `a` (a small non-negative integer: zero_, zeros_like, ones_like)
  Sign = 17,   // a > 0 ? 1 : a < 0 ? -1 : +0 (sign and sgn of a real tensor; NaN and -0 give +0)
  kCount = 18,
};
const char* pw_op_name(PwOp op) noexcept;

struct PwInst {
  PwOp op = PwOp::Load;
  std::int8_t dtype = -1;  // of the result (Store: of the operand)
  std::uint16_t a = 0, b = 0, c = 0;
};

struct PwOperand {
  std::int8_t dtype = -1;
  bool broadcast = false;  // every stride 0 in iteration space: one element for all
  bool read = false, write = false;
};

// Note [Generated sums]: sum.dim_IntList, sum, mean.dim and mean over a dense float32/float64
// tensor whose reduced dims (those of size > 1) are all its innermost ones (Inner: rows of C
// elements, one result per row; a full reduction is one row) or all its outermost ones (Outer: N
// rows of C columns, one result per column) are one program with no instructions: operand 0 the
// input, operand 1 the output, and the order of ATen's cascade_sum (misc/ATEN_ORDER.md section 2:
// its AVX2 kernel's 32-byte vectors even on AVX-512 hosts, a 4-level cascade, four interleaved
// accumulators, the tail and lanes added in ATen's order; a mean divides the sum by the reduced
// element count), so the result is ATen's bits. ATen splits a full reduction of more than 32768
// elements over its threads, which changes the order: such a sum is not generated; nor a float32
// outer sum of 32768 elements or more with C > 32 and C % 32 in [4, 8), whose last columns
// ATen's split over threads can leave to its scalar path (another order). The order is
// that of ATen's x86-64 kernels (its NEON ones use 16-byte vectors): the CPU backend generates
// sums on x86-64 hosts only.
enum class ReduceKind : std::uint8_t {
  None = 0,
  SumInner = 1,
  SumOuter = 2,
  LayerNorm = 3,
  Softmax = 4,  // Note [Generated softmax]
  LogSoftmax = 5,
  SoftmaxBwd = 6,  // _softmax_backward_data
  LogSoftmaxBwd = 7,
  NllLoss = 8,  // Note [Generated nll_loss]
  NllLossBwd = 9,
  BatchNorm = 10,  // Note [Generated batch norm]
  BatchNormBwd = 11,
  ArgExtreme = 12,    // Note [Generated max and argmax]
  Variance = 13,      // Note [Generated var and std]
  ExtremeInner = 14,  // Note [Generated amax and amin]: rows
  ExtremeOuter = 15,  // columns
  LayerNormBwd = 16,  // Note [Generated layer norm backward]
};

// Note [Generated layer norm backward]: native_layer_norm_backward over dense float32/float64
// tensors, M rows of N normalized elements; operands grad_out, input, mean, rstd, [weight], then
// the requested results in order (`outputs`: bit i result i). ATen's order (misc/ATEN_ORDER.md
// section 11): per row, ds = sum(dy*x[*g]) and db = sum(dy[*g]) over W lanes (W = 8 float32, 4
// float64; the first vector as is, the other full vectors added unfused, the N % W tail fused
// into an fma, float32's lanes by the butterfly tree, float64's in order; under W elements one
// sum from element 0), then t1 = fma(db, m, -ds), b = ((t1 a) a) a / N and q = (db a) / N
// rounded left to right (1/N rounded first), c = fma(-b, m, -q), dx = fma(b, x, a dy [g]) + c:
// the same on any thread count. grad_weight and grad_bias are sums over rows that ATen gathers
// in per-thread buffers: rows split as its parallel_for(0, M, grain 1) splits them for the
// thread count at the call (one part inline for M = 1 or one thread; else ceil(M / min(T, M))
// rows a part), each part from +0 in row order (dgamma += fma(dy, fma(a, x, -a m), dgamma),
// dbeta += dy), then the parts added in order onto +0. The kernel runs either mode (params[1]):
// 0, rows with part buffers (operands after the results); 1, the parts folded (params[2]: how
// many) into the results.

// Note [Generated amax and amin]: amax and amin over a dense float32/float64 input whose reduced
// dims (those of size > 1) are all innermost (ExtremeInner: reduce_rows rows of reduce_cols
// elements) or all outermost (ExtremeOuter: reduce_rows rows folded into reduce_cols columns);
// operands input, result; `smallest` for amin. A max has no rounding: its bits are which of +0
// and -0 a tie returns and which NaN comes out, and both follow ATen's order (misc/ATEN_ORDER.md
// section 10): S(a, b) = NaN in either ? the default qNaN : (a < b ? b : a) (ATen's max_impl:
// a tie keeps a), V(a, b) = per lane a > b ? a : b, a NaN lane all ones (AVX2's maximum: a tie
// takes b); amin mirrors both. Rows: under 4W elements (W = 8 float32, 4 float64 lanes) S from
// -inf over the row; else four accumulators over the whole 4W groups, V(V(a0, a1), V(a2, a3)), S
// across its lanes from lane 0, S(-inf, that), then S over the tail. Columns: the whole 4W groups
// of columns fold the rows with V and end with V(acc, -inf) (a NaN lane all ones even over one
// row); the other columns S from -inf over the rows. The order is the same on any thread count
// except for one result over more than 32768 elements (ATen reduces it in per-thread parts):
// not generated; nor reduced dims that are neither all innermost nor all outermost, nor a call
// that reduces no dim of size above 1 (ATen's S from -inf turns a NaN into the default qNaN).

// Note [Generated var and std]: var, std, var_mean and std_mean (the .correction overloads)
// over a dense float32/float64 input whose reduced dims (those of size > 1) are one block of
// adjacent dims are one program each: operands input, var or std, [mean]; rows are the kept
// dims before the block, each of `reduce_cols` elements along it and `reduce_inner` after it.
// Per result, ATen's Welford loop (misc/ATEN_ORDER.md section 9) in double, one serial pass
// in memory order: n += 1, delta = x - mean, mean += delta / n, m2 += delta * (x - mean), each
// product rounded (ATen's compiled loop has no fma there); then var = m2 / (n > correction ?
// n - correction : 0), std its square root in double, each rounded once to the dtype, and the
// mean Welford's (not torch.mean's). The correction is parameter 1, read each launch; a launch
// whose reduced count minus the correction is <= 0 runs ATen's call (for its warning). A var or
// std whose result is one element takes ATen's other path (`two_pass`): the mean as torch.mean
// computes it (the sum of Note [Generated sums] over the count, in the dtype), then the squares
// of (double(x) - mean) added in memory order in double (no fma), divided as above. ATen splits
// that second pass over its threads past 32768 elements: such a var or std is not generated;
// nor a var_mean of one result over more than 32768 elements, whose Welford states ATen splits
// over its threads and merges with fmas (whatever the thread count, which may change between
// launches); nor an input not dense in row-major order.

// Note [Generated max and argmax]: max.dim, min.dim, argmax and argmin over a dense
// float32/float64 input are one program each: operands input, [values,] indices (int64); rows
// are the dims before the reduced one, each of `reduce_cols` elements along it and
// `reduce_inner` after it. Per result, ATen's sequential compare: the first element, then each
// next one taken when !(x <= best) (min: !(x >= best)), stopping at the first NaN. So the index
// is the smallest among equal extremes (-0 and +0 are equal), a NaN's when there is one, and the
// value is the element at that index, bit for bit. argmax's order-free combine (greater value,
// else smaller index, NaN first) picks the same index. argmax without a dim reduces the whole
// tensor as one row.

// Note [Generated nll_loss]: nll_loss_forward and nll_loss_backward over a dense float32/float64
// (N, C) input and an int64 target, no class weight, reduction mean or sum, are one program
// each. Forward: operands input, target, output, total_weight; ATen's nll_loss_out_frame
// (misc/ATEN_ORDER.md section 8): an 8-level cascade of partial losses in the dtype, level step
// 2^max(4, CeilLog2(N)/8), each kept row's -x[b, t] subtracted into level 0 and carried up while
// b's bits under the level's mask are zero (a row whose target is ignore_index is skipped, with
// its carry), the levels added in order to 0, total_weight = N - ignored, a mean divided by it.
// Backward: operands grad_output, target, total_weight, grad_input: grad_input zero-filled,
// then -(grad_output / total_weight) (mean) or -grad_output (sum) at each kept row's target.
// ignore_index is parameter 1. A target outside [0, C) (not ignore_index) makes the kernel
// write nothing and set parameter 2: the call then runs as ATen's, which raises ATen's error.

// Note [Generated layer norm]: native_layer_norm over a dense float32/float64 input, weight and
// bias both given (dense) or both absent, is one program: operands input, [weight, bias,]
// Y, mean, rstd; per row of C elements ATen's RowwiseMoments (misc/ATEN_ORDER.md section 5:
// Welford over 16-vector chunks with its fused multiply-adds, a binary-counter stack of chunk
// moments, a scalar Welford over the tail, the lanes folded in lane order), rstd = 1/sqrt(var +
// eps) with eps in the input's dtype, Y = fma((x - mean)*rstd, weight, bias) (or (x - mean)*rstd
// times 1 plus 0 without them), at the AVX2 kernel's 32-byte width ATen runs on AVX-512 hosts.

// Note [Generated batch norm]: native_batch_norm in training (save_mean and save_invstd are its
// statistics) and native_batch_norm_backward with train set, over a dense float32/float64
// (N, C, *) input with more than one element per (n, c) plane, are one program each; rows are
// channels, each channel's arithmetic ATen's contiguous kernel's (misc/ATEN_ORDER.md section 7),
// which does not depend on the thread count. Forward: operands input, [weight, bias,]
// [running_mean, running_var,] Y, save_mean, save_invstd; per channel the sum and the sum of
// squared deviations in double over n then i (float32: each square rounded in float; float64:
// plain but for the last element of an odd-sized plane, an fma), mean = T(sum / n), invstd =
// T(1 / sqrt(double(T(var_sum / T(n))) + eps)) (0 when both are 0), the running statistics
// updated as ATen's generic code does (running_mean in T, running_var's sum in double),
// alpha = invstd * weight, beta = fma(-mean, alpha, bias), Y = fma(x, alpha, beta).
// Backward: operands grad_out, input, [weight,] save_mean, save_invstd, then the results the
// output mask asks for (grad_input, [grad_weight,] grad_bias); per channel and image the sum of
// grad_out by reduce_all and the dot product of (x - mean) and grad_out by map2_reduce_all (the
// masked tail's step an fma) at 32-byte vectors, added in double over images; k =
// T(T(T(dotp) * invstd) * invstd) / T(n), grad_mean = T(sum / n), grad_input =
// T(fma(-(x - mean), k, go - grad_mean) * invstd) * weight, grad_weight = T(dotp * invstd),
// grad_bias = T(sum). eps and momentum are parameters read each launch. An (N, C) input, whose
// statistics ATen gathers in per-thread buffers (the bits depend on the thread count), and
// evaluation mode are not generated.

// Note [Generated softmax]: _softmax, _log_softmax and _safe_softmax over the last dim of a
// dense float32/float64 input (no half_to_float, no dtype) are one program: operand 0 the input,
// operand 1 the output, rows of C elements. Per row, ATen's last-dim kernel's order
// (misc/ATEN_ORDER.md section 4) at the width its softmax kernel runs at on this host
// (vec_bytes: 64 on AVX-512, 32 on AVX2): the max and the sum by its reduce_all (the first
// vector, further whole vectors, the tail into its first lanes, then float32's lanes by its
// shuffle tree, float64's in order; a row shorter than a vector in order), max as ATen's
// maximum (NaN-propagating; of equal values the later one), exp and log ATen's own (Note
// [Vector math], CpuJit.h: `math` names them). softmax: e = exp(x - max), y = e * (1/sum);
// log_softmax: y = (x - max) - log(sum of exp(x - max)); _safe_softmax: softmax, and a row that
// is all -inf (its max is -inf) +0. Their backwards (_softmax_backward_data,
// _log_softmax_backward_data) take operands grad, output, result: softmax's s = the sum of
// grad * output (the first vector a product, then acc + grad*output unfused, except float32's
// tail, which ATen's compiled code fuses into one fma only when its loop over rows runs inline:
// one row, one thread at the time of the call, or a call inside a parallel region; a launch
// parameter says which), result =
// (grad - s) * output; log_softmax's s = the sum of grad, result = fma(-exp(output), s, grad).

// What is compiled: its content hash is the cache's "what is computed".
struct PointwiseProgram {
  std::vector<PwInst> insts;
  std::vector<PwOperand> operands;
  std::vector<std::int8_t> params;  // the dtype each parameter is passed in
  // Note [Generated sums]: no instructions, or (SumInner, SumOuter) a prologue (Note [Sum
  // prologues])
  ReduceKind reduce = ReduceKind::None;
  std::uint16_t reduced = 0;             // a prologue's instruction whose values are summed
  bool mean = false;                     // a reduction's sum divided by its element count
  bool affine = false;                   // LayerNorm, BatchNorm: weight and bias given
                                         // (BatchNormBwd, LayerNormBwd: weight given)
  bool running = false;                  // BatchNorm: running_mean and running_var given
  std::uint8_t outputs = 0;              // BatchNormBwd, LayerNormBwd: output mask, bit i result i
  bool smallest = false;                 // ArgExtreme: min.dim, argmin
  bool root = false;                     // Variance: std, std_mean (the square root)
  bool two_pass = false;                 // Variance: one result, about torch.mean's value
  bool int_param = false;                // Variance: the correction is an int64 parameter (or bool)
  bool safe = false;                     // Softmax: a row all -inf gives +0 (_safe_softmax)
  std::uint8_t vec_bytes = 0;            // Softmax, LogSoftmax and backwards: ATen's vector width
  std::string math;                      // the same: VectorMath::name
  ContentHash hash() const;
  std::string text() const;  // one line per instruction, for messages and dumps
  bool scaled() const;  // has AddScaled/SubScaled/Lerp: a fused contiguous loop exists
};

// How a program binds to one plan kernel: the plan tensor whose element 0 is each operand's
// base, its strides in iteration space, and the plan scalar behind each parameter.
struct PointwiseKernel {
  PointwiseProgram program;
  std::vector<std::int64_t> shape;                 // iteration shape
  std::vector<std::uint32_t> operand_tensor;       // per operand
  std::vector<std::vector<std::int64_t>> strides;  // per operand, in elements, one per dim
  // per parameter: index in plan.scalars, or kFixedScalar | i for fixed_scalars[i]
  std::vector<std::uint32_t> param_scalar;
  std::vector<record::ScalarRecord> fixed_scalars;  // values the lowering computed
  // The plan scalars those values were computed from, with their bits then: a launch where one
  // was patched to another value runs the calls as library calls.
  std::vector<std::pair<std::uint32_t, std::uint64_t>> fixed_from;
  static constexpr std::uint32_t kFixedScalar = 0x80000000u;
  std::vector<std::uint32_t> unit_params;  // the alpha parameters (of AddScaled/SubScaled)
  // A product rounded into a sum whatever the parameters (addcmul, lerp): no alpha of 1 or -1
  // makes both roundings agree.
  bool always_scaled = false;
  // A call rounding a product into a sum has an input of other sizes than its output (a 0-d
  // tensor, a Python number, a broadcast row): ATen's rounding there follows no rule the
  // backend models (Note [ATen's alpha rounding], CpuBackend.cpp).
  bool scaled_broadcast = false;
  bool fast = false;  // lowered for numerics="fast" (Note [Fast numerics], CpuBackend.cpp)
  // A reduction (Note [Generated sums]): rows (Inner) or rows summed per column (Outer), and C.
  std::int64_t reduce_rows = 0, reduce_cols = 0;
  std::uint32_t eps_scalar = 0;  // LayerNorm: the plan scalar holding eps
  std::int64_t images = 0;       // BatchNorm, BatchNormBwd: N (rows are channels, cols the plane)
  std::int64_t reduce_inner = 1;  // ArgExtreme, Variance: elements after the reduced dims
  // Variance: the correction's double bits when it is not a plan scalar (None: 1)
  std::uint64_t fixed_param = 0;
};

// The kernel's calls as one program, or `unsupported` naming the call and why (an op outside
// the covered set, a dtype other than float32/float64, shapes that do not share one iteration
// shape, aliasing views of written memory).
// `fast`: also the ops only numerics="fast" generates (sqrt).
Result<PointwiseKernel> lower_pointwise(const exec::ExecutionPlan& plan, std::uint32_t kernel,
                                        bool fast = false);

// Calls [call_begin, call_begin + call_count) of the kernel as one program: a part of a kernel
// whose calls do not all share one iteration shape or are not all covered (Note [Kernel runs],
// CpuBackend.cpp). An intermediate a call outside the range reads is stored. `skip`: calls in
// the range that run before it instead (host reads, Note [Kernel runs]), left out.
Result<PointwiseKernel> lower_pointwise_calls(const exec::ExecutionPlan& plan,
                                              std::uint32_t kernel, std::uint32_t call_begin,
                                              std::uint32_t call_count, bool fast = false,
                                              std::span<const std::uint32_t> skip = {});

// Note [Generated sums]: call c (sum.dim_IntList, sum, mean.dim) as a reduction program, or
// `unsupported` saying why not (another layout, dtype or argument; a full reduction ATen
// splits over threads).
Result<PointwiseKernel> lower_reduction(const exec::ExecutionPlan& plan, std::uint32_t call);
bool is_reduction_op(std::string_view op);
// Note [Sum prologues]: a sum (SumInner or SumOuter) may compute the elements it adds instead
// of loading them: its instructions are a pointwise program over one element (Load, Param,
// Const, Add, Sub, Mul, Div, Neg, Abs, Relu, Sign, ThresholdBwd, and AddScaled/SubScaled whose
// alpha is 1 or -1 at each launch, else the calls run as library calls; every one in the sum's
// dtype),
// evaluated at each element the sum reads, in its order, and instruction `reduced` is the
// element added. Operands: the prologue's loads (each dense in the sum's row-major order, or
// broadcast: one element for all), then the output. ATen computes such an element into a tensor
// first, one IEEE operation per instruction, and sums that tensor in cascade_sum's order; the
// sum adds the same values in the same order, so its bits are ATen's, and the tensor is never
// written. mse_loss with reduction mean or sum is one: (self - target) * (self - target), summed
// over every element (ATen's mse_kernel, then its mean or sum; not generated past 32768
// elements, which ATen's sum splits over its threads).
Result<PointwiseKernel> lower_mse_loss(const exec::ExecutionPlan& plan, std::uint32_t call);
// Whether call c is mse_loss with reduction mean or sum (a sum; with reduction none it is the
// pointwise op `(self - target) * (self - target)`).
bool is_mse_loss_sum(const exec::ExecutionPlan& plan, std::uint32_t call);
// Calls [call_begin, call_begin + call_count) of kernel k, a pointwise chain, and the sum right
// after them as one program, when the chain's only stored result is the sum's input, which
// nothing after the sum reads (an Arena slot): the chain becomes the sum's prologue. Else
// `unsupported` saying why (the chain and the sum then run as programs of their own).
Result<PointwiseKernel> lower_sum_with_prologue(const exec::ExecutionPlan& plan,
                                                std::uint32_t kernel, std::uint32_t call_begin,
                                                std::uint32_t call_count, bool fast = false);
// Whether a program's instructions are a prologue the sum's code generator takes.
bool sum_prologue_ok(const PointwiseProgram& program);
// Note [Generated layer norm]: call c (native_layer_norm) as a program, or `unsupported`.
// reduce_rows is the rows, reduce_cols the normalized elements; eps_scalar the plan scalar.
Result<PointwiseKernel> lower_layer_norm(const exec::ExecutionPlan& plan, std::uint32_t call);
// Note [Generated layer norm backward]: call c (native_layer_norm_backward) as a program.
Result<PointwiseKernel> lower_layer_norm_backward(const exec::ExecutionPlan& plan,
                                                  std::uint32_t call);
// Note [Generated softmax]: call c (_softmax, _log_softmax, _safe_softmax and their backwards) as a program over
// `vec_bytes`-wide vectors with the vector math named `math`, or `unsupported` (without vector
// math, saying `no_math`: why the host has none).
Result<PointwiseKernel> lower_softmax(const exec::ExecutionPlan& plan, std::uint32_t call,
                                      unsigned vec_bytes, std::string_view math,
                                      std::string_view no_math = {});
bool is_softmax_op(std::string_view op);
// Note [Generated nll_loss]: call c (nll_loss_forward, nll_loss_backward) as a program; its
// param_scalar[0] is the plan scalar of ignore_index.
Result<PointwiseKernel> lower_nll_loss(const exec::ExecutionPlan& plan, std::uint32_t call);

// Note [Generated batch norm]: call c (native_batch_norm, native_batch_norm_backward) as a
// program over reduce_rows = C channels of reduce_cols elements per image, `images` images;
// param_scalar holds eps and (forward) momentum.
Result<PointwiseKernel> lower_batch_norm(const exec::ExecutionPlan& plan, std::uint32_t call);
bool is_batch_norm_op(std::string_view op);

// Note [Generated max and argmax]: call c (max.dim, min.dim, argmax, argmin) as a program.
Result<PointwiseKernel> lower_arg_extreme(const exec::ExecutionPlan& plan, std::uint32_t call);
bool is_arg_extreme_op(std::string_view op);

// Note [Generated amax and amin]: call c (amax, amin) as a program.
Result<PointwiseKernel> lower_extreme_values(const exec::ExecutionPlan& plan, std::uint32_t call);
bool is_extreme_values_op(std::string_view op);

// Note [Generated var and std]: call c (var, std, var_mean, std_mean) as a program.
Result<PointwiseKernel> lower_variance(const exec::ExecutionPlan& plan, std::uint32_t call);
bool is_variance_op(std::string_view op);

// Whether lower_pointwise covers op ("aten::add.Tensor"), bit-exact (or with `fast`, at all).
bool covers_op(std::string_view op, bool fast = false);

// The ops lower_pointwise covers bit-exact ("aten::add.Tensor", ...), for reports and tests;
// with `fast`, also the ones only numerics="fast" generates.
std::vector<std::string> covered_pointwise_ops(bool fast = false);

}  // namespace crucible::mimic
