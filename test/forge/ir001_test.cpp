// ir001_test — IR001 from synthetic and recorded traces: values, externals, live-out, costs,
// the verifier, and batch symbolization checked against a recording at a third batch size.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../graph/synth.h"
#include "crucible/forge/Ir001.h"
#include "crucible/graph/Analysis.h"
#include "crucible/record/TraceFile.h"
#include "traces.h"

namespace crucible::forge {
namespace {

using graph::synth::Builder;
using graph::synth::T;

// x[8,16] (batch input) @ w[16,32] (parameter) -> relu -> view(same shape) -> sum
Builder small_mlp(std::int64_t batch) {
  Builder b;
  b.trace.externals[1] = record::ExternalKind::Input;
  b.trace.externals[2] = record::ExternalKind::Parameter;
  b.op("aten::mm", {{1, 0, {batch, 16}}, {2, 0, {16, 32}}}, {{3, 0, {batch, 32}}});
  b.op("aten::relu", {{3, 0, {batch, 32}}}, {{4, 0, {batch, 32}}});
  b.op("aten::view", {{4, 0, {batch, 32}}}, {{4, 0, {batch * 32}, 6, 0, true}},
       record::Phase::Forward, "", {batch * 32});  // the size argument scales with the batch
  b.op("aten::sum", {{4, 0, {batch * 32}, 6, 0, true}}, {{5, 0, {}}});
  return b;
}

TEST(Ir001, ValuesProducersExternalsAndLiveOut) {
  Builder b = small_mlp(8);
  ExprPool pool;
  auto ir = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ir.ok()) << ir.status();
  ASSERT_EQ(ir->nodes.size(), 4u);
  EXPECT_EQ(ir->nodes[0].kind, CKernel::Gemm);
  EXPECT_EQ(ir->nodes[1].kind, CKernel::PointwiseUnary);
  EXPECT_EQ(ir->nodes[2].kind, CKernel::View);
  EXPECT_EQ(ir->nodes[3].kind, CKernel::Reduce);
  // x, w external; mm's output read by relu; the view and its base are distinct values.
  const Value& x = ir->values[ir->nodes[0].inputs[0]];
  const Value& w = ir->values[ir->nodes[0].inputs[1]];
  EXPECT_EQ(x.producer, kNoNode);
  EXPECT_EQ(x.external, static_cast<std::uint8_t>(record::ExternalKind::Input));
  EXPECT_EQ(w.external, static_cast<std::uint8_t>(record::ExternalKind::Parameter));
  EXPECT_EQ(ir->nodes[1].inputs[0], ir->nodes[0].outputs[0]);
  EXPECT_EQ(ir->nodes[2].inputs[0], ir->nodes[1].outputs[0]);
  EXPECT_NE(ir->nodes[2].outputs[0], ir->nodes[2].inputs[0]);
  EXPECT_EQ(ir->nodes[3].inputs[0], ir->nodes[2].outputs[0]);
  // Only the sum (read by nothing) is live-out.
  for (std::size_t v = 0; v < ir->values.size(); ++v) {
    EXPECT_EQ(ir->values[v].live_out, v == ir->nodes[3].outputs[0]) << v;
  }
  EXPECT_EQ(ir->batch_size, 8);
  // Costs: mm 2*m*n*k, relu one per element, views free.
  EXPECT_EQ(ir->nodes[0].flops, 2 * 8 * 32 * 16);
  EXPECT_EQ(ir->nodes[1].flops, 8 * 32);
  EXPECT_EQ(ir->nodes[2].bytes, 0);
  EXPECT_EQ(ir->nodes[0].bytes, (8 * 16 + 16 * 32 + 8 * 32) * 4);
  EXPECT_TRUE(verify(*ir).ok());
}

TEST(Ir001, AddressReuseIsNotDataflow) {
  // Two different storages at the same data pointer: the second read must not see the first.
  Builder b;
  b.op("aten::relu", {{1, 0, {4}, 6, 0xAA}}, {{2, 0, {4}, 6, 0xBB}});
  b.op("aten::relu", {{3, 0, {4}, 6, 0xBB}}, {{4, 0, {4}, 6, 0xCC}});
  ExprPool pool;
  auto ir = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ir.ok());
  EXPECT_EQ(ir->values[ir->nodes[1].inputs[0]].producer, kNoNode);
}

TEST(Ir001, InPlaceWriteMakesANewVersion) {
  Builder b;
  b.op("aten::relu", {{1, 0, {4}}}, {{2, 0, {4}}});
  b.op("aten::add_.Tensor", {{2, 0, {4}}, {1, 0, {4}}}, {{2, 1, {4}}});
  b.trace.ops.back().flags |= record::op_flag::kMutable;
  b.op("aten::neg", {{2, 1, {4}}}, {{3, 0, {4}}});
  ExprPool pool;
  auto ir = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ir.ok());
  EXPECT_TRUE(ir->nodes[1].mutates);
  EXPECT_EQ(ir->values[ir->nodes[2].inputs[0]].producer, 1u);  // reads version 1, from add_
  EXPECT_EQ(ir->values[ir->nodes[1].inputs[0]].producer, 0u);  // add_ read version 0, from relu
}

// Note [Unrecorded views]: autograd's as_strided scatter makes a buffer (new_zeros), writes a
// view of it in place (copy_) and reads the whole buffer at the written version through a
// geometry no op produced. That read is a view of the write, not an external input: a
// synthesized view node reads the copy_'s output.
TEST(Ir001, AWrittenStorageReadThroughAnotherGeometryIsAViewOfTheWrite) {
  Builder b;
  b.trace.externals[1] = record::ExternalKind::Input;
  b.op("aten::new_zeros", {{1, 0, {2, 8}}}, {{2, 0, {16}}});
  b.op("aten::as_strided", {{2, 0, {16}}}, {{2, 0, {2, 8}, 6, 0, true}});
  b.op("aten::copy_", {{2, 0, {2, 8}, 6, 0, true}, {1, 0, {2, 8}}}, {{2, 1, {2, 8}, 6, 0, true}});
  b.trace.ops.back().flags |= record::op_flag::kMutable;
  b.op("aten::neg", {{2, 1, {16}}}, {{3, 0, {16}}});  // the buffer, at the written version
  ExprPool pool;
  auto ir = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ir.ok()) << ir.status();
  ASSERT_TRUE(verify(*ir).ok()) << verify(*ir);
  ASSERT_EQ(ir->nodes.size(), 5u);
  const Node& view = ir->nodes[3];
  EXPECT_EQ(view.op, "aten::as_strided");
  EXPECT_EQ(view.kind, CKernel::View);
  EXPECT_EQ(ir->values[view.inputs[0]].producer, 2u);  // the copy_'s output
  const std::uint32_t read = ir->nodes[4].inputs[0];
  EXPECT_EQ(ir->values[read].producer, 3u);
  EXPECT_TRUE(ir->values[read].is_view);
  for (const Value& v : ir->values) {  // storage 2 is made in the iteration: no external value
    if (v.storage == 2) {
      EXPECT_NE(v.producer, kNoNode);
    }
  }
}

TEST(Ir001, UnknownOpIsOpaqueWithAReasonOrRefusedWhenStrict) {
  Builder b;
  b.op("myns::frobnicate", {{1, 0, {4}}}, {{2, 0, {4}}});
  ExprPool pool;
  auto ir = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ir.ok());
  EXPECT_EQ(ir->nodes[0].kind, CKernel::Opaque);
  EXPECT_FALSE(ir->nodes[0].opaque_reason.empty());
  BuildOptions strict;
  strict.strict_op_table = true;
  auto refused = build_ir001(b.trace, b.all(), pool, strict);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("myns::frobnicate"), absl::string_view::npos);
}

TEST(Ir001, BadOpIndexIsAnError) {
  Builder b = small_mlp(2);
  ExprPool pool;
  std::vector<std::size_t> ops = {0, 99};
  EXPECT_FALSE(build_ir001(b.trace, ops, pool).ok());
  EXPECT_FALSE(build_ir001(b.trace, {}, pool).ok());
}

TEST(Ir001, VerifierCatchesBrokenIr) {
  Builder b = small_mlp(4);
  ExprPool pool;
  auto ir = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ir.ok());
  {
    Ir001 bad = *ir;  // read before produced
    std::swap(bad.nodes[0], bad.nodes[1]);
    EXPECT_FALSE(verify(bad).ok());
  }
  {
    Ir001 bad = *ir;  // produced twice
    bad.nodes[1].outputs.push_back(bad.nodes[0].outputs[0]);
    EXPECT_FALSE(verify(bad).ok());
  }
  {
    Ir001 bad = *ir;  // OPAQUE without a reason
    bad.nodes[1].kind = CKernel::Opaque;
    bad.nodes[1].opaque_reason = {};
    EXPECT_FALSE(verify(bad).ok());
  }
  {
    Ir001 bad = *ir;  // out-of-range value
    bad.nodes[2].inputs[0] = 999;
    EXPECT_FALSE(verify(bad).ok());
  }
}

// A loaded trace says what it likes: a negative dim, or a tensor past 2^62 elements or bytes,
// is refused with the op named (found by fuzz_trace_file: 2^50 x 2^50 overflowed the element
// count). Large but representable shapes give costs that saturate instead of wrapping.
TEST(Ir001, ImpossibleShapesAreRefusedAndCostsSaturate) {
  ExprPool pool;
  for (const std::vector<std::int64_t>& bad : {std::vector<std::int64_t>{std::int64_t{1} << 50, std::int64_t{1} << 50},
                                               std::vector<std::int64_t>{4, -1},
                                               std::vector<std::int64_t>{std::int64_t{1} << 61}}) {  // 2^63 bytes of float
    Builder b;
    b.op("aten::relu", {{1, 0, {4}}}, {{2, 0, bad}});
    auto ir = build_ir001(b.trace, b.all(), pool);
    ASSERT_FALSE(ir.ok()) << "sizes of " << bad.size() << " dims, first " << bad[0];
    EXPECT_NE(ir.status().message().find("trace op 0 ('aten::relu') output"), absl::string_view::npos) << ir.status();
    EXPECT_NE(ir.status().message().find("2^62"), absl::string_view::npos) << ir.status();
  }
  // mm of [2^30, 2^30] by [2^30, 2^2]: 2 * 2^32 * 2^30 flops fit; [2^40, 2^20] by [2^20, 2^20]
  // would be 2^81: saturated.
  Builder b;
  const std::int64_t m = std::int64_t{1} << 40, k = std::int64_t{1} << 20;
  b.op("aten::mm", {{1, 0, {m, k}, 1}, {2, 0, {k, k}, 1}}, {{3, 0, {m, k}, 1}});  // int8: 2^60 bytes
  auto ir = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ir.ok()) << ir.status();
  EXPECT_EQ(ir->nodes[0].flops, INT64_MAX);
  EXPECT_EQ(ir->nodes[0].bytes, (m * k) * 2 + k * k) << "2^61 + 2^40 bytes: no saturation needed";
  EXPECT_TRUE(verify(*ir).ok());
  // A batch binding that makes a tensor too large is refused by instantiate.
  Builder b4 = small_mlp(4), b8 = small_mlp(8);
  auto i4 = build_ir001(b4.trace, b4.all(), pool);
  auto i8 = build_ir001(b8.trace, b8.all(), pool);
  ASSERT_TRUE(i4.ok() && i8.ok());
  auto sym = symbolize_batch(*i4, *i8, pool);
  ASSERT_TRUE(sym.ok()) << sym.status();
  auto huge = instantiate(*sym, {{"B", std::int64_t{1} << 60}});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("instantiate: value"), absl::string_view::npos) << huge.status();
}

TEST(Ir001, SymbolizeInstantiateMatchesAThirdBatch) {
  ExprPool pool;
  Builder b4 = small_mlp(4), b8 = small_mlp(8), b16 = small_mlp(16);
  auto i4 = build_ir001(b4.trace, b4.all(), pool);
  auto i8 = build_ir001(b8.trace, b8.all(), pool);
  auto i16 = build_ir001(b16.trace, b16.all(), pool);
  ASSERT_TRUE(i4.ok() && i8.ok() && i16.ok());
  auto sym = symbolize_batch(*i4, *i8, pool);
  ASSERT_TRUE(sym.ok()) << sym.status();
  EXPECT_TRUE(sym->symbolic);
  EXPECT_TRUE(verify(*sym).ok());
  const Value& view = sym->values[sym->nodes[2].outputs[0]];
  EXPECT_EQ(ExprPool::to_string(view.shape[0]), ExprPool::to_string(pool.mul(pool.constant(32), pool.symbol("B"))));
  auto at16 = instantiate(*sym, {{"B", 16}});
  ASSERT_TRUE(at16.ok());
  ASSERT_EQ(at16->values.size(), i16->values.size());
  for (std::size_t v = 0; v < i16->values.size(); ++v) {
    EXPECT_EQ(at16->values[v].shape, i16->values[v].shape) << "value " << v;  // interned: pointers
    EXPECT_EQ(at16->values[v].nbytes, i16->values[v].nbytes);
  }
  for (std::size_t n = 0; n < i16->nodes.size(); ++n) EXPECT_EQ(at16->nodes[n].flops, i16->nodes[n].flops);
  // The view's size argument is symbolic too, and instantiates to the batch-16 recording's.
  ASSERT_EQ(sym->nodes[2].scalar_exprs.size(), 1u);
  EXPECT_EQ(sym->nodes[2].scalar_exprs[0], pool.mul(pool.constant(32), pool.symbol("B")));
  ASSERT_EQ(at16->nodes[2].scalars.size(), 1u);
  EXPECT_EQ(at16->nodes[2].scalars[0].bits, i16->nodes[2].scalars[0].bits);
  EXPECT_EQ(at16->nodes[2].scalars[0].bits, 16u * 32u);
}

TEST(Ir001, SymbolizeRefusesWhatIsNotProportional) {
  ExprPool pool;
  Builder a = small_mlp(4), b = small_mlp(8);
  // A dim that changes but not with the batch: 16 -> 17 on the weight.
  b.trace.dims[b.trace.tensor_dims_begin[1] + 1] = 17;
  auto ia = build_ir001(a.trace, a.all(), pool);
  auto ib = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ia.ok() && ib.ok());
  auto sym = symbolize_batch(*ia, *ib, pool);
  ASSERT_FALSE(sym.ok());
  EXPECT_NE(sym.status().message().find("not proportional"), absl::string_view::npos) << sym.status();
  EXPECT_FALSE(symbolize_batch(*ia, *ia, pool).ok());  // same batch: nothing to learn
}

// Recorded traces of the test models (make_traces.py), when present.
Result<Ir001> ir_of(const std::string& model, std::int64_t batch, ExprPool& pool) {
  const auto path = traces_dir() / (model + "_b" + std::to_string(batch) + ".crtrace");
  auto t = record::load_trace(path.string());
  if (!t.ok()) return t.status();
  auto trace = std::make_shared<record::Trace>(std::move(*t));
  auto it = graph::analyze_latest_iteration(*trace, -1);
  if (!it.ok()) return it.status();
  return build_ir001(*trace, (*it)->ops(), pool);
}

TEST(Ir001, RecordedModelsBuildVerifyAndSymbolize) {
  if (!std::filesystem::exists(traces_dir() / "index.json")) GTEST_SKIP() << "no recorded traces";
  std::ifstream index(traces_dir() / "index.json");
  std::string text((std::istreambuf_iterator<char>(index)), std::istreambuf_iterator<char>());
  for (const std::string model : {"mlp", "cnn", "resnet18", "transformer"}) {
    if (text.find("\"" + model + "\"") == std::string::npos) continue;
    // Batches: the files present for this model, ascending.
    std::vector<std::int64_t> batches;
    for (const auto& e : std::filesystem::directory_iterator(traces_dir())) {
      const std::string name = e.path().filename().string();
      if (name.rfind(model + "_b", 0) == 0 && e.path().extension() == ".crtrace") {
        batches.push_back(std::stoll(name.substr(model.size() + 2)));
      }
    }
    std::sort(batches.begin(), batches.end());
    ASSERT_GE(batches.size(), 2u) << model;
    ExprPool pool;
    auto a = ir_of(model, batches[0], pool);
    auto b = ir_of(model, batches[1], pool);
    ASSERT_TRUE(a.ok()) << model << ": " << a.status();
    ASSERT_TRUE(b.ok()) << model << ": " << b.status();
    EXPECT_TRUE(verify(*a).ok()) << model;
    EXPECT_EQ(a->batch_size, batches[0]) << model;
    auto sym = symbolize_batch(*a, *b, pool);
    ASSERT_TRUE(sym.ok()) << model << ": " << sym.status();
    if (batches.size() >= 3) {
      auto c = ir_of(model, batches[2], pool);
      ASSERT_TRUE(c.ok()) << model;
      auto inst = instantiate(*sym, {{"B", batches[2]}});
      ASSERT_TRUE(inst.ok()) << model;
      ASSERT_EQ(inst->values.size(), c->values.size()) << model;
      for (std::size_t v = 0; v < c->values.size(); ++v) {
        ASSERT_EQ(inst->values[v].shape, c->values[v].shape) << model << " value " << v;
      }
      // Scalar arguments too (view sizes, split lengths): every bit as recorded at that batch.
      ASSERT_EQ(inst->nodes.size(), c->nodes.size()) << model;
      for (std::size_t n = 0; n < c->nodes.size(); ++n) {
        ASSERT_EQ(inst->nodes[n].scalars.size(), c->nodes[n].scalars.size()) << model << " node " << n;
        for (std::size_t k = 0; k < c->nodes[n].scalars.size(); ++k) {
          EXPECT_EQ(inst->nodes[n].scalars[k].bits, c->nodes[n].scalars[k].bits)
              << model << " node " << n << " " << c->nodes[n].op << " scalar " << k;
        }
      }
    }
    // symbolize_sizes names the batch "B" and finds the same expressions as symbolize_batch.
    std::vector<SizeSymbol> found;
    auto sizes = symbolize_sizes(*a, *b, pool, &found);
    ASSERT_TRUE(sizes.ok()) << model << ": " << sizes.status();
    ASSERT_EQ(found.size(), 1u) << model;
    EXPECT_EQ(found[0].name, "B");
    EXPECT_EQ(found[0].a, batches[0]);
    EXPECT_EQ(found[0].b, batches[1]);
    for (std::size_t v = 0; v < sym->values.size(); ++v)
      ASSERT_EQ(sizes->values[v].shape, sym->values[v].shape) << model << " value " << v;
    for (std::size_t n = 0; n < sym->nodes.size(); ++n)
      for (std::size_t k = 0; k < sym->nodes[n].scalar_exprs.size(); ++k)
        EXPECT_EQ(sizes->nodes[n].scalar_exprs[k], sym->nodes[n].scalar_exprs[k]) << model << " node " << n;
  }
}

// A step over a sequence of length s (batch 4): x[4,s,8] (batch input) viewed [4s,8] @ w[8,16]
// -> viewed [4,s,16]; scores [4,s,16] @ [4,16,s] -> [4,s,s]; a cat of one more position ->
// [4,s+1,16]; a view [s/2, 128]; with `flat`, the cat's result viewed flat: 64*s + 64 elements.
Builder seq_model(std::int64_t s, bool flat = false) {
  Builder b;
  b.trace.externals[1] = record::ExternalKind::Input;
  b.trace.externals[2] = record::ExternalKind::Parameter;
  b.trace.externals[9] = record::ExternalKind::Parameter;
  b.op("aten::view", {{1, 0, {4, s, 8}}}, {{1, 0, {4 * s, 8}, 6, 0, true}}, record::Phase::Forward, "", {4 * s, 8});
  b.op("aten::mm", {{1, 0, {4 * s, 8}, 6, 0, true}, {2, 0, {8, 16}}}, {{3, 0, {4 * s, 16}}});
  b.op("aten::view", {{3, 0, {4 * s, 16}}}, {{3, 0, {4, s, 16}, 6, 0, true}}, record::Phase::Forward, "", {4, s, 16});
  b.op("aten::transpose", {{3, 0, {4, s, 16}, 6, 0, true}}, {{3, 0, {4, 16, s}, 6, 0, true}}, record::Phase::Forward, "",
       {1, 2});
  b.op("aten::bmm", {{3, 0, {4, s, 16}, 6, 0, true}, {3, 0, {4, 16, s}, 6, 0, true}}, {{4, 0, {4, s, s}}});
  b.op("aten::cat", {{3, 0, {4, s, 16}, 6, 0, true}, {9, 0, {4, 1, 16}}}, {{5, 0, {4, s + 1, 16}}},
       record::Phase::Forward, "", {1});
  b.op("aten::view", {{3, 0, {4 * s, 16}}}, {{3, 0, {s / 2, 128}, 6, 0, true}}, record::Phase::Forward, "",
       {s / 2, 128});
  if (flat)
    b.op("aten::view", {{5, 0, {4, s + 1, 16}}}, {{5, 0, {4 * (s + 1) * 16}, 6, 0, true}}, record::Phase::Forward, "",
         {4 * (s + 1) * 16});
  return b;
}

TEST(Ir001, SymbolizeSizesOverASequenceLengthMatchesAThirdLength) {
  ExprPool pool;
  Builder b12 = seq_model(12), b8 = seq_model(8), b16 = seq_model(16);
  auto i12 = build_ir001(b12.trace, b12.all(), pool);
  auto i8 = build_ir001(b8.trace, b8.all(), pool);
  auto i16 = build_ir001(b16.trace, b16.all(), pool);
  ASSERT_TRUE(i12.ok() && i8.ok() && i16.ok());
  std::vector<SizeSymbol> found;
  auto sym = symbolize_sizes(*i12, *i8, pool, &found);
  ASSERT_TRUE(sym.ok()) << sym.status();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].name, "S");  // the leading dim (4) is no batch that varies
  EXPECT_EQ(found[0].a, 12);
  EXPECT_EQ(found[0].b, 8);
  EXPECT_TRUE(sym->symbolic);
  EXPECT_TRUE(verify(*sym).ok());
  const Expr* S = pool.symbol("S");
  auto shape_of = [&](std::size_t node) { return sym->values[sym->nodes[node].outputs[0]].shape; };
  EXPECT_EQ(shape_of(1), (std::vector<const Expr*>{pool.mul(pool.constant(4), S), pool.constant(16)}));
  EXPECT_EQ(shape_of(4), (std::vector<const Expr*>{pool.constant(4), S, S}));
  EXPECT_EQ(shape_of(5), (std::vector<const Expr*>{pool.constant(4), pool.add(S, pool.constant(1)), pool.constant(16)}));
  EXPECT_EQ(shape_of(6), (std::vector<const Expr*>{pool.floordiv(S, pool.constant(2)), pool.constant(128)}));
  EXPECT_EQ(ExprPool::to_string(shape_of(5)[1]), "S+1");
  auto at16 = instantiate(*sym, {{"S", 16}});
  ASSERT_TRUE(at16.ok()) << at16.status();
  ASSERT_EQ(at16->values.size(), i16->values.size());
  for (std::size_t v = 0; v < i16->values.size(); ++v) EXPECT_EQ(at16->values[v].shape, i16->values[v].shape) << v;
  for (std::size_t n = 0; n < i16->nodes.size(); ++n)
    for (std::size_t k = 0; k < i16->nodes[n].scalars.size(); ++k)
      EXPECT_EQ(at16->nodes[n].scalars[k].bits, i16->nodes[n].scalars[k].bits) << "node " << n << " scalar " << k;
}

TEST(Ir001, SymbolizeSizesKeepsEachInputDimItsOwnSymbol) {
  // Batch 4 -> 8 and length 16 -> 32 vary alike (S = 4*B in both recordings): the length dim is
  // S, not 4*B. (Their product is any fit the two agree on: 4*B*B is taken, Note [Size symbols].)
  auto rec = [](std::int64_t b, std::int64_t s) {
    Builder x;
    x.trace.externals[1] = record::ExternalKind::Input;
    x.trace.externals[2] = record::ExternalKind::Parameter;
    x.op("aten::view", {{1, 0, {b, s, 8}}}, {{1, 0, {b * s, 8}, 6, 0, true}}, record::Phase::Forward, "", {b * s, 8});
    x.op("aten::mm", {{1, 0, {b * s, 8}, 6, 0, true}, {2, 0, {8, 16}}}, {{3, 0, {b * s, 16}}});
    return x;
  };
  ExprPool pool;
  Builder a = rec(4, 16), b = rec(8, 32);
  auto ia = build_ir001(a.trace, a.all(), pool);
  auto ib = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ia.ok() && ib.ok());
  std::vector<SizeSymbol> found;
  auto sym = symbolize_sizes(*ia, *ib, pool, &found);
  ASSERT_TRUE(sym.ok()) << sym.status();
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].name, "B");
  EXPECT_EQ(found[1].name, "S");
  const Value& x = sym->values[sym->nodes[0].inputs[0]];
  EXPECT_EQ(x.shape, (std::vector<const Expr*>{pool.symbol("B"), pool.symbol("S"), pool.constant(8)}));
}

TEST(Ir001, SymbolizeSizesRefusesWhatNoFitExplains) {
  ExprPool pool;
  // 64*S + 64 (the flat view of [4, S+1, 16]) is no one-parameter fit of S: 832 and 576.
  Builder a = seq_model(12, true), b = seq_model(8, true);
  auto ia = build_ir001(a.trace, a.all(), pool);
  auto ib = build_ir001(b.trace, b.all(), pool);
  ASSERT_TRUE(ia.ok() && ib.ok());
  auto sym = symbolize_sizes(*ia, *ib, pool);
  ASSERT_FALSE(sym.ok());
  EXPECT_NE(sym.status().message().find("is 832 and 576: no function of the input sizes"), absl::string_view::npos)
      << sym.status();
  EXPECT_FALSE(symbolize_sizes(*ia, *ia, pool).ok());  // one size: no symbol
  // Sizes 0 and 1 are never symbols.
  Builder one = seq_model(2), two = seq_model(1);
  auto i1 = build_ir001(one.trace, one.all(), pool);
  auto i2 = build_ir001(two.trace, two.all(), pool);
  ASSERT_TRUE(i1.ok() && i2.ok());
  auto s01 = symbolize_sizes(*i1, *i2, pool);
  ASSERT_FALSE(s01.ok());
  EXPECT_NE(s01.status().message().find("never symbols"), absl::string_view::npos) << s01.status();
}

}  // namespace
}  // namespace crucible::forge
