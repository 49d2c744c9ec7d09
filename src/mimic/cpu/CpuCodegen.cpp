// CpuCodegen.cpp — LLVM IR for a pointwise program, optimized at O3 for the host CPU and
// emitted as an object file; and the host target's detection (CpuTarget.h).
#include "crucible/mimic/CpuCodegen.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <system_error>
#include <vector>

#include "crucible/core/ScalarType.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/MDBuilder.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/Transforms/Utils/Cloning.h"
#if LLVM_VERSION_MAJOR >= 17
#include "llvm/TargetParser/Host.h"
#else
#include "llvm/Support/Host.h"
#endif

namespace crucible::mimic {
namespace {

#if LLVM_VERSION_MAJOR >= 18
constexpr auto kCodeGenO3 = llvm::CodeGenOptLevel::Aggressive;
constexpr auto kObjectFile = llvm::CodeGenFileType::ObjectFile;
constexpr auto kAssemblyFile = llvm::CodeGenFileType::AssemblyFile;
#else
constexpr auto kCodeGenO3 = llvm::CodeGenOpt::Aggressive;
constexpr auto kObjectFile = llvm::CGFT_ObjectFile;
constexpr auto kAssemblyFile = llvm::CGFT_AssemblyFile;
#endif

void init_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

CpuTarget detect_host() {
  init_llvm();
  CpuTarget t;
  t.triple = llvm::sys::getProcessTriple();
  t.cpu = llvm::sys::getHostCPUName().str();
#if LLVM_VERSION_MAJOR >= 19
  const llvm::StringMap<bool> feats = llvm::sys::getHostCPUFeatures();
#else
  llvm::StringMap<bool> feats;
  llvm::sys::getHostCPUFeatures(feats);
#endif
  std::vector<std::string> names;
  for (const auto& f : feats) names.push_back((f.getValue() ? "+" : "-") + f.getKey().str());
  std::sort(names.begin(), names.end(),
            [](const std::string& a, const std::string& b) { return a.substr(1) < b.substr(1); });
  for (const std::string& n : names) t.features += (t.features.empty() ? "" : ",") + n;
  t.llvm_version = LLVM_VERSION_STRING;
  return t;
}

// A function of the module for the host's CPU: its name, type and attributes.
llvm::Function* new_function(llvm::Module& m, const std::string& name, llvm::FunctionType* fty,
                             const CpuTarget& target) {
  llvm::Function* fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m);
  fn->addFnAttr("target-cpu", target.cpu);
  fn->addFnAttr("target-features", target.features);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  return fn;
}

// One generated function: a loop over n elements, contiguous or strided.
class LoopEmitter {
 public:
  // fused: AddScaled/SubScaled/Lerp round once (llvm.fma), else twice (fmul, fadd).
  LoopEmitter(const PointwiseProgram& p, llvm::Module& m, bool contig, bool fused = false)
      : p_(p), m_(m), ctx_(m.getContext()), b_(ctx_), contig_(contig), fused_(fused) {}

  void emit(const std::string& name, const CpuTarget& target) {
    auto* i64 = llvm::Type::getInt64Ty(ctx_);
    auto* bytes_ptr = llvm::Type::getInt8Ty(ctx_)->getPointerTo();
    auto* ptrs_ty = bytes_ptr->getPointerTo();
    auto* i64_ptr = i64->getPointerTo();
    std::vector<llvm::Type*> args{ptrs_ty};
    if (!contig_) args.push_back(i64_ptr);
    args.push_back(i64);
    args.push_back(i64_ptr);
    fn_ = new_function(m_, name, llvm::FunctionType::get(llvm::Type::getVoidTy(ctx_), args, false), target);
    auto arg = fn_->arg_begin();
    llvm::Value* ptrs = &*arg++;
    llvm::Value* strides = contig_ ? nullptr : &*arg++;
    llvm::Value* n = &*arg++;
    llvm::Value* params = &*arg++;
    fn_->addParamAttr(0, llvm::Attribute::NoAlias);
    fn_->addParamAttr(0, llvm::Attribute::ReadOnly);

    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    auto* loop = llvm::BasicBlock::Create(ctx_, "loop", fn_);
    auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
    b_.SetInsertPoint(entry);
    // Operand bases and strides, and everything that does not change per element: parameters
    // and broadcast operands' one element (contiguous loop).
    for (std::size_t k = 0; k < p_.operands.size(); ++k) {
      auto* slot = b_.CreateConstInBoundsGEP1_64(bytes_ptr, ptrs, k);
      auto* base = b_.CreateLoad(bytes_ptr, slot);
      bases_.push_back(b_.CreateBitCast(base, type(p_.operands[k].dtype)->getPointerTo()));
      if (!contig_)
        strides_.push_back(b_.CreateLoad(i64, b_.CreateConstInBoundsGEP1_64(i64, strides, k)));
    }
    // Operands are distinct memory (Note [Pointwise programs]): one alias scope each, so the
    // vectorizer needs no run-time overlap checks.
    llvm::MDBuilder md(ctx_);
    llvm::MDNode* domain = md.createAnonymousAliasScopeDomain("operands");
    std::vector<llvm::Metadata*> scopes;
    for (std::size_t k = 0; k < p_.operands.size(); ++k)
      scopes.push_back(md.createAnonymousAliasScope(domain, "op" + std::to_string(k)));
    for (std::size_t k = 0; k < p_.operands.size(); ++k) {
      std::vector<llvm::Metadata*> others;
      for (std::size_t j = 0; j < scopes.size(); ++j)
        if (j != k) others.push_back(scopes[j]);
      scope_.push_back(llvm::MDNode::get(ctx_, {scopes[k]}));
      noalias_.push_back(llvm::MDNode::get(ctx_, others));
    }
    vals_.assign(p_.insts.size(), nullptr);
    for (std::size_t i = 0; i < p_.insts.size(); ++i) {
      const PwInst& in = p_.insts[i];
      if (in.op == PwOp::Param) {
        auto* at = b_.CreateConstInBoundsGEP1_64(i64, params, in.a);
        vals_[i] =
            b_.CreateLoad(type(in.dtype), b_.CreateBitCast(at, type(in.dtype)->getPointerTo()));
      } else if (in.op == PwOp::Load && contig_ && p_.operands[in.a].broadcast) {
        vals_[i] = scoped(b_.CreateLoad(type(in.dtype), bases_[in.a]), in.a);
      }
    }
    b_.CreateCondBr(b_.CreateICmpSGT(n, b_.getInt64(0)), loop, exit);

    b_.SetInsertPoint(loop);
    llvm::PHINode* idx = b_.CreatePHI(i64, 2);
    idx->addIncoming(b_.getInt64(0), entry);
    for (std::size_t i = 0; i < p_.insts.size(); ++i)
      if (vals_[i] == nullptr) vals_[i] = inst(p_.insts[i], idx);
    llvm::Value* next = b_.CreateAdd(idx, b_.getInt64(1), "", /*HasNUW=*/true, /*HasNSW=*/true);
    idx->addIncoming(next, loop);
    b_.CreateCondBr(b_.CreateICmpSLT(next, n), loop, exit);
    b_.SetInsertPoint(exit);
    b_.CreateRetVoid();
  }

 private:
  llvm::Type* type(std::int8_t dt) {
    if (dt == dtype::kInt64) return llvm::Type::getInt64Ty(ctx_);
    return dt == dtype::kFloat64 ? llvm::Type::getDoubleTy(ctx_) : llvm::Type::getFloatTy(ctx_);
  }
  llvm::Value* address(std::uint32_t k, llvm::Value* idx) {
    const PwOperand& o = p_.operands[k];
    if (contig_ && o.broadcast) return bases_[k];
    llvm::Value* off = contig_ ? idx : b_.CreateMul(idx, strides_[k]);
    return b_.CreateInBoundsGEP(type(o.dtype), bases_[k], off);
  }
  llvm::Instruction* scoped(llvm::Instruction* access, std::uint32_t operand) {
    access->setMetadata(llvm::LLVMContext::MD_alias_scope, scope_[operand]);
    access->setMetadata(llvm::LLVMContext::MD_noalias, noalias_[operand]);
    return access;
  }
  llvm::Value* inst(const PwInst& in, llvm::Value* idx) {
    llvm::Value* a = in.op == PwOp::Load || in.op == PwOp::Const ? nullptr : vals_[in.a];
    switch (in.op) {
      case PwOp::Load:
        return scoped(b_.CreateLoad(type(in.dtype), address(in.a, idx)), in.a);
      case PwOp::Convert:
        if (p_.insts[in.a].dtype == dtype::kInt64) return b_.CreateSIToFP(a, type(in.dtype));
        return in.dtype == dtype::kFloat64 ? b_.CreateFPExt(a, type(in.dtype))
                                           : b_.CreateFPTrunc(a, type(in.dtype));
      case PwOp::Add:
        return b_.CreateFAdd(a, vals_[in.b]);
      case PwOp::Sub:
        return b_.CreateFSub(a, vals_[in.b]);
      case PwOp::Mul:
        return b_.CreateFMul(a, vals_[in.b]);
      case PwOp::Div:
        return b_.CreateFDiv(a, vals_[in.b]);
      case PwOp::Neg:
        return b_.CreateFNeg(a);
      case PwOp::Abs:
        return b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, a);
      case PwOp::Relu: {
        llvm::Value* zero = llvm::ConstantFP::get(type(in.dtype), 0.0);
        return b_.CreateSelect(b_.CreateFCmpOLT(a, zero), zero, a);
      }
      case PwOp::Sign: {  // ATen's sign_kernel: (0 < a) - (a < 0), each a 1 or a +0
        llvm::Value* zero = llvm::ConstantFP::get(type(in.dtype), 0.0);
        llvm::Value* one = llvm::ConstantFP::get(type(in.dtype), 1.0);
        return b_.CreateFSub(b_.CreateSelect(b_.CreateFCmpOGT(a, zero), one, zero),
                             b_.CreateSelect(b_.CreateFCmpOLT(a, zero), one, zero));
      }
      case PwOp::AddScaled:
      case PwOp::SubScaled: {
        llvm::Value* alpha = vals_[in.c];
        if (in.op == PwOp::SubScaled) alpha = b_.CreateFNeg(alpha);  // ATen: add with -alpha
        if (fused_)
          return b_.CreateIntrinsic(llvm::Intrinsic::fma, {type(in.dtype)}, {vals_[in.b], alpha, a});
        return b_.CreateFAdd(a, b_.CreateFMul(alpha, vals_[in.b]));
      }
      case PwOp::Lerp: {  // ATen's is_lerp_weight_small: |w| < 0.5 (a NaN weight is not small)
        llvm::Value* w = vals_[in.c];
        llvm::Value* diff = b_.CreateFSub(vals_[in.b], a);
        llvm::Value* small = b_.CreateFCmpOLT(b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, w),
                                              llvm::ConstantFP::get(type(in.dtype), 0.5));
        llvm::Value* coeff =
            b_.CreateSelect(small, w, b_.CreateFSub(w, llvm::ConstantFP::get(type(in.dtype), 1.0)));
        llvm::Value* base = b_.CreateSelect(small, a, vals_[in.b]);
        if (fused_)
          return b_.CreateIntrinsic(llvm::Intrinsic::fma, {type(in.dtype)}, {coeff, diff, base});
        return b_.CreateFAdd(base, b_.CreateFMul(coeff, diff));
      }
      case PwOp::Sqrt:
        return b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, a);
      case PwOp::Const:
        return llvm::ConstantFP::get(type(in.dtype), static_cast<double>(in.a));
      case PwOp::ThresholdBwd: {  // ordered <=: a NaN self passes the gradient
        llvm::Value* zero = llvm::ConstantFP::get(type(in.dtype), 0.0);
        return b_.CreateSelect(b_.CreateFCmpOLE(a, vals_[in.c]), zero, vals_[in.b]);
      }
      case PwOp::Store:
        return scoped(b_.CreateStore(a, address(in.b, idx)), in.b);
      case PwOp::Param:
      case PwOp::kCount:
        break;
    }
    return nullptr;
  }

  const PointwiseProgram& p_;
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  bool contig_;
  bool fused_;
  llvm::Function* fn_ = nullptr;
  std::vector<llvm::Value*> bases_, strides_, vals_;
  std::vector<llvm::MDNode*> scope_, noalias_;  // per operand
};

// Note [Generated sums] (PointwiseProgram.h): one function with the contiguous loop's signature,
// P_contig(ptrs, rows, params): ptrs[0] the input, ptrs[1] the output, params[0] the columns C.
// SumInner: each of `rows` rows of C elements to one result; SumOuter: `rows` rows of C columns
// to C results. The arithmetic is ATen's cascade_sum's, add for add (misc/ATEN_ORDER.md section
// 2), in vectors of W = 32 bytes (its AVX2 kernel's width, which it runs on AVX-512 hosts too):
// every lane's additions are the IEEE sequence ATen's lane performs.
class ReduceEmitter {
 public:
  ReduceEmitter(const PointwiseProgram& p, llvm::Module& m)
      : p_(p), m_(m), ctx_(m.getContext()), b_(ctx_), dt_(p.operands[0].dtype) {}

  void emit(const std::string& name, const CpuTarget& target) {
    i64_ = llvm::Type::getInt64Ty(ctx_);
    elem_ = dt_ == dtype::kFloat64 ? llvm::Type::getDoubleTy(ctx_) : llvm::Type::getFloatTy(ctx_);
    w_ = dt_ == dtype::kFloat64 ? 4 : 8;
    const bool softmax = p_.reduce >= ReduceKind::Softmax && p_.reduce <= ReduceKind::LogSoftmaxBwd;
    if (softmax) w_ = p_.vec_bytes / (dt_ == dtype::kFloat64 ? 8 : 4);  // Note [Generated softmax]
    vec_ = llvm::FixedVectorType::get(elem_, static_cast<unsigned>(w_));
    auto* bytes_ptr = llvm::Type::getInt8Ty(ctx_)->getPointerTo();
    auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx_),
                                        {bytes_ptr->getPointerTo(), i64_, i64_->getPointerTo()}, false);
    fn_ = new_function(m_, name, fty, target);
    // Note [Vector math]: a 64-byte vector is passed in one zmm register only when the caller
    // keeps 512-bit vectors legal (a CPU tuned for 256-bit vectors splits them otherwise).
    if (softmax) fn_->addFnAttr("min-legal-vector-width", std::to_string(p_.vec_bytes * 8));
    auto arg = fn_->arg_begin();
    llvm::Value* ptrs = &*arg++;
    llvm::Value* rows = &*arg++;
    llvm::Value* params = &*arg++;
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
    x_ = b_.CreateBitCast(b_.CreateLoad(bytes_ptr, b_.CreateConstInBoundsGEP1_64(bytes_ptr, ptrs, 0)),
                          elem_->getPointerTo());
    out_ = b_.CreateBitCast(b_.CreateLoad(bytes_ptr, b_.CreateConstInBoundsGEP1_64(bytes_ptr, ptrs, 1)),
                            elem_->getPointerTo());
    cols_ = b_.CreateLoad(i64_, params);
    auto operand = [&](std::uint64_t k) {
      return b_.CreateBitCast(b_.CreateLoad(bytes_ptr, b_.CreateConstInBoundsGEP1_64(bytes_ptr, ptrs, k)),
                              elem_->getPointerTo());
    };
    if (!p_.insts.empty()) {  // Note [Sum prologues]: the loads' operands, then the output
      const std::size_t nops = p_.operands.size();
      x_ = nullptr;
      out_ = operand(nops - 1);
      for (std::size_t k = 0; k + 1 < nops; ++k) pro_base_.push_back(operand(k));
      for (std::size_t j = 0; j < p_.params.size(); ++j)
        pro_param_.push_back(b_.CreateLoad(
            elem_, b_.CreateBitCast(b_.CreateConstInBoundsGEP1_64(i64_, params, 1 + j),
                                    elem_->getPointerTo())));
    }
    if (p_.reduce == ReduceKind::LayerNorm) {
      const bool aff = p_.affine;
      llvm::Value* eps = b_.CreateLoad(llvm::Type::getDoubleTy(ctx_),
                                       b_.CreateBitCast(b_.CreateConstInBoundsGEP1_64(i64_, params, 1),
                                                        llvm::Type::getDoubleTy(ctx_)->getPointerTo()));
      if (elem_ != eps->getType()) eps = b_.CreateFPTrunc(eps, elem_);
      layer_norm(rows, aff ? operand(1) : nullptr, aff ? operand(2) : nullptr, operand(aff ? 3 : 1),
                 operand(aff ? 4 : 2), operand(aff ? 5 : 3), eps);
    } else if (p_.reduce == ReduceKind::NllLoss || p_.reduce == ReduceKind::NllLossBwd) {
      nll_loss(rows, params);
    } else if (p_.reduce == ReduceKind::BatchNorm) {
      batch_norm(rows, params, operand);
    } else if (p_.reduce == ReduceKind::BatchNormBwd) {
      batch_norm_backward(rows, params, operand);
    } else if (p_.reduce == ReduceKind::LayerNormBwd) {
      layer_norm_backward(rows, params, operand);
    } else if (p_.reduce == ReduceKind::ArgExtreme) {
      arg_extreme(rows, params, operand);
    } else if (p_.reduce == ReduceKind::Variance) {
      variance(rows, params, operand);
    } else if (p_.reduce == ReduceKind::SoftmaxBwd || p_.reduce == ReduceKind::LogSoftmaxBwd) {
      // params[1]: float32's tail step fused (ATen's loop over rows ran inline)
      softmax_backward_rows(rows, operand(1), operand(2),
                            b_.CreateICmpNE(b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 1)), c64(0)));
    } else if (softmax) {
      softmax_rows(rows);
    } else if (p_.reduce == ReduceKind::ExtremeInner) {
      extreme_rows(rows);
    } else if (p_.reduce == ReduceKind::ExtremeOuter) {
      extreme_columns(rows);
    } else if (p_.reduce == ReduceKind::SumInner) {
      inner(rows);
    } else {
      outer(rows);
    }
    b_.CreateRetVoid();
  }

 private:
  using Load = std::function<llvm::Value*(llvm::Value* i)>;
  llvm::Value* c64(std::int64_t v) { return b_.getInt64(static_cast<std::uint64_t>(v)); }
  llvm::Type* scalar_type(std::int8_t dt) {
    if (dt == dtype::kInt64) return i64_;
    return dt == dtype::kFloat64 ? llvm::Type::getDoubleTy(ctx_) : llvm::Type::getFloatTy(ctx_);
  }
  llvm::Value* zero(llvm::Type* t) { return llvm::Constant::getNullValue(t); }  // +0.0
  llvm::BasicBlock* block(const char* n) { return llvm::BasicBlock::Create(ctx_, n, fn_); }
  llvm::AllocaInst* slot(llvm::Type* t) {  // in the entry block, so SROA makes it a register
    llvm::IRBuilder<> e(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
    return e.CreateAlloca(t);
  }
  llvm::Value* at(llvm::Value* base, llvm::Value* i) { return b_.CreateInBoundsGEP(elem_, base, i); }
  llvm::Value* load(llvm::Type* t, llvm::Value* base, llvm::Value* i) {
    llvm::Value* ptr = at(base, i);
    if (t != elem_) ptr = b_.CreateBitCast(ptr, t->getPointerTo());
    return b_.CreateAlignedLoad(t, ptr, align());
  }

  // for (i = begin; i < end; ++i) body(i)
  void loop(llvm::Value* begin, llvm::Value* end, const std::function<void(llvm::Value*)>& body,
            llvm::Value* step = nullptr) {
    if (step == nullptr) step = c64(1);
    llvm::AllocaInst* iv = slot(i64_);
    b_.CreateStore(begin, iv);
    llvm::BasicBlock *head = block("head"), *bodyb = block("body"), *done = block("done");
    b_.CreateBr(head);
    b_.SetInsertPoint(head);
    llvm::Value* i = b_.CreateLoad(i64_, iv);
    b_.CreateCondBr(b_.CreateICmpSLT(i, end), bodyb, done);
    b_.SetInsertPoint(bodyb);
    body(i);
    b_.CreateStore(b_.CreateAdd(b_.CreateLoad(i64_, iv), step), iv);
    b_.CreateBr(head);
    b_.SetInsertPoint(done);
  }

  // Element i of the sum's input (W elements from i for a vector type t): loaded, or computed by
  // the prologue (Note [Sum prologues]), one IEEE operation per instruction as ATen's kernels
  // computed the tensor it sums.
  llvm::Value* src(llvm::Type* t, llvm::Value* i) {
    if (p_.insts.empty()) return load(t, x_, i);
    const bool vec = t != elem_;
    auto widen = [&](llvm::Value* s) { return vec ? splat(s) : s; };
    llvm::Value* zero_t = zero(t);
    std::vector<llvm::Value*> v(p_.insts.size(), nullptr);
    for (std::size_t k = 0; k < p_.insts.size(); ++k) {
      const PwInst& in = p_.insts[k];
      switch (in.op) {
        case PwOp::Load:
          if (p_.operands[in.a].broadcast) {  // one element, in its own dtype (a Python number's)
            llvm::Type* et = scalar_type(p_.operands[in.a].dtype);
            llvm::Value* s = b_.CreateAlignedLoad(
                et, b_.CreateBitCast(pro_base_[in.a], et->getPointerTo()),
                llvm::MaybeAlign(p_.operands[in.a].dtype == dtype::kFloat32 ? 4 : 8));
            v[k] = vec ? b_.CreateVectorSplat(static_cast<unsigned>(w_), s) : s;
          } else {
            v[k] = load(t, pro_base_[in.a], i);
          }
          break;
        case PwOp::Convert: {  // to the sum's dtype: one rounding, as ATen converts
          const std::int8_t from = p_.insts[in.a].dtype;
          if (from == dtype::kInt64)
            v[k] = b_.CreateSIToFP(v[in.a], t);
          else if (from == dtype::kFloat64 && dt_ == dtype::kFloat32)
            v[k] = b_.CreateFPTrunc(v[in.a], t);
          else if (from == dtype::kFloat32 && dt_ == dtype::kFloat64)
            v[k] = b_.CreateFPExt(v[in.a], t);
          else
            v[k] = v[in.a];
          break;
        }
        case PwOp::Param:
          v[k] = widen(pro_param_[in.a]);
          break;
        case PwOp::Const:
          v[k] = llvm::ConstantFP::get(t, static_cast<double>(in.a));
          break;
        case PwOp::Add:
          v[k] = b_.CreateFAdd(v[in.a], v[in.b]);
          break;
        case PwOp::Sub:
          v[k] = b_.CreateFSub(v[in.a], v[in.b]);
          break;
        case PwOp::Mul:
          v[k] = b_.CreateFMul(v[in.a], v[in.b]);
          break;
        case PwOp::Div:
          v[k] = b_.CreateFDiv(v[in.a], v[in.b]);
          break;
        case PwOp::Neg:
          v[k] = b_.CreateFNeg(v[in.a]);
          break;
        case PwOp::Abs:
          v[k] = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, v[in.a]);
          break;
        case PwOp::Relu:
          v[k] = b_.CreateSelect(b_.CreateFCmpOLT(v[in.a], zero_t), zero_t, v[in.a]);
          break;
        case PwOp::Sign: {
          llvm::Value* one = llvm::ConstantFP::get(t, 1.0);
          v[k] = b_.CreateFSub(b_.CreateSelect(b_.CreateFCmpOGT(v[in.a], zero_t), one, zero_t),
                               b_.CreateSelect(b_.CreateFCmpOLT(v[in.a], zero_t), one, zero_t));
          break;
        }
        case PwOp::ThresholdBwd:
          v[k] = b_.CreateSelect(b_.CreateFCmpOLE(v[in.a], v[in.c]), zero_t, v[in.b]);
          break;
        case PwOp::AddScaled:  // a + alpha*b, alpha 1 or -1 (the launch checks): exact product
        case PwOp::SubScaled: {
          llvm::Value* alpha = in.op == PwOp::SubScaled ? b_.CreateFNeg(v[in.c]) : v[in.c];
          v[k] = b_.CreateFAdd(v[in.a], b_.CreateFMul(alpha, v[in.b]));
          break;
        }
        default:  // never: sum_prologue_ok admits the cases above only
          v[k] = zero_t;
          break;
      }
    }
    return v[p_.reduced];
  }

  // ATen's multi_row_sum: k interleaved accumulators (load(i) gives element i of each), each a
  // 4-level cascade of step 2^max(4, CeilLog2(size)/4); returns level 0 of each.
  std::vector<llvm::Value*> multi_row_sum(llvm::Type* t, std::size_t k, llvm::Value* size,
                                          const std::function<std::vector<llvm::Value*>(llvm::Value*)>& ld) {
    std::vector<std::array<llvm::AllocaInst*, 4>> acc(k);
    for (auto& a : acc)
      for (auto& l : a) {
        l = slot(t);
        b_.CreateStore(zero(t), l);
      }
    // CeilLog2(size): 1 for size <= 2, else the bit length of size - 1
    llvm::Value* bits = b_.CreateSub(c64(64), b_.CreateBinaryIntrinsic(llvm::Intrinsic::ctlz,
                                                                         b_.CreateSub(size, c64(1)), b_.getFalse()));
    llvm::Value* cl = b_.CreateSelect(b_.CreateICmpSLE(size, c64(2)), c64(1), bits);
    llvm::Value* q = b_.CreateUDiv(cl, c64(4));
    llvm::Value* power = b_.CreateSelect(b_.CreateICmpUGT(q, c64(4)), q, c64(4));
    llvm::Value* step = b_.CreateShl(c64(1), power);
    llvm::Value* mask = b_.CreateSub(step, c64(1));
    llvm::AllocaInst* iv = slot(i64_);
    b_.CreateStore(c64(0), iv);
    llvm::BasicBlock *head = block("cascade"), *chunk = block("chunk"), *tail = block("tail");
    b_.CreateBr(head);
    b_.SetInsertPoint(head);
    llvm::Value* i0 = b_.CreateLoad(i64_, iv);
    b_.CreateCondBr(b_.CreateICmpSLE(b_.CreateAdd(i0, step), size), chunk, tail);
    b_.SetInsertPoint(chunk);
    loop(i0, b_.CreateAdd(i0, step), [&](llvm::Value* i) {
      const std::vector<llvm::Value*> v = ld(i);
      for (std::size_t j = 0; j < k; ++j)
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(t, acc[j][0]), v[j]), acc[j][0]);
    });
    llvm::Value* i1 = b_.CreateAdd(i0, step);
    b_.CreateStore(i1, iv);
    for (int level = 1; level < 4; ++level) {
      for (std::size_t j = 0; j < k; ++j) {
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(t, acc[j][level]), b_.CreateLoad(t, acc[j][level - 1])),
                       acc[j][level]);
        b_.CreateStore(zero(t), acc[j][level - 1]);
      }
      if (level == 3) break;
      llvm::Value* m = b_.CreateShl(mask, b_.CreateMul(power, c64(level)));
      llvm::BasicBlock* next = block("carry");
      b_.CreateCondBr(b_.CreateICmpNE(b_.CreateAnd(i1, m), c64(0)), head, next);
      b_.SetInsertPoint(next);
    }
    b_.CreateBr(head);
    b_.SetInsertPoint(tail);
    loop(b_.CreateLoad(i64_, iv), size, [&](llvm::Value* i) {
      const std::vector<llvm::Value*> v = ld(i);
      for (std::size_t j = 0; j < k; ++j)
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(t, acc[j][0]), v[j]), acc[j][0]);
    });
    std::vector<llvm::Value*> r;
    for (std::size_t j = 0; j < k; ++j) {
      llvm::Value* a = b_.CreateLoad(t, acc[j][0]);
      for (int level = 1; level < 4; ++level) a = b_.CreateFAdd(a, b_.CreateLoad(t, acc[j][level]));
      r.push_back(a);
    }
    return r;
  }

  // ATen's row_sum: four interleaved cascades (elements i = k mod 4), the leftover elements
  // into the first, then the other three added to it in order.
  llvm::Value* row_sum(llvm::Type* t, llvm::Value* size, const Load& ld) {
    llvm::Value* quarter = b_.CreateSDiv(size, c64(4));
    std::vector<llvm::Value*> part = multi_row_sum(t, 4, quarter, [&](llvm::Value* i) {
      std::vector<llvm::Value*> v;
      for (int j = 0; j < 4; ++j) v.push_back(ld(b_.CreateAdd(b_.CreateMul(i, c64(4)), c64(j))));
      return v;
    });
    llvm::AllocaInst* p0 = slot(t);
    b_.CreateStore(part[0], p0);
    loop(b_.CreateMul(quarter, c64(4)), size,
         [&](llvm::Value* i) { b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(t, p0), ld(i)), p0); });
    llvm::Value* r = b_.CreateLoad(t, p0);
    for (int j = 1; j < 4; ++j) r = b_.CreateFAdd(r, part[static_cast<std::size_t>(j)]);
    return r;
  }

  // The stored result: 0 + s (ATen accumulates into a zero-filled output), over n for a mean.
  llvm::Value* finish(llvm::Value* s, llvm::Value* n) {
    llvm::Value* r = b_.CreateFAdd(zero(s->getType()), s);
    if (!p_.mean) return r;
    llvm::Value* d = b_.CreateSIToFP(n, elem_);
    if (s->getType() != elem_) d = b_.CreateVectorSplat(static_cast<unsigned>(w_), d);
    return b_.CreateFDiv(r, d);
  }
  llvm::MaybeAlign align() const { return llvm::MaybeAlign(dt_ == dtype::kFloat64 ? 8 : 4); }  // an element's
  void store(llvm::Value* v, llvm::Value* i, llvm::Value* base = nullptr) {  // default base: the output
    llvm::Value* ptr = at(base != nullptr ? base : out_, i);
    if (v->getType() != elem_) ptr = b_.CreateBitCast(ptr, v->getType()->getPointerTo());
    b_.CreateAlignedStore(v, ptr, align());
  }

  // Note [Generated amax and amin]: ATen's scalar max_impl (min_impl), a tie keeping a and a NaN
  // in either giving the default qNaN, and AVX2's maximum (minimum), per lane: a tie takes b, a
  // NaN lane is all ones. The identity -inf (amin: +inf) starts every result.
  llvm::Value* extreme_s(llvm::Value* a, llvm::Value* b) {
    llvm::Value* take_b = p_.smallest ? b_.CreateFCmpOLT(b, a) : b_.CreateFCmpOLT(a, b);
    return b_.CreateSelect(b_.CreateFCmpUNO(a, b), llvm::ConstantFP::getNaN(elem_),
                           b_.CreateSelect(take_b, b, a));
  }
  llvm::Value* extreme_v(llvm::Value* a, llvm::Value* b) {
    llvm::Value* take_a = p_.smallest ? b_.CreateFCmpOLT(a, b) : b_.CreateFCmpOGT(a, b);
    auto* ints = llvm::VectorType::getInteger(llvm::cast<llvm::VectorType>(vec_));
    llvm::Value* nan = b_.CreateSExt(b_.CreateFCmpUNO(a, b), ints);
    return b_.CreateBitCast(b_.CreateOr(b_.CreateBitCast(b_.CreateSelect(take_a, a, b), ints), nan),
                            vec_);
  }
  llvm::Value* extreme_identity() { return llvm::ConstantFP::getInfinity(elem_, !p_.smallest); }

  // Rows of cols_ elements (misc/ATEN_ORDER.md 10, vectorized_inner_reduction).
  void extreme_rows(llvm::Value* rows) {
    const std::int64_t group = 4 * w_;
    loop(c64(0), rows, [&](llvm::Value* r) {
      llvm::Value* row = b_.CreateMul(r, cols_);
      llvm::AllocaInst* d = slot(elem_);
      b_.CreateStore(extreme_identity(), d);
      llvm::Value* count = b_.CreateSDiv(cols_, c64(group));
      llvm::BasicBlock *vec = block("extreme_vectors"), *tail = block("extreme_tail");
      b_.CreateCondBr(b_.CreateICmpSGT(count, c64(0)), vec, tail);
      b_.SetInsertPoint(vec);
      std::vector<llvm::AllocaInst*> acc;
      for (std::int64_t j = 0; j < 4; ++j) {
        acc.push_back(slot(vec_));
        b_.CreateStore(load(vec_, x_, b_.CreateAdd(row, c64(j * w_))), acc.back());
      }
      loop(c64(1), count, [&](llvm::Value* i) {
        llvm::Value* base = b_.CreateAdd(row, b_.CreateMul(i, c64(group)));
        for (std::int64_t j = 0; j < 4; ++j)
          b_.CreateStore(extreme_v(b_.CreateLoad(vec_, acc[j]),
                                   load(vec_, x_, b_.CreateAdd(base, c64(j * w_)))),
                         acc[j]);
      });
      auto a = [&](int j) { return b_.CreateLoad(vec_, acc[j]); };
      llvm::Value* v = extreme_v(extreme_v(a(0), a(1)), extreme_v(a(2), a(3)));
      llvm::Value* h = b_.CreateExtractElement(v, std::uint64_t{0});
      for (std::int64_t lane = 1; lane < w_; ++lane)
        h = extreme_s(h, b_.CreateExtractElement(v, static_cast<std::uint64_t>(lane)));
      b_.CreateStore(extreme_s(b_.CreateLoad(elem_, d), h), d);
      b_.CreateBr(tail);
      b_.SetInsertPoint(tail);
      loop(b_.CreateMul(count, c64(group)), cols_, [&](llvm::Value* k) {
        b_.CreateStore(extreme_s(b_.CreateLoad(elem_, d), load(elem_, x_, b_.CreateAdd(row, k))),
                       d);
      });
      store(b_.CreateLoad(elem_, d), r);
    });
  }

  // `rows` rows of cols_ columns, each column to one result (misc/ATEN_ORDER.md 10,
  // vectorized_outer_reduction): the whole 4W groups of columns W at a time with V, the rest
  // one at a time with S.
  void extreme_columns(llvm::Value* rows) {
    llvm::Value* nv = b_.CreateMul(b_.CreateSDiv(cols_, c64(4 * w_)), c64(4 * w_));
    loop(
        c64(0), nv,
        [&](llvm::Value* c) {
          llvm::AllocaInst* acc = slot(vec_);
          b_.CreateStore(load(vec_, x_, c), acc);
          loop(c64(1), rows, [&](llvm::Value* i) {
            llvm::Value* x = load(vec_, x_, b_.CreateAdd(b_.CreateMul(i, cols_), c));
            b_.CreateStore(extreme_v(b_.CreateLoad(vec_, acc), x), acc);
          });
          store(extreme_v(b_.CreateLoad(vec_, acc), splat(extreme_identity())), c);
        },
        c64(w_));
    loop(nv, cols_, [&](llvm::Value* c) {
      llvm::AllocaInst* d = slot(elem_);
      b_.CreateStore(extreme_identity(), d);
      loop(c64(0), rows, [&](llvm::Value* i) {
        llvm::Value* x = load(elem_, x_, b_.CreateAdd(b_.CreateMul(i, cols_), c));
        b_.CreateStore(extreme_s(b_.CreateLoad(elem_, d), x), d);
      });
      store(b_.CreateLoad(elem_, d), c);
    });
  }

  void inner(llvm::Value* rows) {
    loop(c64(0), rows,
         [&](llvm::Value* r) { store(finish(row_total(b_.CreateMul(r, cols_)), cols_), r); });
  }
  // ATen's sum of the cols_ elements from element `row` on (vectorized_inner_sum or
  // scalar_inner_sum), in the dtype.
  llvm::Value* row_total(llvm::Value* row) {
    llvm::AllocaInst* f = slot(elem_);
    llvm::BasicBlock *vec = block("vector_row"), *scal = block("scalar_row"),
                     *join = block("row_done");
    b_.CreateCondBr(b_.CreateICmpSGE(cols_, c64(w_)), vec, scal);
    b_.SetInsertPoint(vec);  // vectorized_inner_sum: vectors, then the tail, then the lanes
    {
      llvm::Value* nv = b_.CreateSDiv(cols_, c64(w_));
      llvm::Value* v = row_sum(vec_, nv, [&](llvm::Value* i) {
        return src(vec_, b_.CreateAdd(row, b_.CreateMul(i, c64(w_))));
      });
      b_.CreateStore(zero(elem_), f);
      loop(b_.CreateMul(nv, c64(w_)), cols_, [&](llvm::Value* i) {
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(elem_, f), src(elem_, b_.CreateAdd(row, i))), f);
      });
      llvm::Value* acc = b_.CreateLoad(elem_, f);
      for (std::int64_t lane = 0; lane < w_; ++lane)
        acc = b_.CreateFAdd(acc, b_.CreateExtractElement(v, static_cast<std::uint64_t>(lane)));
      b_.CreateStore(acc, f);
      b_.CreateBr(join);
    }
    b_.SetInsertPoint(scal);  // scalar_inner_sum
    b_.CreateStore(
        row_sum(elem_, cols_, [&](llvm::Value* i) { return src(elem_, b_.CreateAdd(row, i)); }), f);
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
    return b_.CreateLoad(elem_, f);
  }

  void outer(llvm::Value* rows) {
    // Columns below nb take the cascade over every row (multi_row_sum), the rest row_sum;
    // nb = C/(4W)*4W when C >= W, else C/4*4. Lanes are columns: a W-vector of columns, or one.
    llvm::Value* wide = b_.CreateICmpSGE(cols_, c64(w_));
    llvm::Value* nb = b_.CreateSelect(wide, b_.CreateMul(b_.CreateSDiv(cols_, c64(4 * w_)), c64(4 * w_)),
                                      b_.CreateMul(b_.CreateSDiv(cols_, c64(4)), c64(4)));
    auto column_block = [&](llvm::Type* t, llvm::Value* c, bool cascade_only) {
      auto ld = [&](llvm::Value* i) { return src(t, b_.CreateAdd(b_.CreateMul(i, cols_), c)); };
      llvm::Value* s = cascade_only
                           ? multi_row_sum(t, 1, rows, [&](llvm::Value* i) { return std::vector<llvm::Value*>{ld(i)}; })[0]
                           : row_sum(t, rows, ld);
      store(finish(s, rows), c);
    };
    // [0, nb): W columns at a time when C >= W (nb is a multiple of 4W), else one at a time
    llvm::Value* nb_vec = b_.CreateSelect(wide, nb, c64(0));
    loop(c64(0), nb_vec, [&](llvm::Value* c) { column_block(vec_, c, true); }, c64(w_));
    loop(nb_vec, nb, [&](llvm::Value* c) { column_block(elem_, c, true); });
    // [nb, C): whole W-vectors of columns, then single columns
    llvm::Value* vec_end = b_.CreateAdd(nb, b_.CreateMul(b_.CreateSDiv(b_.CreateSub(cols_, nb), c64(w_)), c64(w_)));
    loop(nb, vec_end, [&](llvm::Value* c) { column_block(vec_, c, false); }, c64(w_));
    loop(vec_end, cols_, [&](llvm::Value* c) { column_block(elem_, c, false); });
  }

  llvm::Value* fma(llvm::Value* a, llvm::Value* b, llvm::Value* c) {
    return b_.CreateIntrinsic(llvm::Intrinsic::fma, {a->getType()}, {a, b, c});
  }
  llvm::Value* splat(llvm::Value* v) { return b_.CreateVectorSplat(static_cast<unsigned>(w_), v); }

  // Note [Generated layer norm]: ATen's RowwiseMoments (moments_utils.h) and LayerNormKernel, per
  // row; misc/ATEN_ORDER.md section 5 gives the order this follows.
  void layer_norm(llvm::Value* rows, llvm::Value* gamma, llvm::Value* beta, llvm::Value* y, llvm::Value* mean_out,
                  llvm::Value* rstd_out, llvm::Value* eps) {
    constexpr int kChunk = 16, kLevels = 64;
    // c[j] = 1/(j+1), rounded in the dtype
    std::vector<llvm::Constant*> cs;
    for (int j = 0; j < kChunk; ++j)
      cs.push_back(dt_ == dtype::kFloat64 ? llvm::ConstantFP::get(elem_, 1.0 / (j + 1))
                                          : llvm::ConstantFP::get(elem_, static_cast<double>(1.0f / static_cast<float>(j + 1))));
    auto* table_ty = llvm::ArrayType::get(elem_, kChunk);
    auto* table = new llvm::GlobalVariable(m_, table_ty, true, llvm::GlobalValue::PrivateLinkage,
                                           llvm::ConstantArray::get(table_ty, cs), "welford_c");
    auto* lv_vec = llvm::ArrayType::get(vec_, kLevels);
    auto* lv_int = llvm::ArrayType::get(i64_, kLevels);
    llvm::AllocaInst* m0s = slot(lv_int);
    llvm::AllocaInst* m1s = slot(lv_vec);
    llvm::AllocaInst* m2s = slot(lv_vec);
    auto lvl = [&](llvm::AllocaInst* a, llvm::Type* arr, llvm::Value* i) {
      return b_.CreateInBoundsGEP(arr, a, {c64(0), i});
    };
    // AddMomentsVec: (a0, a1, a2) into level `into`
    auto add_moments_vec = [&](llvm::Value* a0, llvm::Value* a1, llvm::Value* a2, llvm::Value* into) {
      llvm::Value* p0 = lvl(m0s, lv_int, into);
      llvm::Value* p1 = lvl(m1s, lv_vec, into);
      llvm::Value* p2 = lvl(m2s, lv_vec, into);
      llvm::Value* m0 = b_.CreateLoad(i64_, p0);
      llvm::Value* m1 = b_.CreateLoad(vec_, p1);
      llvm::Value* m2 = b_.CreateLoad(vec_, p2);
      llvm::Value* n = b_.CreateAdd(m0, a0);
      llvm::Value* cc = b_.CreateSelect(b_.CreateICmpEQ(n, c64(0)), zero(elem_),
                                        b_.CreateFDiv(b_.CreateSIToFP(a0, elem_), b_.CreateSIToFP(n, elem_)));
      llvm::Value* delta = b_.CreateFSub(a1, m1);
      llvm::Value* m2tmp = b_.CreateFAdd(m2, a2);
      llvm::Value* cd = b_.CreateFMul(splat(cc), delta);
      llvm::Value* m0d = b_.CreateFMul(delta, splat(b_.CreateSIToFP(m0, elem_)));
      b_.CreateStore(b_.CreateFAdd(m1, cd), p1);
      b_.CreateStore(fma(m0d, cd, m2tmp), p2);
      b_.CreateStore(n, p0);
    };
    auto clear = [&](llvm::Value* level) {
      b_.CreateStore(c64(0), lvl(m0s, lv_int, level));
      b_.CreateStore(zero(vec_), lvl(m1s, lv_vec, level));
      b_.CreateStore(zero(vec_), lvl(m2s, lv_vec, level));
    };
    loop(c64(0), rows, [&](llvm::Value* r) {
      llvm::Value* x = at(x_, b_.CreateMul(r, cols_));
      llvm::Value* nv = b_.CreateSDiv(cols_, c64(w_));                             // full vectors
      llvm::Value* chunks = b_.CreateSDiv(b_.CreateAdd(nv, c64(kChunk - 1)), c64(kChunk));
      llvm::Value* bits = b_.CreateSub(c64(64), b_.CreateBinaryIntrinsic(llvm::Intrinsic::ctlz,
                                                                           b_.CreateSub(chunks, c64(1)), b_.getFalse()));
      llvm::Value* depth = b_.CreateSelect(b_.CreateICmpSLE(chunks, c64(2)), c64(1), bits);
      loop(c64(0), depth, [&](llvm::Value* l) { clear(l); });
      loop(c64(0), chunks, [&](llvm::Value* i) {
        llvm::Value* first = b_.CreateMul(i, c64(kChunk));
        llvm::Value* left = b_.CreateSub(nv, first);
        llvm::Value* cnt = b_.CreateSelect(b_.CreateICmpSLT(left, c64(kChunk)), left, c64(kChunk));
        llvm::AllocaInst* u1 = slot(vec_);
        llvm::AllocaInst* u2 = slot(vec_);
        b_.CreateStore(zero(vec_), u1);
        b_.CreateStore(zero(vec_), u2);
        loop(c64(0), cnt, [&](llvm::Value* j) {
          llvm::Value* xv = load(vec_, x, b_.CreateMul(b_.CreateAdd(first, j), c64(w_)));
          llvm::Value* cj = b_.CreateLoad(elem_, b_.CreateInBoundsGEP(table_ty, table, {c64(0), j}));
          llvm::Value* a = b_.CreateLoad(vec_, u1);
          llvm::Value* d1 = b_.CreateFSub(xv, a);
          llvm::Value* a2 = fma(splat(cj), d1, a);
          llvm::Value* d2 = b_.CreateFSub(xv, a2);
          b_.CreateStore(a2, u1);
          b_.CreateStore(fma(d1, d2, b_.CreateLoad(vec_, u2)), u2);
        });
        add_moments_vec(cnt, b_.CreateLoad(vec_, u1), b_.CreateLoad(vec_, u2), c64(0));
        // carry up the stack while the chunk count's low bits are zero
        llvm::AllocaInst* mask = slot(i64_);
        llvm::AllocaInst* jv = slot(i64_);
        b_.CreateStore(b_.CreateAdd(i, c64(1)), mask);
        b_.CreateStore(c64(1), jv);
        llvm::BasicBlock *head = block("carry_head"), *body = block("carry"), *done = block("carry_done");
        b_.CreateBr(head);
        b_.SetInsertPoint(head);
        llvm::Value* j = b_.CreateLoad(i64_, jv);
        llvm::Value* go = b_.CreateAnd(b_.CreateICmpSLT(j, depth),
                                       b_.CreateICmpEQ(b_.CreateAnd(b_.CreateLoad(i64_, mask), c64(1)), c64(0)));
        b_.CreateCondBr(go, body, done);
        b_.SetInsertPoint(body);
        llvm::Value* below = b_.CreateSub(j, c64(1));
        add_moments_vec(b_.CreateLoad(i64_, lvl(m0s, lv_int, below)), b_.CreateLoad(vec_, lvl(m1s, lv_vec, below)),
                        b_.CreateLoad(vec_, lvl(m2s, lv_vec, below)), j);
        clear(below);
        b_.CreateStore(b_.CreateLShr(b_.CreateLoad(i64_, mask), c64(1)), mask);
        b_.CreateStore(b_.CreateAdd(j, c64(1)), jv);
        b_.CreateBr(head);
        b_.SetInsertPoint(done);
      });
      loop(c64(1), depth, [&](llvm::Value* l) {  // levels 1.. folded into level 0, in order
        add_moments_vec(b_.CreateLoad(i64_, lvl(m0s, lv_int, l)), b_.CreateLoad(vec_, lvl(m1s, lv_vec, l)),
                        b_.CreateLoad(vec_, lvl(m2s, lv_vec, l)), c64(0));
      });
      // scalar Welford over the tail (no fused multiply-add)
      llvm::AllocaInst* s0 = slot(i64_);
      llvm::AllocaInst* s1 = slot(elem_);
      llvm::AllocaInst* s2 = slot(elem_);
      b_.CreateStore(c64(0), s0);
      b_.CreateStore(zero(elem_), s1);
      b_.CreateStore(zero(elem_), s2);
      loop(b_.CreateMul(nv, c64(w_)), cols_, [&](llvm::Value* k) {
        llvm::Value* xk = load(elem_, x, k);
        llvm::Value* m1 = b_.CreateLoad(elem_, s1);
        llvm::Value* dl = b_.CreateFSub(xk, m1);
        llvm::Value* n = b_.CreateAdd(b_.CreateLoad(i64_, s0), c64(1));
        b_.CreateStore(n, s0);
        llvm::Value* m1n = b_.CreateFAdd(m1, b_.CreateFDiv(dl, b_.CreateSIToFP(n, elem_)));
        b_.CreateStore(m1n, s1);
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(elem_, s2), b_.CreateFMul(dl, b_.CreateFSub(xk, m1n))), s2);
      });
      // the lanes of level 0, lane 0 first (AddMoments, scalar)
      llvm::Value* v1 = b_.CreateLoad(vec_, lvl(m1s, lv_vec, c64(0)));
      llvm::Value* v2 = b_.CreateLoad(vec_, lvl(m2s, lv_vec, c64(0)));
      for (std::int64_t lane = 0; lane < w_; ++lane) {
        llvm::Value* m0 = b_.CreateLoad(i64_, s0);
        llvm::Value* n = b_.CreateAdd(m0, nv);
        llvm::Value* cc = b_.CreateSelect(b_.CreateICmpEQ(n, c64(0)), zero(elem_),
                                          b_.CreateFDiv(b_.CreateSIToFP(nv, elem_), b_.CreateSIToFP(n, elem_)));
        llvm::Value* m1 = b_.CreateLoad(elem_, s1);
        llvm::Value* dl = b_.CreateFSub(b_.CreateExtractElement(v1, static_cast<std::uint64_t>(lane)), m1);
        b_.CreateStore(fma(cc, dl, m1), s1);
        llvm::Value* ddc = b_.CreateFMul(b_.CreateFMul(dl, dl), cc);
        llvm::Value* add = fma(ddc, b_.CreateSIToFP(m0, elem_), b_.CreateExtractElement(v2, static_cast<std::uint64_t>(lane)));
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(elem_, s2), add), s2);
        b_.CreateStore(n, s0);
      }
      llvm::Value* mean = b_.CreateLoad(elem_, s1);
      llvm::Value* var = b_.CreateFDiv(b_.CreateLoad(elem_, s2), b_.CreateSIToFP(cols_, elem_));
      llvm::Value* rstd = b_.CreateFDiv(llvm::ConstantFP::get(elem_, 1.0),
                                        b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, b_.CreateFAdd(var, eps)));
      store(mean, r, mean_out);
      store(rstd, r, rstd_out);
      llvm::Value* bias = b_.CreateFNeg(mean);
      llvm::Value* yrow = at(y, b_.CreateMul(r, cols_));
      loop(c64(0), cols_, [&](llvm::Value* k) {
        llvm::Value* t = b_.CreateFMul(b_.CreateFAdd(load(elem_, x, k), bias), rstd);
        llvm::Value* out = gamma != nullptr
                               ? fma(t, load(elem_, gamma, k), load(elem_, beta, k))
                               : b_.CreateFAdd(b_.CreateFMul(t, llvm::ConstantFP::get(elem_, 1.0)), zero(elem_));
        store(out, k, yrow);
      });
    });
  }

  // Note [Generated softmax] (PointwiseProgram.h): ATen's _vec_softmax_lastdim and
  // _vec_log_softmax_lastdim, per row; misc/ATEN_ORDER.md section 4 gives the order.
  llvm::Value* lane_mask(llvm::Value* r) {  // lanes [0, r) of a vector
    std::vector<llvm::Constant*> idx;
    for (std::int64_t l = 0; l < w_; ++l) idx.push_back(b_.getInt64(static_cast<std::uint64_t>(l)));
    return b_.CreateICmpSLT(llvm::ConstantVector::get(idx), b_.CreateVectorSplat(static_cast<unsigned>(w_), r));
  }
  llvm::Value* load_part(llvm::Value* base, llvm::Value* i, llvm::Value* mask) {  // others 0 (Vec::loadu(p, r))
    llvm::Value* ptr = b_.CreateBitCast(at(base, i), vec_->getPointerTo());
    return b_.CreateMaskedLoad(vec_, ptr, llvm::Align(dt_ == dtype::kFloat64 ? 8 : 4), mask, zero(vec_));
  }
  void store_part(llvm::Value* v, llvm::Value* base, llvm::Value* i, llvm::Value* mask) {
    llvm::Value* ptr = b_.CreateBitCast(at(base, i), vec_->getPointerTo());
    b_.CreateMaskedStore(v, ptr, llvm::Align(dt_ == dtype::kFloat64 ? 8 : 4), mask);
  }
  // Vectorized<T>::maximum: a > b ? a : b, every bit set where a or b is NaN.
  llvm::Value* maximum(llvm::Value* a, llvm::Value* b) {
    llvm::Value* m = b_.CreateSelect(b_.CreateFCmpOGT(a, b), a, b);
    llvm::Type* it = a->getType()->isVectorTy()
                         ? static_cast<llvm::Type*>(llvm::FixedVectorType::get(
                               b_.getIntNTy(dt_ == dtype::kFloat64 ? 64 : 32), static_cast<unsigned>(w_)))
                         : b_.getIntNTy(dt_ == dtype::kFloat64 ? 64 : 32);
    llvm::Value* nan = b_.CreateSExt(b_.CreateFCmpUNO(a, b), it);
    return b_.CreateBitCast(b_.CreateOr(b_.CreateBitCast(m, it), nan), a->getType());
  }
  llvm::Value* math_call(const char* fn, llvm::Value* v) {
    const std::string name = std::string("crucible_v") + fn + (dt_ == dtype::kFloat64 ? "_f64" : "_f32");
    llvm::FunctionCallee callee = m_.getOrInsertFunction(name, llvm::FunctionType::get(vec_, {vec_}, false));
    if (auto* f = llvm::dyn_cast<llvm::Function>(callee.getCallee())) {
      f->addFnAttr("min-legal-vector-width", std::to_string(p_.vec_bytes * 8));
      f->addFnAttr(llvm::Attribute::NoUnwind);
    }
    return b_.CreateCall(callee, {v});
  }
  // vec::map_reduce_all(map, op, row[0, n)) (vec::reduce_all when map is the identity).
  using VecOp = std::function<llvm::Value*(llvm::Value*, llvm::Value*)>;
  using VecMap = std::function<llvm::Value*(llvm::Value*)>;
  llvm::Value* reduce_all(llvm::Value* row, llvm::Value* n, const VecMap& map, const VecOp& op) {
    llvm::AllocaInst* res = slot(elem_);
    llvm::BasicBlock *shortb = block("short_row"), *longb = block("long_row"), *done = block("reduced");
    b_.CreateCondBr(b_.CreateICmpSLT(n, c64(w_)), shortb, longb);
    b_.SetInsertPoint(shortb);  // vec_reduce_all(op, map(loadu(row, n)), n): lane 0, in order
    {
      llvm::Value* v = map(load_part(row, c64(0), lane_mask(n)));
      llvm::AllocaInst* acc = slot(elem_);
      b_.CreateStore(b_.CreateExtractElement(v, std::uint64_t{0}), acc);
      loop(c64(1), n, [&](llvm::Value* i) {
        b_.CreateStore(op(b_.CreateLoad(elem_, acc), b_.CreateExtractElement(v, i)), acc);
      });
      b_.CreateStore(b_.CreateLoad(elem_, acc), res);
      b_.CreateBr(done);
    }
    b_.SetInsertPoint(longb);
    {
      llvm::AllocaInst* acc = slot(vec_);
      b_.CreateStore(map(load(vec_, row, c64(0))), acc);
      llvm::Value* whole = b_.CreateSub(n, b_.CreateSRem(n, c64(w_)));
      loop(c64(w_), whole, [&](llvm::Value* d) {
        b_.CreateStore(op(b_.CreateLoad(vec_, acc), map(load(vec_, row, d))), acc);
      }, c64(w_));
      llvm::Value* r = b_.CreateSub(n, whole);
      llvm::Value* mask = lane_mask(r);
      llvm::Value* a = b_.CreateLoad(vec_, acc);
      llvm::Value* t = op(a, map(load_part(row, whole, mask)));  // no lane when r == 0
      a = b_.CreateSelect(mask, t, a);
      b_.CreateStore(fold_lanes(a, op), res);
      b_.CreateBr(done);
    }
    b_.SetInsertPoint(done);
    return b_.CreateLoad(elem_, res);
  }
  // vec_reduce_all(op, acc): float32's lanes by VecReduceAllSIMD's tree (partners i^(W/2), ...,
  // i^1), float64's in order.
  llvm::Value* fold_lanes(llvm::Value* a, const VecOp& op) {
    if (dt_ == dtype::kFloat32) {
      for (std::int64_t sh = w_ / 2; sh >= 1; sh /= 2) {
        std::vector<int> perm;
        for (std::int64_t l = 0; l < w_; ++l) perm.push_back(static_cast<int>(l ^ sh));
        a = op(a, b_.CreateShuffleVector(a, perm));
      }
      return b_.CreateExtractElement(a, std::uint64_t{0});
    }
    llvm::Value* out = b_.CreateExtractElement(a, std::uint64_t{0});
    for (std::int64_t l = 1; l < w_; ++l) out = op(out, b_.CreateExtractElement(a, static_cast<std::uint64_t>(l)));
    return out;
  }
  // y[j] = f(x[j]) over the row (vec::map): map2_row with one input.
  void map_row(llvm::Value* x, llvm::Value* y, const VecMap& f) {
    map2_row(x, nullptr, y, [&](llvm::Value* v, llvm::Value*) { return f(v); });
  }
  // Note [Generated nll_loss] (PointwiseProgram.h). rows = N; params: C, ignore_index, the
  // out-of-range flag this writes.
  void nll_loss(llvm::Value* n, llvm::Value* params) {
    const bool fwd = p_.reduce == ReduceKind::NllLoss;
    auto* bytes_ptr = llvm::Type::getInt8Ty(ctx_)->getPointerTo();
    llvm::Value* ptrs = fn_->getArg(0);
    auto operand = [&](std::uint64_t k, llvm::Type* t) {
      return b_.CreateBitCast(b_.CreateLoad(bytes_ptr, b_.CreateConstInBoundsGEP1_64(bytes_ptr, ptrs, k)),
                              t->getPointerTo());
    };
    llvm::Value* target = operand(1, i64_);
    llvm::Value* ignore = b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 1));
    auto tgt = [&](llvm::Value* b) {
      return b_.CreateAlignedLoad(i64_, b_.CreateInBoundsGEP(i64_, target, b), llvm::MaybeAlign(8));
    };
    // every target in [0, C) or ignore_index, else the flag and nothing written
    llvm::BasicBlock *bad = block("bad_target"), *checked = block("targets_checked");
    loop(c64(0), n, [&](llvm::Value* b) {
      llvm::Value* t = tgt(b);
      llvm::Value* out = b_.CreateAnd(b_.CreateICmpNE(t, ignore),
                                      b_.CreateOr(b_.CreateICmpSLT(t, c64(0)), b_.CreateICmpSGE(t, cols_)));
      llvm::BasicBlock* ok = block("target_ok");
      b_.CreateCondBr(out, bad, ok);
      b_.SetInsertPoint(ok);
    });
    b_.CreateBr(checked);
    b_.SetInsertPoint(bad);
    b_.CreateStore(c64(1), b_.CreateConstInBoundsGEP1_64(i64_, params, 2));
    b_.CreateRetVoid();
    b_.SetInsertPoint(checked);
    if (!fwd) {  // grad_input = 0, then g at each kept row's target
      llvm::Value* go = load(elem_, x_, c64(0));
      llvm::Value* tw = load(elem_, operand(2, elem_), c64(0));
      llvm::Value* g = b_.CreateFNeg(p_.mean ? b_.CreateFDiv(go, tw) : go);
      llvm::Value* gi = operand(3, elem_);
      loop(c64(0), b_.CreateMul(n, cols_), [&](llvm::Value* i) { store(zero(elem_), i, gi); });
      loop(c64(0), n, [&](llvm::Value* b) {
        llvm::Value* t = tgt(b);
        llvm::BasicBlock *kept = block("kept"), *next = block("next_row");
        b_.CreateCondBr(b_.CreateICmpNE(t, ignore), kept, next);
        b_.SetInsertPoint(kept);
        store(g, b_.CreateAdd(b_.CreateMul(b, cols_), t), gi);
        b_.CreateBr(next);
        b_.SetInsertPoint(next);
      });
      return;
    }
    constexpr int kLevels = 8;
    std::array<llvm::AllocaInst*, kLevels> lv{};
    for (auto& l : lv) {
      l = slot(elem_);
      b_.CreateStore(zero(elem_), l);
    }
    llvm::AllocaInst* ignored = slot(i64_);
    b_.CreateStore(c64(0), ignored);
    // level_power = max(4, CeilLog2(N) / 8)
    llvm::Value* bits = b_.CreateSub(c64(64), b_.CreateBinaryIntrinsic(llvm::Intrinsic::ctlz, b_.CreateSub(n, c64(1)),
                                                                         b_.getFalse()));
    llvm::Value* cl = b_.CreateSelect(b_.CreateICmpSLE(n, c64(2)), c64(1), bits);
    llvm::Value* q = b_.CreateUDiv(cl, c64(kLevels));
    llvm::Value* power = b_.CreateSelect(b_.CreateICmpUGT(q, c64(4)), q, c64(4));
    llvm::Value* mask = b_.CreateSub(b_.CreateShl(c64(1), power), c64(1));
    loop(c64(0), n, [&](llvm::Value* b) {
      llvm::Value* t = tgt(b);
      llvm::BasicBlock *skip = block("ignored_row"), *kept = block("kept_row"), *next = block("row_done");
      b_.CreateCondBr(b_.CreateICmpEQ(t, ignore), skip, kept);
      b_.SetInsertPoint(skip);
      b_.CreateStore(b_.CreateAdd(b_.CreateLoad(i64_, ignored), c64(1)), ignored);
      b_.CreateBr(next);
      b_.SetInsertPoint(kept);
      llvm::Value* xv = load(elem_, x_, b_.CreateAdd(b_.CreateMul(b, cols_), t));
      b_.CreateStore(b_.CreateFSub(b_.CreateLoad(elem_, lv[0]), xv), lv[0]);
      for (int j = 0; j + 1 < kLevels; ++j) {  // carry while b's bits under level j's mask are 0
        llvm::Value* m = b_.CreateShl(mask, b_.CreateMul(power, c64(j)));
        llvm::BasicBlock* carry = block("carry");
        b_.CreateCondBr(b_.CreateICmpNE(b_.CreateAnd(b, m), c64(0)), next, carry);
        b_.SetInsertPoint(carry);
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(elem_, lv[static_cast<std::size_t>(j + 1)]),
                                     b_.CreateLoad(elem_, lv[static_cast<std::size_t>(j)])),
                       lv[static_cast<std::size_t>(j + 1)]);
        b_.CreateStore(zero(elem_), lv[static_cast<std::size_t>(j)]);
      }
      b_.CreateBr(next);
      b_.SetInsertPoint(next);
    });
    llvm::Value* tw = b_.CreateSIToFP(b_.CreateSub(n, b_.CreateLoad(i64_, ignored)), elem_);
    llvm::Value* out = zero(elem_);
    for (auto* l : lv) out = b_.CreateFAdd(out, b_.CreateLoad(elem_, l));
    if (p_.mean) out = b_.CreateFDiv(out, tw);
    store(out, c64(0), operand(2, elem_));
    store(tw, c64(0), operand(3, elem_));
  }

  // Note [Generated batch norm] (PointwiseProgram.h): ATen's batch_norm_cpu_collect_stats,
  // its generic update of the statistics and batch_norm_cpu_contiguous_impl, and
  // batch_norm_cpu_backward_contiguous_impl, per channel; misc/ATEN_ORDER.md section 7 gives
  // the order. rows: this part's channels; params: plane, eps, momentum, images, channels.
  using Operand = std::function<llvm::Value*(std::uint64_t)>;
  llvm::Value* f64_param(llvm::Value* params, std::uint64_t k) {
    auto* d = llvm::Type::getDoubleTy(ctx_);
    return b_.CreateLoad(
        d, b_.CreateBitCast(b_.CreateConstInBoundsGEP1_64(i64_, params, k), d->getPointerTo()));
  }
  llvm::Value* widen(llvm::Value* v) {  // to double (accscalar_t)
    return v->getType()->isDoubleTy() ? v : b_.CreateFPExt(v, llvm::Type::getDoubleTy(ctx_));
  }
  llvm::Value* narrow(llvm::Value* v) {
    return v->getType() == elem_ ? v : b_.CreateFPTrunc(v, elem_);
  }
  // body(plane) over each image's plane of channel c: `plane` the element index of its first
  llvm::Value* image_stride_ = nullptr;
  llvm::Value* images_ = nullptr;
  void planes(llvm::Value* c, const std::function<void(llvm::Value*)>& body) {
    loop(c64(0), images_, [&](llvm::Value* n) {
      body(b_.CreateAdd(b_.CreateMul(n, image_stride_), b_.CreateMul(c, cols_)));
    });
  }
  void batch_norm(llvm::Value* rows, llvm::Value* params, const Operand& operand) {
    llvm::Type* f64 = llvm::Type::getDoubleTy(ctx_);
    std::uint64_t o = 1;
    llvm::Value* weight = p_.affine ? operand(o++) : nullptr;
    llvm::Value* bias = p_.affine ? operand(o++) : nullptr;
    llvm::Value* rmean = p_.running ? operand(o++) : nullptr;
    llvm::Value* rvar = p_.running ? operand(o++) : nullptr;
    llvm::Value* y = operand(o++);
    llvm::Value* mean_out = operand(o++);
    llvm::Value* invstd_out = operand(o++);
    llvm::Value* eps = f64_param(params, 1);
    llvm::Value* momentum = f64_param(params, 2);
    images_ = b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 3));
    image_stride_ =
        b_.CreateMul(b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 4)), cols_);
    llvm::Value* count = b_.CreateMul(images_, cols_);
    loop(c64(0), rows, [&](llvm::Value* c) {
      // sum in double over n, then i
      llvm::AllocaInst* acc = slot(f64);
      b_.CreateStore(zero(f64), acc);
      planes(c, [&](llvm::Value* pl) {
        loop(c64(0), cols_, [&](llvm::Value* i) {
          b_.CreateStore(
              b_.CreateFAdd(b_.CreateLoad(f64, acc), widen(load(elem_, x_, b_.CreateAdd(pl, i)))),
              acc);
        });
      });
      llvm::Value* mean =
          narrow(b_.CreateFDiv(b_.CreateLoad(f64, acc), b_.CreateSIToFP(count, f64)));
      // squared deviations in double: float32's square rounded in float; float64's plain but
      // for an odd plane's last element, fused (GCC vectorised ATen's loop by two)
      b_.CreateStore(zero(f64), acc);
      auto square_into = [&](llvm::Value* pl, llvm::Value* i, bool fused) {
        llvm::Value* d = b_.CreateFSub(load(elem_, x_, b_.CreateAdd(pl, i)), mean);
        llvm::Value* a = b_.CreateLoad(f64, acc);
        b_.CreateStore(fused ? fma(d, d, a) : b_.CreateFAdd(a, widen(b_.CreateFMul(d, d))), acc);
      };
      planes(c, [&](llvm::Value* pl) {
        if (dt_ == dtype::kFloat32) {
          loop(c64(0), cols_, [&](llvm::Value* i) { square_into(pl, i, false); });
          return;
        }
        llvm::Value* even = b_.CreateSub(cols_, b_.CreateSRem(cols_, c64(2)));
        loop(c64(0), even, [&](llvm::Value* i) { square_into(pl, i, false); });
        loop(even, cols_, [&](llvm::Value* i) { square_into(pl, i, true); });
      });
      llvm::Value* var_sum = narrow(b_.CreateLoad(f64, acc));
      llvm::Value* var = b_.CreateFDiv(var_sum, b_.CreateSIToFP(count, elem_));
      // InvStd: 0 when var and eps are both 0
      llvm::Value* inv = narrow(b_.CreateFDiv(
          llvm::ConstantFP::get(f64, 1.0),
          b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, b_.CreateFAdd(widen(var), eps))));
      llvm::Value* both_zero =
          b_.CreateAnd(b_.CreateFCmpOEQ(var, zero(elem_)), b_.CreateFCmpOEQ(eps, zero(f64)));
      inv = b_.CreateSelect(both_zero, zero(elem_), inv);
      store(mean, c, mean_out);
      store(inv, c, invstd_out);
      if (p_.running) {  // Normalization.cpp (no fma): running_mean in T, running_var's sum in
                         // double
        llvm::Value* m = narrow(momentum);
        llvm::Value* one_m = b_.CreateFSub(llvm::ConstantFP::get(elem_, 1.0), m);
        store(b_.CreateFAdd(b_.CreateFMul(m, mean), b_.CreateFMul(one_m, load(elem_, rmean, c))), c,
              rmean);
        llvm::Value* unbiased =
            b_.CreateFDiv(var_sum, b_.CreateSIToFP(b_.CreateSub(count, c64(1)), elem_));
        llvm::Value* rv = b_.CreateFAdd(b_.CreateFMul(widen(m), widen(unbiased)),
                                        widen(b_.CreateFMul(one_m, load(elem_, rvar, c))));
        store(narrow(rv), c, rvar);
      }
      // alpha = invstd * weight, beta = fma(-mean, alpha, bias), y = fma(x, alpha, beta)
      llvm::Value* alpha = weight != nullptr ? b_.CreateFMul(inv, load(elem_, weight, c)) : inv;
      llvm::Value* beta =
          fma(b_.CreateFNeg(mean), alpha, bias != nullptr ? load(elem_, bias, c) : zero(elem_));
      planes(c, [&](llvm::Value* pl) {
        llvm::Value* xp = at(x_, pl);
        llvm::Value* yp = at(y, pl);
        loop(c64(0), cols_,
             [&](llvm::Value* i) { store(fma(load(elem_, xp, i), alpha, beta), i, yp); });
      });
    });
  }
  // vec::map2_reduce_all((x - mean) * dy, +) over a plane: the first vector a product, whole
  // vectors acc + q*dy unfused, the masked tail's step fused (ATen's compiled code), the lanes
  // folded by vec_reduce_all; a plane shorter than a vector: its products added in order.
  llvm::Value* centered_dot(llvm::Value* xr, llvm::Value* gr, llvm::Value* mv) {
    return lane_sum(
        [&](llvm::Value* d, llvm::Value* mask) {
          return b_.CreateFMul(b_.CreateFSub(load_vec(xr, d, mask), mv), load_vec(gr, d, mask));
        },
        [&](llvm::Value* acc, llvm::Value* d, llvm::Value* mask) {
          return fma(b_.CreateFSub(load_vec(xr, d, mask), mv), load_vec(gr, d, mask), acc);
        });
  }
  void batch_norm_backward(llvm::Value* rows, llvm::Value* params, const Operand& operand) {
    llvm::Type* f64 = llvm::Type::getDoubleTy(ctx_);
    std::uint64_t o = 1;
    llvm::Value* xin = operand(o++);
    llvm::Value* weight = p_.affine ? operand(o++) : nullptr;
    llvm::Value* save_mean = operand(o++);
    llvm::Value* save_invstd = operand(o++);
    llvm::Value* gi = (p_.outputs & 1) != 0 ? operand(o++) : nullptr;
    llvm::Value* gw = (p_.outputs & 2) != 0 ? operand(o++) : nullptr;
    llvm::Value* gb = (p_.outputs & 4) != 0 ? operand(o++) : nullptr;
    images_ = b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 3));
    image_stride_ =
        b_.CreateMul(b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 4)), cols_);
    llvm::Value* count = b_.CreateMul(images_, cols_);
    auto id = [](llvm::Value* v) { return v; };
    auto add_op = [&](llvm::Value* a, llvm::Value* b) { return b_.CreateFAdd(a, b); };
    loop(c64(0), rows, [&](llvm::Value* c) {
      llvm::Value* mean = load(elem_, save_mean, c);
      llvm::Value* inv = load(elem_, save_invstd, c);
      llvm::Value* mv = splat(mean);
      llvm::AllocaInst* sum = slot(f64);
      llvm::AllocaInst* dotp = slot(f64);
      b_.CreateStore(zero(f64), sum);
      b_.CreateStore(zero(f64), dotp);
      planes(c, [&](llvm::Value* pl) {
        llvm::Value* gr = at(x_, pl);
        llvm::Value* xr = at(xin, pl);
        b_.CreateStore(
            b_.CreateFAdd(b_.CreateLoad(f64, sum), widen(reduce_all(gr, cols_, id, add_op))), sum);
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(f64, dotp), widen(centered_dot(xr, gr, mv))),
                       dotp);
      });
      llvm::Value* s = b_.CreateLoad(f64, sum);
      llvm::Value* dp = b_.CreateLoad(f64, dotp);
      if (gi != nullptr) {
        llvm::Value* k = b_.CreateFDiv(b_.CreateFMul(b_.CreateFMul(narrow(dp), inv), inv),
                                       b_.CreateSIToFP(count, elem_));
        llvm::Value* grad_mean = narrow(b_.CreateFDiv(s, b_.CreateSIToFP(count, f64)));
        llvm::Value* w = weight != nullptr ? load(elem_, weight, c) : nullptr;
        planes(c, [&](llvm::Value* pl) {
          llvm::Value* gr = at(x_, pl);
          llvm::Value* xr = at(xin, pl);
          llvm::Value* out = at(gi, pl);
          loop(c64(0), cols_, [&](llvm::Value* i) {
            llvm::Value* xm = b_.CreateFSub(load(elem_, xr, i), mean);
            llvm::Value* t =
                fma(b_.CreateFNeg(xm), k, b_.CreateFSub(load(elem_, gr, i), grad_mean));
            llvm::Value* g = b_.CreateFMul(t, inv);
            store(w != nullptr ? b_.CreateFMul(g, w) : g, i, out);
          });
        });
      }
      if (gw != nullptr) store(narrow(b_.CreateFMul(dp, widen(inv))), c, gw);
      if (gb != nullptr) store(narrow(s), c, gb);
    });
  }

  // Note [Generated max and argmax] (PointwiseProgram.h): ATen's compare loop per result. rows:
  // the dims before the reduced one; params: the reduced size, the elements after it.
  void arg_extreme(llvm::Value* rows, llvm::Value* params, const Operand& operand) {
    const bool with_values = p_.operands.size() == 3;
    llvm::Value* values = with_values ? operand(1) : nullptr;
    llvm::Value* indices = b_.CreateBitCast(operand(with_values ? 2 : 1), i64_->getPointerTo());
    llvm::Value* inner = b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 1));
    llvm::Value* slab = b_.CreateMul(cols_, inner);
    loop(c64(0), rows, [&](llvm::Value* o) {
      loop(c64(0), inner, [&](llvm::Value* i) {
        llvm::Value* base = b_.CreateAdd(b_.CreateMul(o, slab), i);
        llvm::AllocaInst* best = slot(elem_);
        llvm::AllocaInst* at_j = slot(i64_);
        llvm::AllocaInst* j = slot(i64_);
        llvm::Value* first = load(elem_, x_, base);
        b_.CreateStore(first, best);
        b_.CreateStore(c64(0), at_j);
        // a NaN first element is the result; else compare from the second on
        b_.CreateStore(b_.CreateSelect(b_.CreateFCmpUNO(first, first), cols_, c64(1)), j);
        llvm::BasicBlock *head = block("compare_head"), *body = block("compare"),
                         *done = block("compared");
        b_.CreateBr(head);
        b_.SetInsertPoint(head);
        llvm::Value* jv = b_.CreateLoad(i64_, j);
        b_.CreateCondBr(b_.CreateICmpSLT(jv, cols_), body, done);
        b_.SetInsertPoint(body);
        llvm::Value* v = load(elem_, x_, b_.CreateAdd(base, b_.CreateMul(jv, inner)));
        llvm::Value* b = b_.CreateLoad(elem_, best);
        // !(v <= best) (max) or !(v >= best) (min): unordered or strictly beyond
        llvm::Value* take = p_.smallest ? b_.CreateFCmpULT(v, b) : b_.CreateFCmpUGT(v, b);
        b_.CreateStore(b_.CreateSelect(take, v, b), best);
        b_.CreateStore(b_.CreateSelect(take, jv, b_.CreateLoad(i64_, at_j)), at_j);
        // stop at a NaN
        b_.CreateStore(b_.CreateSelect(b_.CreateFCmpUNO(v, v), cols_, b_.CreateAdd(jv, c64(1))), j);
        b_.CreateBr(head);
        b_.SetInsertPoint(done);
        llvm::Value* out = b_.CreateAdd(b_.CreateMul(o, inner), i);
        if (values != nullptr) store(b_.CreateLoad(elem_, best), out, values);
        b_.CreateAlignedStore(b_.CreateLoad(i64_, at_j), b_.CreateInBoundsGEP(i64_, indices, out),
                              llvm::MaybeAlign(8));
      });
    });
  }

  // Note [Generated var and std] (PointwiseProgram.h): ATen's WelfordOps per result, in double,
  // no fma. rows: the kept dims before the reduced block; params: the reduced element count,
  // the correction, the elements after the block.
  void variance(llvm::Value* rows, llvm::Value* params, const Operand& operand) {
    llvm::Type* f64 = llvm::Type::getDoubleTy(ctx_);
    llvm::Value* result = operand(1);
    llvm::Value* mean_out = p_.operands.size() == 3 ? operand(2) : nullptr;
    llvm::Value* correction =
        p_.int_param ? b_.CreateSIToFP(
                           b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 1)), f64)
                     : f64_param(params, 1);
    llvm::Value* inner = b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 2));
    llvm::Value* slab = b_.CreateMul(cols_, inner);
    llvm::Value* zero = llvm::ConstantFP::get(f64, 0.0);
    auto divided = [&](llvm::Value* m2) {  // m2 / max(0, n - correction), std's square root
      llvm::Value* nf = b_.CreateSIToFP(cols_, f64);
      llvm::Value* divisor =
          b_.CreateSelect(b_.CreateFCmpOGT(nf, correction), b_.CreateFSub(nf, correction), zero);
      llvm::Value* var = b_.CreateFDiv(m2, divisor);
      return p_.root ? b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, var) : var;
    };
    if (p_.two_pass) {  // one result: torch.mean's value, then the squares about it in double
      llvm::Value* sum = row_total(c64(0));
      llvm::Value* mean = widen(
          b_.CreateFDiv(b_.CreateFAdd(this->zero(elem_), sum), b_.CreateSIToFP(cols_, elem_)));
      llvm::AllocaInst* m2 = slot(f64);
      b_.CreateStore(zero, m2);
      loop(c64(0), cols_, [&](llvm::Value* j) {
        llvm::Value* dx = b_.CreateFSub(widen(load(elem_, x_, j)), mean);
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(f64, m2), b_.CreateFMul(dx, dx)), m2);
      });
      store(narrow(divided(b_.CreateLoad(f64, m2))), c64(0), result);
      return;
    }
    loop(c64(0), rows, [&](llvm::Value* o) {
      loop(c64(0), inner, [&](llvm::Value* i) {
        llvm::Value* base = b_.CreateAdd(b_.CreateMul(o, slab), i);
        llvm::AllocaInst* mean = slot(f64);
        llvm::AllocaInst* m2 = slot(f64);
        b_.CreateStore(zero, mean);
        b_.CreateStore(zero, m2);
        loop(c64(0), cols_, [&](llvm::Value* j) {
          llvm::Value* x = widen(load(elem_, x_, b_.CreateAdd(base, b_.CreateMul(j, inner))));
          llvm::Value* nf = b_.CreateSIToFP(b_.CreateAdd(j, c64(1)), f64);
          llvm::Value* delta = b_.CreateFSub(x, b_.CreateLoad(f64, mean));
          llvm::Value* m = b_.CreateFAdd(b_.CreateLoad(f64, mean), b_.CreateFDiv(delta, nf));
          b_.CreateStore(m, mean);
          b_.CreateStore(
              b_.CreateFAdd(b_.CreateLoad(f64, m2), b_.CreateFMul(delta, b_.CreateFSub(x, m))), m2);
        });
        llvm::Value* out = b_.CreateAdd(b_.CreateMul(o, inner), i);
        store(narrow(divided(b_.CreateLoad(f64, m2))), out, result);
        if (mean_out != nullptr) store(narrow(b_.CreateLoad(f64, mean)), out, mean_out);
      });
    });
  }

  // vec::map*_reduce_all(+) as ATen's compiled code runs it over a row of N (cols_) elements:
  // `part(d, mask)` the vector of terms at element d (mask: lanes [0, N % W), the rest 0); the
  // first vector as is, the other full vectors added unfused, `tail(acc, d, mask)` the
  // accumulator after the N % W tail (where ATen's compiler fused, it is an fma), the lanes
  // folded (fold_lanes); under W elements the terms added in order from element 0. Layer norm
  // backward's ds and db, batch norm backward's centered dot, softmax backward's sum.
  using Terms = std::function<llvm::Value*(llvm::Value* d, llvm::Value* mask)>;
  llvm::Value* load_vec(llvm::Value* row, llvm::Value* d, llvm::Value* mask) {  // mask: a part
    return mask != nullptr ? load_part(row, d, mask) : load(vec_, row, d);
  }
  using Tail = std::function<llvm::Value*(llvm::Value* acc, llvm::Value* d, llvm::Value* mask)>;
  llvm::Value* lane_sum(const Terms& part, const Tail& tail) {
    llvm::AllocaInst* res = slot(elem_);
    llvm::BasicBlock *shortb = block("short_row"), *longb = block("long_row"),
                     *done = block("summed");
    b_.CreateCondBr(b_.CreateICmpSLT(cols_, c64(w_)), shortb, longb);
    b_.SetInsertPoint(shortb);  // the terms added in order from element 0
    {
      llvm::Value* v = part(c64(0), lane_mask(cols_));
      llvm::AllocaInst* acc = slot(elem_);
      b_.CreateStore(b_.CreateExtractElement(v, std::uint64_t{0}), acc);
      loop(c64(1), cols_, [&](llvm::Value* i) {
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(elem_, acc), b_.CreateExtractElement(v, i)),
                       acc);
      });
      b_.CreateStore(b_.CreateLoad(elem_, acc), res);
      b_.CreateBr(done);
    }
    b_.SetInsertPoint(longb);
    {
      llvm::AllocaInst* acc = slot(vec_);
      b_.CreateStore(part(c64(0), nullptr), acc);
      llvm::Value* whole = b_.CreateSub(cols_, b_.CreateSRem(cols_, c64(w_)));
      loop(
          c64(w_), whole,
          [&](llvm::Value* d) {
            b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(vec_, acc), part(d, nullptr)), acc);
          },
          c64(w_));
      llvm::Value* mask = lane_mask(b_.CreateSub(cols_, whole));
      llvm::Value* a = b_.CreateLoad(vec_, acc);
      a = b_.CreateSelect(mask, tail(a, whole, mask), a);  // no lane when N % W == 0
      b_.CreateStore(
          fold_lanes(a, [&](llvm::Value* x, llvm::Value* y) { return b_.CreateFAdd(x, y); }), res);
      b_.CreateBr(done);
    }
    b_.SetInsertPoint(done);
    return b_.CreateLoad(elem_, res);
  }
  // operands: grad_out (x_), input, mean, rstd, [weight], the results, then a part buffer of N
  // per grad_weight and grad_bias; params: N, the mode (0 rows, 1 fold), the parts to fold.
  void layer_norm_backward(llvm::Value* rows, llvm::Value* params, const Operand& operand) {
    std::uint64_t o = 1;
    llvm::Value* xin = operand(o++);
    llvm::Value* mean = operand(o++);
    llvm::Value* rstd = operand(o++);
    llvm::Value* gamma = p_.affine ? operand(o++) : nullptr;
    llvm::Value* dx = (p_.outputs & 1) != 0 ? operand(o++) : nullptr;
    llvm::Value* dgamma = (p_.outputs & 2) != 0 ? operand(o++) : nullptr;
    llvm::Value* dbeta = (p_.outputs & 4) != 0 ? operand(o++) : nullptr;
    llvm::Value* gbuf = dgamma != nullptr ? operand(o++) : nullptr;
    llvm::Value* bbuf = dbeta != nullptr ? operand(o++) : nullptr;
    llvm::Value* mode = b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 1));
    llvm::BasicBlock *foldb = block("fold"), *rowsb = block("rows"), *done = block("done_all");
    b_.CreateCondBr(b_.CreateICmpNE(mode, c64(0)), foldb, rowsb);
    b_.SetInsertPoint(foldb);  // result[j] = ((+0 + part 0) + part 1) + ...
    {
      llvm::Value* parts = b_.CreateLoad(i64_, b_.CreateConstInBoundsGEP1_64(i64_, params, 2));
      for (const auto& fold : {std::pair{dgamma, gbuf}, std::pair{dbeta, bbuf}}) {
        llvm::Value *res = fold.first, *buf = fold.second;  // named: a lambda below captures them
        if (res == nullptr) continue;
        loop(c64(0), cols_, [&](llvm::Value* j) {
          llvm::AllocaInst* acc = slot(elem_);
          b_.CreateStore(zero(elem_), acc);
          loop(c64(0), parts, [&](llvm::Value* t) {
            llvm::Value* v = load(elem_, buf, b_.CreateAdd(b_.CreateMul(t, cols_), j));
            b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(elem_, acc), v), acc);
          });
          store(b_.CreateLoad(elem_, acc), j, res);
        });
      }
      b_.CreateBr(done);
    }
    b_.SetInsertPoint(rowsb);
    for (llvm::Value* buf : {gbuf, bbuf})
      if (buf != nullptr) loop(c64(0), cols_, [&](llvm::Value* j) { store(zero(elem_), j, buf); });
    llvm::Value* scale =
        b_.CreateFDiv(llvm::ConstantFP::get(elem_, 1.0), b_.CreateSIToFP(cols_, elem_));
    loop(c64(0), rows, [&](llvm::Value* r) {
      llvm::Value* base = b_.CreateMul(r, cols_);
      llvm::Value* dyr = at(x_, base);
      llvm::Value* xr = at(xin, base);
      llvm::Value* a = load(elem_, rstd, r);
      llvm::Value* m = load(elem_, mean, r);
      if (dx != nullptr) {
        // ds = sum(dy*x[*g]), its tail fma(dy*x, g, acc) or fma(x, dy, acc); db = sum(dy[*g]),
        // its tail fma(dy, g, acc) or acc + dy
        llvm::Value* ds = lane_sum(
            [&](llvm::Value* d, llvm::Value* mask) {
              llvm::Value* t = b_.CreateFMul(load_vec(dyr, d, mask), load_vec(xr, d, mask));
              return gamma != nullptr ? b_.CreateFMul(t, load_vec(gamma, d, mask)) : t;
            },
            [&](llvm::Value* acc, llvm::Value* d, llvm::Value* mask) {
              llvm::Value *dyv = load_vec(dyr, d, mask), *xv = load_vec(xr, d, mask);
              return gamma != nullptr ? fma(b_.CreateFMul(dyv, xv), load_vec(gamma, d, mask), acc)
                                      : fma(xv, dyv, acc);
            });
        llvm::Value* db = lane_sum(
            [&](llvm::Value* d, llvm::Value* mask) {
              llvm::Value* dyv = load_vec(dyr, d, mask);
              return gamma != nullptr ? b_.CreateFMul(dyv, load_vec(gamma, d, mask)) : dyv;
            },
            [&](llvm::Value* acc, llvm::Value* d, llvm::Value* mask) {
              llvm::Value* dyv = load_vec(dyr, d, mask);
              return gamma != nullptr ? fma(dyv, load_vec(gamma, d, mask), acc)
                                      : b_.CreateFAdd(acc, dyv);
            });
        llvm::Value* t1 = fma(db, m, b_.CreateFNeg(ds));
        llvm::Value* bc =
            b_.CreateFMul(b_.CreateFMul(b_.CreateFMul(b_.CreateFMul(t1, a), a), a), scale);
        llvm::Value* q = b_.CreateFMul(b_.CreateFMul(db, a), scale);
        llvm::Value* c = fma(b_.CreateFNeg(bc), m, b_.CreateFNeg(q));
        llvm::Value* dxr = at(dx, base);
        loop(c64(0), cols_, [&](llvm::Value* j) {
          llvm::Value* u = b_.CreateFMul(a, load(elem_, dyr, j));
          if (gamma != nullptr) u = b_.CreateFMul(u, load(elem_, gamma, j));
          store(b_.CreateFAdd(fma(bc, load(elem_, xr, j), u), c), j, dxr);
        });
      }
      if (gbuf != nullptr) {  // dgamma += dy (a x - a m), both roundings fused
        llvm::Value* bb = b_.CreateFMul(b_.CreateFNeg(a), m);
        loop(c64(0), cols_, [&](llvm::Value* j) {
          llvm::Value* nx = fma(a, load(elem_, xr, j), bb);
          store(fma(load(elem_, dyr, j), nx, load(elem_, gbuf, j)), j, gbuf);
        });
      }
      if (bbuf != nullptr)
        loop(c64(0), cols_, [&](llvm::Value* j) {
          store(b_.CreateFAdd(load(elem_, bbuf, j), load(elem_, dyr, j)), j, bbuf);
        });
    });
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  // _softmax_backward_data / _log_softmax_backward_data: x_ the grad, `o` the forward's output,
  // `gi` the result.
  void softmax_backward_rows(llvm::Value* rows, llvm::Value* o, llvm::Value* gi, llvm::Value* tail_fused) {
    const bool log = p_.reduce == ReduceKind::LogSoftmaxBwd;
    auto add_op = [&](llvm::Value* a, llvm::Value* b) { return b_.CreateFAdd(a, b); };
    loop(c64(0), rows, [&](llvm::Value* r) {
      llvm::Value* g = at(x_, b_.CreateMul(r, cols_));
      llvm::Value* y = at(o, b_.CreateMul(r, cols_));
      llvm::Value* res = at(gi, b_.CreateMul(r, cols_));
      if (log) {  // s = reduce_all(+, g); gi = fma(-exp(y), s, g)
        llvm::Value* sv = splat(reduce_all(g, cols_, [](llvm::Value* v) { return v; }, add_op));
        map2_row(g, y, res, [&](llvm::Value* gv, llvm::Value* yv) {
          return fma(b_.CreateFNeg(math_call("exp", yv)), sv, gv);
        });
        return;
      }
      // s = map2_reduce_all(g * y, +)
      llvm::Value* s = lane_sum(
          [&](llvm::Value* d, llvm::Value* mask) {
            return b_.CreateFMul(load_vec(g, d, mask), load_vec(y, d, mask));
          },
          [&](llvm::Value* acc, llvm::Value* d, llvm::Value* mask) {
            llvm::Value *gt = load_vec(g, d, mask), *yt = load_vec(y, d, mask);
            llvm::Value* unfused = b_.CreateFAdd(acc, b_.CreateFMul(gt, yt));
            return dt_ == dtype::kFloat32 ? b_.CreateSelect(tail_fused, fma(gt, yt, acc), unfused)
                                          : unfused;
          });
      llvm::Value* sv = splat(s);
      map2_row(g, y, res, [&](llvm::Value* gv, llvm::Value* yv) { return b_.CreateFMul(b_.CreateFSub(gv, sv), yv); });
    });
  }
  // res[j] = f(a[j], b[j]) over the row by vectors, the tail a part of one (vec::map2; bb null:
  // f's second argument is null, vec::map).
  void map2_row(llvm::Value* a, llvm::Value* bb, llvm::Value* res, const std::function<llvm::Value*(llvm::Value*, llvm::Value*)>& f) {
    llvm::Value* whole = b_.CreateSub(cols_, b_.CreateSRem(cols_, c64(w_)));
    loop(c64(0), whole, [&](llvm::Value* d) {
      store(f(load(vec_, a, d), bb != nullptr ? load(vec_, bb, d) : nullptr), d, res);
    }, c64(w_));
    llvm::BasicBlock *tail = block("map_tail"), *done = block("mapped");
    b_.CreateCondBr(b_.CreateICmpSLT(whole, cols_), tail, done);
    b_.SetInsertPoint(tail);
    llvm::Value* mask = lane_mask(b_.CreateSub(cols_, whole));
    store_part(f(load_part(a, whole, mask), bb != nullptr ? load_part(bb, whole, mask) : nullptr), res, whole, mask);
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }
  void softmax_rows(llvm::Value* rows) {
    const bool log = p_.reduce == ReduceKind::LogSoftmax;
    auto id = [](llvm::Value* v) { return v; };
    auto max_op = [&](llvm::Value* a, llvm::Value* b) { return maximum(a, b); };
    auto add_op = [&](llvm::Value* a, llvm::Value* b) { return b_.CreateFAdd(a, b); };
    loop(c64(0), rows, [&](llvm::Value* r) {
      llvm::Value* x = at(x_, b_.CreateMul(r, cols_));
      llvm::Value* y = at(out_, b_.CreateMul(r, cols_));
      llvm::Value* m = reduce_all(x, cols_, id, max_op);
      llvm::Value* mv = splat(m);
      llvm::BasicBlock* done = block("row_out");
      if (p_.safe) {  // _safe_softmax: a row all -inf is +0 (where(all(x == -inf), 0, softmax))
        llvm::BasicBlock *zeros = block("masked_row"), *normal = block("softmax_row");
        b_.CreateCondBr(b_.CreateFCmpOEQ(m, llvm::ConstantFP::getInfinity(elem_, true)), zeros, normal);
        b_.SetInsertPoint(zeros);
        loop(c64(0), cols_, [&](llvm::Value* j) { store(zero(elem_), j, y); });
        b_.CreateBr(done);
        b_.SetInsertPoint(normal);
      }
      if (log) {
        llvm::Value* s = reduce_all(x, cols_, [&](llvm::Value* v) { return math_call("exp", b_.CreateFSub(v, mv)); },
                                    add_op);
        llvm::Value* lv = splat(b_.CreateExtractElement(math_call("log", splat(s)), std::uint64_t{0}));
        map_row(x, y, [&](llvm::Value* v) { return b_.CreateFSub(b_.CreateFSub(v, mv), lv); });
      } else {
        map_row(x, y, [&](llvm::Value* v) { return math_call("exp", b_.CreateFSub(v, mv)); });
        llvm::Value* s = reduce_all(y, cols_, id, add_op);
        llvm::Value* rv = splat(b_.CreateFDiv(llvm::ConstantFP::get(elem_, 1.0), s));
        map_row(y, y, [&](llvm::Value* v) { return b_.CreateFMul(v, rv); });
      }
      b_.CreateBr(done);
      b_.SetInsertPoint(done);
    });
  }

  const PointwiseProgram& p_;
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  std::int8_t dt_;
  llvm::Type* i64_ = nullptr;
  llvm::Type* elem_ = nullptr;
  llvm::Type* vec_ = nullptr;
  std::int64_t w_ = 8;
  llvm::Function* fn_ = nullptr;
  llvm::Value *x_ = nullptr, *out_ = nullptr, *cols_ = nullptr;
  std::vector<llvm::Value*> pro_base_,
      pro_param_;  // Note [Sum prologues]: loads' operands, parameters
};

// Note [CRUCIBLE_DUMP]: with CRUCIBLE_DUMP=DIR, each kernel the backend compiles (not one
// loaded from the kernel cache) leaves DIR/<symbol prefix>.program.txt (the pointwise program),
// .ll (its LLVM IR after optimization) and .s (the machine code as assembly, from a copy of
// the module, so the object file is made exactly as without the dump).
Status dump_kernel(const std::string& dir, const std::string& prefix, const PointwiseProgram& program,
                   const llvm::Module& m, llvm::TargetMachine& tm) {
  auto fail = [&](const std::string& what) {
    return bad_state("CRUCIBLE_DUMP=" + dir + ": " + what, "make the directory writable, or unset CRUCIBLE_DUMP");
  };
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fail("cannot make the directory (" + ec.message() + ")");
  const std::string base = dir + "/" + prefix;
  auto write = [&](const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    return static_cast<bool>(out);
  };
  std::string ir;
  llvm::raw_string_ostream irs(ir);
  m.print(irs, nullptr);
  irs.flush();
  std::unique_ptr<llvm::Module> copy = llvm::CloneModule(m);
  llvm::SmallVector<char, 0> asm_buf;
  llvm::raw_svector_ostream as(asm_buf);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, as, nullptr, kAssemblyFile)) return fail("LLVM cannot emit assembly here");
  pm.run(*copy);
  if (!write(base + ".program.txt", program.text()) || !write(base + ".ll", ir) ||
      !write(base + ".s", std::string(asm_buf.begin(), asm_buf.end())))
    return fail("cannot write " + base + ".{program.txt,ll,s}");
  return ok_status();
}

}  // namespace

const CpuTarget& host_target() {
  static const CpuTarget t = detect_host();
  return t;
}

Result<std::string> compile_pointwise(const PointwiseProgram& program, const std::string& prefix,
                                      const CpuTarget& target) {
  init_llvm();
  std::string err;
  const llvm::Target* t = llvm::TargetRegistry::lookupTarget(target.triple, err);
  if (t == nullptr)
    return unsupported("LLVM has no target for " + target.triple + ": " + err,
                       "run on a host LLVM was built for (x86-64, AArch64)");
  llvm::TargetOptions opts;
  opts.AllowFPOpFusion = llvm::FPOpFusion::Strict;  // no FMA contraction
  std::unique_ptr<llvm::TargetMachine> tm(t->createTargetMachine(
      target.triple, target.cpu, target.features, opts, llvm::Reloc::PIC_, {}, kCodeGenO3));
  if (!tm) return unsupported("LLVM made no target machine for " + target.cpu, "report it");

  llvm::LLVMContext ctx;
  llvm::Module m(prefix, ctx);
  m.setTargetTriple(target.triple);
  m.setDataLayout(tm->createDataLayout());
  if (program.reduce != ReduceKind::None) {
    ReduceEmitter(program, m).emit(prefix + "_contig", target);
  } else {
    LoopEmitter(program, m, true).emit(prefix + "_contig", target);
    LoopEmitter(program, m, false).emit(prefix + "_strided", target);
    if (program.scaled()) LoopEmitter(program, m, true, true).emit(prefix + "_contig_fused", target);
  }
  std::string verify_msg;
  llvm::raw_string_ostream vs(verify_msg);
  if (llvm::verifyModule(m, &vs))
    return bad_state("generated LLVM IR does not verify: " + vs.str(),
                     "a code generator bug: report it with the program:\n" + program.text());

  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(tm.get());
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  mpm.run(m, mam);
  if (const char* dir = std::getenv("CRUCIBLE_DUMP"); dir != nullptr && *dir != '\0') {
    CRUCIBLE_RETURN_IF_ERROR(dump_kernel(dir, prefix, program, m, *tm));
  }

  llvm::SmallVector<char, 0> buf;
  llvm::raw_svector_ostream os(buf);
  llvm::legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr, kObjectFile))
    return unsupported("LLVM cannot emit object files for " + target.triple, "report it");
  pm.run(m);
  return std::string(buf.begin(), buf.end());
}

}  // namespace crucible::mimic
