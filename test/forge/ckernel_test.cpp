// ckernel_test.cpp — the kernel taxonomy: frozen ordinals, the op table's invariants, lookup by
// overload then base name, and coverage of every op the four test models record.
#include "crucible/core/OpTable.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "crucible/record/TraceFile.h"

namespace crucible::forge {
namespace {

TEST(CKernel, OrdinalsAndNamesAreFrozen) {
  // Written into plan texts and digests: changing any row here breaks every stored plan.
  struct Row {
    CKernel kind;
    int ordinal;
    const char* name;
  };
  const Row rows[] = {
      {CKernel::Gemm, 0, "GEMM"},
      {CKernel::Conv, 1, "CONV"},
      {CKernel::PointwiseUnary, 2, "POINTWISE_UNARY"},
      {CKernel::PointwiseBinary, 3, "POINTWISE_BINARY"},
      {CKernel::Reduce, 4, "REDUCE"},
      {CKernel::Norm, 5, "NORM"},
      {CKernel::Softmax, 6, "SOFTMAX"},
      {CKernel::Embedding, 7, "EMBEDDING"},
      {CKernel::View, 8, "VIEW"},
      {CKernel::DataMovement, 9, "DATA_MOVEMENT"},
      {CKernel::Rng, 10, "RNG"},
      {CKernel::OptimizerUpdate, 11, "OPTIMIZER_UPDATE"},
      {CKernel::Collective, 12, "COLLECTIVE"},
      {CKernel::Loss, 13, "LOSS"},
      {CKernel::Pooling, 14, "POOLING"},
      {CKernel::Factory, 15, "FACTORY"},
      {CKernel::Opaque, 16, "OPAQUE"},
  };
  ASSERT_EQ(static_cast<int>(CKernel::kCount), 17);
  ASSERT_EQ(ckernel_table().size(), std::size(rows));
  for (const Row& r : rows) {
    EXPECT_EQ(static_cast<int>(r.kind), r.ordinal) << r.name;
    EXPECT_EQ(ckernel_info(r.kind).kind, r.kind) << r.name;
    EXPECT_EQ(ckernel_info(r.kind).name, r.name);
    EXPECT_EQ(ckernel_table()[r.ordinal].name, r.name);
  }
}

TEST(CKernel, OnlyGemmAndConvTakeEpiloguesOnlyPointwiseIsElementwise) {
  for (const CKernelInfo& k : ckernel_table()) {
    EXPECT_EQ(k.fusable_epilogue, k.kind == CKernel::Gemm || k.kind == CKernel::Conv) << k.name;
    EXPECT_EQ(k.elementwise,
              k.kind == CKernel::PointwiseUnary || k.kind == CKernel::PointwiseBinary)
        << k.name;
  }
}

TEST(OpTable, SortedUniqueAndReasonsExactlyOnOpaqueRows) {
  const auto t = op_table();
  ASSERT_GT(t.size(), 300u);
  for (std::size_t i = 0; i < t.size(); ++i) {
    const OpTableEntry& e = t[i];
    if (i > 0) {
      EXPECT_LT(t[i - 1].name, e.name) << "rows must be sorted and unique";
    }
    EXPECT_NE(e.name.find("::"), std::string_view::npos) << e.name;
    EXPECT_LT(static_cast<int>(e.kind), static_cast<int>(CKernel::kCount)) << e.name;
    if (e.kind == CKernel::Opaque) {
      EXPECT_GT(e.reason.size(), 10u) << e.name << ": an OPAQUE row says why";
      EXPECT_NE(e.reason, "not in the op table") << e.name;
    } else {
      EXPECT_TRUE(e.reason.empty()) << e.name << " is " << ckernel_info(e.kind).name;
    }
  }
}

TEST(OpTable, EveryRowClassifiesToItself) {
  for (const OpTableEntry& e : op_table()) {
    const OpClass c = classify_op(e.name);
    EXPECT_EQ(c.kind, e.kind) << e.name;
    EXPECT_EQ(c.reason, e.reason) << e.name;
  }
}

TEST(ClassifyOp, OverloadFirstThenBaseName) {
  // Base rows reached through an overload.
  EXPECT_EQ(classify_op("aten::add.Tensor").kind, CKernel::PointwiseBinary);
  EXPECT_EQ(classify_op("aten::add_.Tensor").kind, CKernel::PointwiseBinary);
  EXPECT_EQ(classify_op("aten::sum.dim_IntList").kind, CKernel::Reduce);
  EXPECT_EQ(classify_op("aten::bernoulli_.float").kind, CKernel::Rng);
  EXPECT_EQ(classify_op("aten::_foreach_add_.List").kind, CKernel::OptimizerUpdate);
  // An overload row beats its base row.
  EXPECT_EQ(classify_op("aten::max.dim").kind, CKernel::Reduce);
  EXPECT_EQ(classify_op("aten::max.other").kind, CKernel::PointwiseBinary);
  EXPECT_EQ(classify_op("aten::to.dtype_layout").kind, CKernel::PointwiseUnary);
  EXPECT_EQ(classify_op("aten::to.device").kind, CKernel::DataMovement);
  EXPECT_EQ(classify_op("aten::repeat_interleave.self_int").kind, CKernel::DataMovement);
  const OpClass ri = classify_op("aten::repeat_interleave.Tensor");
  EXPECT_EQ(ri.kind, CKernel::Opaque);
  EXPECT_NE(ri.reason.find("depends on the tensor's values"), std::string_view::npos);
  // Names without an overload.
  EXPECT_EQ(classify_op("aten::addmm").kind, CKernel::Gemm);
  EXPECT_EQ(classify_op("aten::convolution_backward").kind, CKernel::Conv);
}

TEST(ClassifyOp, MissingOpsAreOpaqueAndSaySo) {
  for (const char* name : {"aten::frobnicate", "aten::frobnicate.Tensor", "myops::addmm", "",
                           "addmm", "aten::", "aten::ad"}) {
    const OpClass c = classify_op(name);
    EXPECT_EQ(c.kind, CKernel::Opaque) << name;
    EXPECT_EQ(c.reason, "not in the op table") << name;
  }
}

TEST(ClassifyOp, OptimizerArithmeticIsClassifiedByWhatItComputes) {
  EXPECT_EQ(classify_op("aten::addcmul_").kind, CKernel::PointwiseBinary);
  EXPECT_EQ(classify_op("aten::addcdiv_").kind, CKernel::PointwiseBinary);
  EXPECT_EQ(classify_op("aten::mul_.Tensor").kind, CKernel::PointwiseBinary);
  EXPECT_EQ(classify_op("aten::lerp_.Scalar").kind, CKernel::PointwiseBinary);
  EXPECT_EQ(classify_op("aten::sqrt").kind, CKernel::PointwiseUnary);
  EXPECT_EQ(classify_op("aten::zero_").kind, CKernel::Factory);
  EXPECT_EQ(classify_op("aten::_foreach_addcdiv_.ScalarList").kind, CKernel::OptimizerUpdate);
  EXPECT_EQ(classify_op("aten::_fused_adamw_").kind, CKernel::OptimizerUpdate);
  const OpClass item = classify_op("aten::_local_scalar_dense");
  EXPECT_EQ(item.kind, CKernel::Opaque);
  EXPECT_NE(item.reason.find("synchronization"), std::string_view::npos) << item.reason;
}

TEST(OpTraits, AnswerWhatTheGraphAndCanonicalizeAsk) {
  // The memory plan's shares: elementwise kinds and copies, never in place, never a reduction.
  for (const char* yes : {"aten::add.Tensor", "aten::relu", "aten::threshold_backward",
                          "aten::clone", "aten::max.other", "aten::where.self", "aten::__and__.Tensor"})
    EXPECT_TRUE(is_elementwise_functional(yes)) << yes;
  for (const char* no : {"aten::add_.Tensor", "aten::relu_", "aten::__iand__.Tensor", "aten::mm",
                         "aten::max.dim", "aten::cat", "aten::view", "aten::frobnicate", ""})
    EXPECT_FALSE(is_elementwise_functional(no)) << no;
  EXPECT_EQ(op_base_name("aten::add_.Tensor"), "add_");
  EXPECT_EQ(op_base_name("relu"), "relu");
  EXPECT_TRUE(is_in_place_op("aten::_foreach_add_.List"));
  EXPECT_FALSE(is_in_place_op("aten::__and__.Tensor"));
  // canonicalize's questions.
  auto has = [](const char* op, std::uint8_t trait) { return (classify_op(op).traits & trait) != 0; };
  EXPECT_TRUE(has("aten::view", op_trait::kShapePreservingView));
  EXPECT_TRUE(has("aten::expand", op_trait::kShapePreservingView));
  EXPECT_FALSE(has("aten::as_strided", op_trait::kShapePreservingView));
  EXPECT_FALSE(has("aten::permute", op_trait::kShapePreservingView));
  EXPECT_TRUE(has("aten::to.dtype_layout", op_trait::kMayReturnInput));
  EXPECT_TRUE(has("aten::to.device", op_trait::kMayReturnInput));
  EXPECT_TRUE(has("aten::contiguous", op_trait::kMayReturnInput | op_trait::kCopy));
  EXPECT_FALSE(has("aten::clone", op_trait::kMayReturnInput));
  EXPECT_EQ(classify_op("aten::frobnicate").traits, 0);
}

// ---- coverage of the recorded test models ------------------------------------------------

namespace fs = std::filesystem;

// Every .crtrace make_traces.py wrote, by model ("resnet18_b4.crtrace" -> "resnet18").
std::map<std::string, std::vector<fs::path>> recorded_traces() {
  std::map<std::string, std::vector<fs::path>> by_model;
  const fs::path dir = CRUCIBLE_FORGE_TRACES;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    if (f.path().extension() != ".crtrace") continue;
    const std::string stem = f.path().stem().string();
    const auto b = stem.rfind("_b");
    by_model[b == std::string::npos ? stem : stem.substr(0, b)].push_back(f.path());
  }
  return by_model;
}

TEST(OpTableCoverage, EveryOpTheTestModelsRecordIsInTheTable) {
  const fs::path dir = CRUCIBLE_FORGE_TRACES;
  if (!fs::exists(dir / "index.json")) {
    GTEST_SKIP() << dir << " has no index.json: run test/forge/make_traces.py (needs torch and "
                 << "the Vessel) to record the test models";
  }
  const auto by_model = recorded_traces();
  for (const char* m : {"mlp", "cnn", "resnet18", "transformer"}) {
    EXPECT_TRUE(by_model.count(m)) << "no trace of model " << m << " in " << dir;
  }
  std::set<std::string> all_ops;
  for (const auto& [model, paths] : by_model) {
    std::set<std::string> ops;
    for (const fs::path& p : paths) {
      auto t = record::load_trace(p.string());
      ASSERT_TRUE(t.ok()) << p << ": " << t.status();
      ASSERT_GT(t->num_ops(), 0u) << p;
      for (int ph = 0; ph < record::kNumPhases; ++ph) {
        EXPECT_GT(t->total_ops(static_cast<record::Phase>(ph)), 0u)
            << p << " has no " << record::phase_name(static_cast<record::Phase>(ph)) << " ops";
      }
      for (const record::TraceEntry& e : t->ops) ops.insert(t->schema_name(e.schema_hash));
    }
    for (const std::string& op : ops) {
      const OpClass c = classify_op(op);
      EXPECT_NE(c.reason, "not in the op table")
          << model << " records " << op << ", which the op table lacks: add a row to OpTable.cpp";
      if (c.kind == CKernel::Opaque) {
        EXPECT_FALSE(c.reason.empty()) << op;
      }
    }
    all_ops.insert(ops.begin(), ops.end());
  }
  // Spot checks on what the models are known to record.
  const std::map<std::string, CKernel> expected = {
      {"aten::addmm", CKernel::Gemm},
      {"aten::convolution_backward", CKernel::Conv},
      {"aten::native_batch_norm", CKernel::Norm},
      {"aten::native_layer_norm_backward", CKernel::Norm},
      {"aten::_log_softmax", CKernel::Softmax},
      {"aten::nll_loss_forward", CKernel::Loss},
      {"aten::max_pool2d_with_indices", CKernel::Pooling},
      {"aten::embedding_dense_backward", CKernel::Embedding},
      {"aten::threshold_backward", CKernel::PointwiseBinary},
      {"aten::addcmul_", CKernel::PointwiseBinary},
      {"aten::bernoulli_.float", CKernel::Rng},
      {"aten::_local_scalar_dense", CKernel::Opaque},
  };
  for (const auto& [op, kind] : expected) {
    EXPECT_TRUE(all_ops.count(op)) << op << " was expected in the recorded models";
    EXPECT_EQ(classify_op(op).kind, kind) << op;
  }
}

}  // namespace
}  // namespace crucible::forge
