// dispatch_test.cpp — the recording fallback driven from C++ (no Python): what a libtorch
// program records, at which level, and with which metadata.
#include "Dispatch.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "AllocationTags.h"
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

// The requires-grad and view flags, read from the autograd metadata, are what the tensors'
// own requires_grad() and is_view() say, for every combination an op's output can have.
TEST_F(Dispatch, GradAndViewFlagsAreTheTensorsOwn) {
  auto leaf = torch::randn({4, 4}, torch::requires_grad());
  auto plain = torch::randn({4, 4});
  auto nonleaf = leaf.mul(2);
  std::vector<at::Tensor> outs;
  vessel::set_enabled(true);
  outs.push_back(leaf.t());           // a view of a leaf that requires grad
  outs.push_back(nonleaf.t());        // a view of a result with a grad_fn
  outs.push_back(plain.t());          // a view, no grad
  outs.push_back(leaf.detach());      // shares storage, not a differentiable view
  outs.push_back(nonleaf.mm(plain));  // grad_fn, not a view
  outs.push_back(plain.mm(plain));    // neither
  {
    torch::NoGradGuard no_grad;
    outs.push_back(leaf.t());
    outs.push_back(leaf.mm(plain));
  }
  vessel::set_enabled(false);
  const auto t = Recorder::global().snapshot();
  ASSERT_EQ(names(t), (std::vector<std::string>{"aten::t", "aten::t", "aten::t", "aten::detach",
                                                "aten::mm", "aten::mm", "aten::t", "aten::mm"}));
  for (std::size_t k = 0; k < outs.size(); ++k) {
    const auto& out = t.outputs(k)[0];
    EXPECT_EQ((out.flags & record::tensor_flag::kRequiresGrad) != 0, outs[k].requires_grad())
        << "op " << k;
    EXPECT_EQ((out.flags & record::tensor_flag::kIsView) != 0, outs[k].is_view()) << "op " << k;
  }
  // And the inputs: the leaf requires grad and is no view; the non-leaf has a grad_fn.
  EXPECT_TRUE(t.inputs(0)[0].flags & record::tensor_flag::kRequiresGrad);
  EXPECT_FALSE(t.inputs(0)[0].flags & record::tensor_flag::kIsView);
  EXPECT_TRUE(t.inputs(1)[0].flags & record::tensor_flag::kRequiresGrad);
  EXPECT_FALSE(t.inputs(2)[0].flags & record::tensor_flag::kRequiresGrad);
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
  std::vector<at::Tensor> handed;  // freed by whichever thread takes them
  std::vector<std::uint64_t> ids;
  std::vector<void*> raw_after;  // raw blocks made while recording, freed after
  const std::uint64_t raw_freed = vessel::tagged_raw_frees();
  auto work = [&] {
    vessel::set_enabled(true);
    for (int i = 0; i < kPerThread; ++i) {
      auto z = torch::zeros({1 + i % 97});
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(z.data_ptr()) % 64, 0u);
      EXPECT_TRUE(vessel::storage_is_tagged(z.storage()));
      void* raw = c10::GetCPUAllocator()->raw_allocate(static_cast<std::size_t>(16 + i));
      std::lock_guard<std::mutex> g(mu);
      ids.push_back(vessel::storage_id(z.storage()));
      if (i % 2 == 0) handed.push_back(z);
      if (!handed.empty() && i % 3 == 0) handed.pop_back();
      if (i % 5 == 0)
        raw_after.push_back(raw);
      else
        c10::GetCPUAllocator()->raw_deallocate(raw);
    }
    vessel::set_enabled(false);
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  for (void* p : raw_after) c10::GetCPUAllocator()->raw_deallocate(p);
  handed.clear();
  // Every raw block was made while its thread recorded: each came back through its header.
  EXPECT_EQ(vessel::tagged_raw_frees() - raw_freed, 2u * kPerThread);
  std::set<std::uint64_t> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), ids.size()) << "every storage made while recording has its own id";
  EXPECT_EQ(distinct.count(0), 0u);
}

// A base allocator that hands out chosen addresses inside a page-aligned buffer, so the
// header placement of Note [Allocation tags] is checked at page boundaries, not by chance.
alignas(4096) unsigned char g_pages[3 * 4096];
int g_base_frees = 0;
void* g_base_freed_ctx = nullptr;
struct FixedBase final : c10::Allocator {
  std::size_t offset = 0;
  mutable std::size_t requested = 0;  // the last request's size
  static void del(void* ctx) {
    ++g_base_frees;
    g_base_freed_ctx = ctx;
  }
  c10::DataPtr make(std::size_t n) const {
    requested = n;
    if (n > sizeof(g_pages) - offset)
      return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
    void* p = g_pages + offset;
    return c10::DataPtr(p, p, &del, c10::Device(c10::DeviceType::CPU));
  }
  // PyTorch 1.13 declares allocate const, 2.x not, and 2.x adds copy_data: define all three.
  c10::DataPtr allocate(std::size_t n) const { return make(n); }
  c10::DataPtr allocate(std::size_t n) { return make(n); }
  void copy_data(void* d, const void* s, std::size_t c) const { std::memcpy(d, s, c); }
};

TEST(AllocationTags, HeaderStaysInTheDataPageAndFreesReachTheBase) {
  using namespace vessel::detail;
  // Raw frees are checked for headers only once a thread has recorded (before, none exists).
  ASSERT_TRUE(vessel::install().ok());
  vessel::set_enabled(true);
  vessel::set_enabled(false);
  FixedBase base;
  std::memset(g_pages, 0, sizeof(g_pages));
  for (std::size_t offset : {std::size_t{0}, std::size_t{4096 - 64}, std::size_t{4096 - 128}}) {
    base.offset = offset;
    g_base_frees = 0;
    {
      c10::DataPtr dp = tagged_allocate(base, 100);
      const auto data = reinterpret_cast<std::uintptr_t>(dp.get());
      EXPECT_EQ(dp.get(), dp.get_context());  // raw_allocate's requirement
      EXPECT_EQ(data % 64, 0u);
      EXPECT_GE(data % 4096, 64u) << "offset " << offset;
      EXPECT_LE(data + 100, reinterpret_cast<std::uintptr_t>(g_pages) + offset + base.requested)
          << "the data ends inside the block the base gave";
      EXPECT_NE(tag_of(dp), 0u);
    }
    EXPECT_EQ(g_base_frees, 1);
    EXPECT_EQ(g_base_freed_ctx, g_pages + offset);
  }
  // A raw free of a tagged block goes through its header to the base's deleter; a stale
  // header (the block already freed) and untagged pointers are not taken.
  base.offset = 0;
  g_base_frees = 0;
  void* raw = tagged_allocate(base, 64).release_context();
  const std::uint64_t before = tagged_raw_frees();
  EXPECT_TRUE(free_if_tagged(raw));
  EXPECT_EQ(g_base_frees, 1);
  EXPECT_EQ(tagged_raw_frees(), before + 1);
  EXPECT_FALSE(free_if_tagged(raw));             // its check word was cleared
  EXPECT_FALSE(free_if_tagged(g_pages + 4096));  // at a page start: nothing before it is read
  EXPECT_FALSE(free_if_tagged(g_pages + 8192 + 128));
  EXPECT_FALSE(free_if_tagged(nullptr));
  EXPECT_EQ(g_base_frees, 1);
  // A size the header cannot be added to is the base's own request, untagged.
  c10::DataPtr huge = tagged_allocate(base, SIZE_MAX - 10);
  EXPECT_EQ(huge.get(), nullptr);
  EXPECT_EQ(tag_of(huge), 0u);
  // A cleared DataPtr (StorageImpl::reset) has freed its block and keeps its deleter, with no
  // context: no tag, no read.
  c10::DataPtr cleared = tagged_allocate(base, 8);
  void* ctx = cleared.get_context();
  cleared.clear();
  EXPECT_EQ(g_base_frees, 2);
  EXPECT_EQ(cleared.get_deleter(), &tagged_delete);
  EXPECT_EQ(tag_of(cleared), 0u);
  EXPECT_FALSE(free_if_tagged(ctx));
}

TEST_F(Dispatch, DisabledThreadRecordsNothing) {
  auto a = torch::ones({4});
  (void)(a + a);
  EXPECT_EQ(Recorder::global().snapshot().num_ops(), 0u);
  EXPECT_FALSE(vessel::is_enabled());
}
}  // namespace
