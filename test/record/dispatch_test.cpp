// dispatch_test.cpp — the recording fallback driven from C++ (no Python): what a libtorch
// program records, at which level, and with which metadata.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/CPUAllocator.h>

#include <mutex>
#include <set>
#include <thread>

#include "Dispatch.h"
#include "crucible/record/Recorder.h"

namespace {
using namespace crucible;
using record::Recorder;

std::vector<std::string> names(const record::Trace& t) {
  std::vector<std::string> out;
  for (const auto& e : t.ops) out.push_back(t.schema_name(e.schema_hash));
  return out;
}

class Dispatch : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(vessel::install().ok());
    Recorder::global().clear();
  }
  void TearDown() override { vessel::set_enabled(false); }
};

TEST_F(Dispatch, LinearIsRecordedAsItsDecomposition) {
  auto x = torch::randn({8, 4});
  auto w = torch::randn({3, 4}, torch::requires_grad());
  auto b = torch::randn({3}, torch::requires_grad());
  vessel::set_enabled(true);
  auto y = torch::nn::functional::linear(x, w, b);
  vessel::set_enabled(false);
  const auto t = Recorder::global().snapshot();
  EXPECT_EQ(names(t), (std::vector<std::string>{"aten::t", "aten::addmm"}));
  ASSERT_EQ(t.num_ops(), 2u);
  const auto& out = t.outputs(1)[0];
  const auto idx = t.tensor_index(&out);
  EXPECT_EQ(std::vector<std::int64_t>(t.sizes(idx).begin(), t.sizes(idx).end()), (std::vector<std::int64_t>{8, 3}));
  EXPECT_TRUE(out.flags & record::tensor_flag::kRequiresGrad);
  EXPECT_EQ(out.dtype, static_cast<std::int8_t>(at::kFloat));
  // t() is a view of w: same storage id, view flag on the output.
  EXPECT_EQ(t.outputs(0)[0].storage_id, t.inputs(0)[0].storage_id);
  EXPECT_TRUE(t.outputs(0)[0].flags & record::tensor_flag::kIsView);
}

TEST_F(Dispatch, InPlaceOpBumpsTheVersionItRecords) {
  auto a = torch::ones({4});
  vessel::set_enabled(true);
  a.add_(1);
  a.mul_(2);
  vessel::set_enabled(false);
  const auto t = Recorder::global().snapshot();
  ASSERT_EQ(names(t), (std::vector<std::string>{"aten::add_.Scalar", "aten::mul_.Scalar"}));
  EXPECT_TRUE(t.ops[0].flags & record::op_flag::kMutable);
  EXPECT_EQ(t.inputs(0)[0].version + 1, t.outputs(0)[0].version);
  EXPECT_EQ(t.outputs(0)[0].version, t.inputs(1)[0].version);
  EXPECT_EQ(t.inputs(0)[0].storage_id, t.outputs(1)[0].storage_id);
}

TEST_F(Dispatch, ReusedAddressesGetDistinctStorageIds) {
  std::vector<std::uint64_t> ptrs, ids;
  vessel::set_enabled(true);
  for (int i = 0; i < 50; ++i) {
    auto z = torch::zeros({256});  // freed each iteration: malloc hands the address back
    (void)z;
  }
  vessel::set_enabled(false);
  const auto t = Recorder::global().snapshot();
  ASSERT_EQ(t.num_ops(), 50u);
  std::set<std::uint64_t> distinct_ptr, distinct_id;
  for (std::size_t i = 0; i < t.num_ops(); ++i) {
    distinct_ptr.insert(t.outputs(i)[0].data_ptr);
    distinct_id.insert(t.outputs(i)[0].storage_id);
  }
  EXPECT_EQ(distinct_id.size(), 50u) << "every new storage has its own id";
  if (distinct_ptr.size() == 50u)
    GTEST_SKIP() << "the allocator never reused an address here (ASan's quarantine does that), "
                    "so the reuse case was not exercised in this build";
}

// Note [Allocation tags]: storages made while threads record are named by their memory. Two
// recording threads allocate, hand half their tensors to the other to free, and allocate and
// free raw blocks (as ideep does) while recording and after: every id distinct and non-zero,
// every block 64-byte aligned and freed by its own allocator (ASan and TSan builds run this).
TEST_F(Dispatch, TaggedStoragesAcrossThreadsAndRawBlocks) {
  constexpr int kPerThread = 300;
  std::mutex mu;
  std::vector<at::Tensor> handed;            // freed by whichever thread takes them
  std::vector<std::uint64_t> ids;
  std::vector<void*> raw_after;              // raw blocks made while recording, freed after
  auto work = [&] {
    vessel::set_enabled(true);
    for (int i = 0; i < kPerThread; ++i) {
      auto z = torch::zeros({1 + i % 97});
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(z.data_ptr()) % 64, 0u);
      void* raw = c10::GetCPUAllocator()->raw_allocate(static_cast<std::size_t>(16 + i));
      std::lock_guard<std::mutex> g(mu);
      ids.push_back(vessel::storage_id(z.storage()));
      if (i % 2 == 0) handed.push_back(z);
      if (!handed.empty() && i % 3 == 0) handed.pop_back();
      if (i % 5 == 0) raw_after.push_back(raw);
      else c10::GetCPUAllocator()->raw_deallocate(raw);
    }
    vessel::set_enabled(false);
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  for (void* p : raw_after) c10::GetCPUAllocator()->raw_deallocate(p);
  handed.clear();
  std::set<std::uint64_t> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), ids.size()) << "every storage made while recording has its own id";
  EXPECT_EQ(distinct.count(0), 0u);
}

TEST_F(Dispatch, DisabledThreadRecordsNothing) {
  auto a = torch::ones({4});
  (void)(a + a);
  EXPECT_EQ(Recorder::global().snapshot().num_ops(), 0u);
  EXPECT_FALSE(vessel::is_enabled());
}
}  // namespace
