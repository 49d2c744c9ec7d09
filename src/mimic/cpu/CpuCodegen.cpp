// CpuCodegen.cpp — LLVM IR for a pointwise program, optimized at O3 for the host CPU and
// emitted as an object file; and the host target's detection (CpuTarget.h).
#include "crucible/mimic/CpuCodegen.h"

#include <algorithm>
#include <cstdlib>
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
    auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx_), args, false);
    fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m_);
    fn_->addFnAttr("target-cpu", target.cpu);
    fn_->addFnAttr("target-features", target.features);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
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
  LoopEmitter(program, m, true).emit(prefix + "_contig", target);
  LoopEmitter(program, m, false).emit(prefix + "_strided", target);
  if (program.scaled()) LoopEmitter(program, m, true, true).emit(prefix + "_contig_fused", target);
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
