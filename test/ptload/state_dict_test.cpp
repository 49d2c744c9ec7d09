// state_dict_test.cpp — loads files torch.save wrote and compares with PyTorch's own values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "crucible/ptload/StateDict.h"
#include "fixture_util.h"

namespace {
using namespace crucible::ptload;
using test::fixture;
using K = PickleValue::Kind;

StateDict open_ok(const std::string& file) {
  auto sd = StateDict::open(fixture(file));
  if (!sd.ok()) {
    ADD_FAILURE() << sd.status();
    std::abort();
  }
  return std::move(*sd);
}

// Every tensor PyTorch listed is present with the same metadata and bit-identical float32 values;
// tensors PyTorch says share a storage share one here, and only those.
void expect_matches_torch(const StateDict& sd, const std::string& manifest_name) {
  const auto m = test::manifest(manifest_name);
  ASSERT_FALSE(m["tensors"].empty()) << "no manifest for " << manifest_name;
  ASSERT_EQ(sd.tensors().size(), m["tensors"].size());
  std::map<std::int64_t, const TensorStorage*> storage_of_ptr;
  for (std::size_t i = 0; i < m["tensors"].size(); ++i) {
    const auto& row = m["tensors"][i];
    const std::string name = row["name"];
    SCOPED_TRACE(manifest_name + ": " + name);
    EXPECT_EQ(sd.tensors()[i].name, name) << "same order as the pickle";
    const TensorView* t = sd.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype_name(), row["dtype"].get<std::string>());
    EXPECT_EQ(std::vector<std::int64_t>(t->sizes().begin(), t->sizes().end()),
              row["sizes"].get<std::vector<std::int64_t>>());
    EXPECT_EQ(std::vector<std::int64_t>(t->strides().begin(), t->strides().end()),
              row["strides"].get<std::vector<std::int64_t>>());
    EXPECT_EQ(t->storage_offset(), row["offset"].get<std::int64_t>());
    EXPECT_EQ(t->requires_grad(), row["requires_grad"].get<bool>());
    EXPECT_EQ(t->is_parameter(), row["parameter"].get<bool>());
    const auto want = test::expected_f32(row);
    const auto got = t->materialize_f32();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(got.empty() ||
                std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0)
        << "float32 values differ from PyTorch's";
    const auto ptr = row["storage"].get<std::int64_t>();
    auto [it, fresh] = storage_of_ptr.emplace(ptr, &t->storage());
    EXPECT_EQ(it->second, &t->storage()) << "PyTorch shares this storage with an earlier tensor";
    if (fresh) {
      for (const auto& [p, s] : storage_of_ptr) {
        EXPECT_TRUE(p == ptr || s != &t->storage()) << "PyTorch keeps these storages apart";
      }
    }
  }
}

TEST(StateDict, EveryDtypeMatchesTorch) {
  const StateDict sd = open_ok("dtypes.pt");
  expect_matches_torch(sd, "dtypes");
  EXPECT_FALSE(sd.big_endian_source());
  EXPECT_TRUE(sd.root().is_ordered_dict());
}

TEST(StateDict, StridedOffsetExpandedAndSharedViewsMatchTorch) {
  const StateDict sd = open_ok("views.pt");
  expect_matches_torch(sd, "views");
  EXPECT_EQ(&sd.find("base")->storage(), &sd.find("sliced")->storage());
  EXPECT_EQ(sd.find("sliced")->storage_offset(), 25);
  EXPECT_FALSE(sd.find("transposed")->is_contiguous());
}

TEST(StateDict, StoredRecordsAreViewedInPlaceWithoutCopy) {
  auto bytes = std::make_shared<std::string>(test::read_file(fixture("views.pt")));
  auto sd = StateDict::from_bytes(
      std::as_bytes(std::span<const char>(bytes->data(), bytes->size())), bytes);
  ASSERT_TRUE(sd.ok()) << sd.status();
  for (const auto& nt : sd->tensors()) {
    const auto* p = reinterpret_cast<const char*>(nt.tensor.storage().bytes.data());
    EXPECT_TRUE(p >= bytes->data() && p < bytes->data() + bytes->size()) << nt.name;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64,
              reinterpret_cast<std::uintptr_t>(bytes->data()) % 64)
        << "torch aligns records to 64 bytes in the file";
  }
}

TEST(StateDict, NestedContainersAndPlainValues) {
  const StateDict sd = open_ok("nested.pt");
  expect_matches_torch(sd, "nested");
  const PickleValue& r = sd.root();
  EXPECT_EQ(r.get("step")->as_int(), 3);
  EXPECT_EQ(r.get("lr")->as_float(), 0.125);
  EXPECT_EQ(r.get("name")->as_string(), "run-1");
  EXPECT_TRUE(r.get("flag")->as_bool());
  EXPECT_TRUE(r.get("nothing")->is(K::None));
  EXPECT_EQ(r.get("neg")->as_int(), -5);
  EXPECT_TRUE(r.get("big")->is(K::BigInt));
  EXPECT_EQ(r.get("dt")->as_dtype(), 5);
  EXPECT_EQ(r.get("sz")->repr(), "(2, 3)");
  EXPECT_TRUE(r.get("hist")->is(K::List));
  EXPECT_TRUE(r.get("hist")->items()[1].is(K::Tuple));
  EXPECT_TRUE(r.get("model")->is_ordered_dict());
  EXPECT_TRUE(r.get("model")->attributes().get("_metadata") != nullptr)
      << "state_dict()'s _metadata arrives through BUILD";
  EXPECT_NE(sd.find("model.weight"), nullptr);
  EXPECT_NE(sd.find("hist.1.0"), nullptr);
  EXPECT_NE(sd.find("7"), nullptr) << "int keys are named by their decimal text";
}

TEST(StateDict, Resnet18SpotChecksAndEveryShape) {
  const StateDict sd = open_ok("resnet18.pt");
  const auto all = test::manifest("resnet18_all");
  ASSERT_EQ(sd.tensors().size(), all["tensors"].size());
  for (std::size_t i = 0; i < sd.tensors().size(); ++i) {
    const auto& row = all["tensors"][i];
    const auto& t = sd.tensors()[i];
    ASSERT_EQ(t.name, row["name"].get<std::string>());
    EXPECT_EQ(t.tensor.dtype_name(), row["dtype"].get<std::string>()) << t.name;
    EXPECT_EQ(std::vector<std::int64_t>(t.tensor.sizes().begin(), t.tensor.sizes().end()),
              row["sizes"].get<std::vector<std::int64_t>>())
        << t.name;
    double sum = 0;
    for (float v : t.tensor.materialize_f32()) sum += v;
    const double want = row["sum"];
    EXPECT_NEAR(sum, want, 1e-6 * (1.0 + std::abs(want)) + 1e-9 * t.tensor.numel()) << t.name;
  }
  // Spot checks, bit-exact: read the same names out of the full file.
  const auto spot = test::manifest("resnet18_spot");
  for (const auto& row : spot["tensors"]) {
    const TensorView* t = sd.find(row["name"].get<std::string>());
    ASSERT_NE(t, nullptr);
    const auto want = test::expected_f32(row);
    const auto got = t->materialize_f32();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << row["name"];
  }
}

TEST(StateDict, BigEndianFilesAreSwappedOnLoad) {
  const StateDict d = open_ok("dtypes_big.pt");
  EXPECT_TRUE(d.big_endian_source());
  expect_matches_torch(d, "dtypes");
  const StateDict v = open_ok("views_big.pt");
  expect_matches_torch(v, "views");
  EXPECT_EQ(&v.find("base")->storage(), &v.find("transposed")->storage())
      << "swapped once, still shared";
}

TEST(StateDict, DeflatedZip64AndHandMadeArchives) {
  expect_matches_torch(open_ok("dtypes_deflate.pt"), "dtypes");
  expect_matches_torch(open_ok("views_zip64.pt"), "views");
  expect_matches_torch(open_ok("handmade.pt"), "handmade");
}

// A checkpoint as torch 2.x writes it: the archive's 2.x records are there (and ignored), the
// optimizers' state dicts load with their tensor `step`s, buffers and param_groups.
TEST(StateDict, Torch2CheckpointWithOptimizerStates) {
  const auto records = test::manifest("checkpoint_records");
  SCOPED_TRACE("written by torch " + records.value("torch", std::string("?")));
  for (const char* r : {".format_version", ".storage_alignment", "byteorder",
                        ".data/serialization_id", "data.pkl", "version"}) {
    EXPECT_NE(std::find(records["records"].begin(), records["records"].end(), r),
              records["records"].end())
        << "torch >= 2.x writes the record " << r << "; the fixture should come from it";
  }
  const StateDict sd = open_ok("checkpoint.pt");
  expect_matches_torch(sd, "checkpoint");
  const PickleValue& r = sd.root();
  EXPECT_EQ(r.get("epoch")->as_int(), 3);
  const PickleValue& adam = *r.get("adam");
  const TensorView* step = sd.find("adam.state.0.step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->ndim(), 0u);
  EXPECT_EQ(step->dtype_name(), "float32");
  EXPECT_EQ(step->materialize_f32(), std::vector<float>{1.0f});
  EXPECT_EQ(adam.get("state")->entries().size(), 6u) << "int keys: one entry per parameter";
  const PickleValue& group = adam.get("param_groups")->items()[0];
  EXPECT_EQ(group.get("lr")->as_float(), 0.01);
  const auto betas = group.get("betas")->items();
  ASSERT_EQ(betas.size(), 2u);
  EXPECT_EQ(betas[0].as_float(), 0.9);
  EXPECT_EQ(betas[1].as_float(), 0.999);
  EXPECT_EQ(group.get("eps")->as_float(), 1e-8);
  EXPECT_FALSE(group.get("amsgrad")->as_bool());
  EXPECT_TRUE(group.get("foreach")->is(K::None));
  EXPECT_EQ(group.get("params")->repr(), "[0, 1, 2, 3, 4, 5]");
  const PickleValue& sgd = *r.get("sgd")->get("param_groups")->items()[0].get("momentum");
  EXPECT_EQ(sgd.as_float(), 0.9);
  EXPECT_NE(sd.find("sgd.state.5.momentum_buffer"), nullptr);
}

// torch.utils.serialization.config.save.storage_alignment = 4096 (torch >= 2.5).
TEST(StateDict, StoragesAlignedTo4096Bytes) {
  if (test::read_file(fixture("aligned4096.pt")).empty())
    GTEST_SKIP() << "the torch that made the fixtures has no storage_alignment setting";
  auto bytes = std::make_shared<std::string>(test::read_file(fixture("aligned4096.pt")));
  auto sd = StateDict::from_bytes(
      std::as_bytes(std::span<const char>(bytes->data(), bytes->size())), bytes);
  ASSERT_TRUE(sd.ok()) << sd.status();
  expect_matches_torch(*sd, "aligned4096");
  for (const auto& nt : sd->tensors()) {
    const auto* p = reinterpret_cast<const char*>(nt.tensor.storage().bytes.data());
    EXPECT_EQ((p - bytes->data()) % 4096, 0) << nt.name;
  }
}

// Every real file loads with a 64th of the default memory budget (4 MiB): resnet18 and a
// 1000-parameter model have room to spare, and a budget too small is refused by name.
TEST(StateDictMemory, RealFilesFitTheDefaultBudgetWithRoomToSpare) {
  LoadOptions small;
  small.max_pickle_memory = LoadOptions{}.max_pickle_memory / 64;
  for (const char* f : {"resnet18.pt", "wide1000.pt", "checkpoint.pt", "dtypes.pt", "views.pt",
                        "nested.pt", "handmade.pt", "dtypes_big.pt", "views_zip64.pt"}) {
    SCOPED_TRACE(f);
    auto sd = StateDict::open(fixture(f), small);
    ASSERT_TRUE(sd.ok()) << sd.status();
  }
  const StateDict wide = open_ok("wide1000.pt");
  ASSERT_EQ(wide.tensors().size(), 1000u);
  EXPECT_EQ(wide.tensors()[0].name, "0.weight");
  EXPECT_EQ(wide.tensors()[999].name, "499.bias");

  LoadOptions tiny;
  tiny.max_pickle_memory = 64u << 10;
  auto refused = StateDict::open(fixture("resnet18.pt"), tiny);
  ASSERT_FALSE(refused.ok());
  const std::string msg(refused.status().message());
  EXPECT_NE(msg.find("pt pickle: unpickling memory would reach "), std::string::npos) << msg;
  EXPECT_NE(msg.find("over the limit of 65536 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("raise LoadOptions::max_pickle_memory (crucible pt: --max-pickle-memory N)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(fixture("resnet18.pt")), std::string::npos) << "names the file: " << msg;
}

// torch.save after torch.serialization.set_crc32_options(False): every CRC-32 field is 0.
TEST(StateDictZeroCrc, RefusedSayingWhyThenLoadedUnverifiedWhenAllowed) {
  auto refused = StateDict::open(fixture("zero_crc.pt"));
  ASSERT_FALSE(refused.ok());
  const std::string msg(refused.status().message());
  EXPECT_NE(msg.find("cannot be verified: every CRC-32 field of this archive is 0, as torch.save "
                     "writes under torch.serialization.set_crc32_options(False)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("LoadOptions::allow_zero_crc (crucible pt: --allow-zero-crc)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("re-save it with torch.serialization.set_crc32_options(True)"),
            std::string::npos)
      << msg;
  LoadOptions allow;
  allow.allow_zero_crc = true;
  auto sd = StateDict::open(fixture("zero_crc.pt"), allow);
  ASSERT_TRUE(sd.ok()) << sd.status();
  EXPECT_TRUE(sd->crc_unverified());
  expect_matches_torch(*sd, "zero_crc");
  // Checked files stay checked.
  auto checked = StateDict::open(fixture("views.pt"), allow);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_FALSE(checked->crc_unverified());
}

TEST(StateDict, MissingFileNamesThePath) {
  auto sd = StateDict::open(fixture("no_such_file.pt"));
  ASSERT_FALSE(sd.ok());
  EXPECT_NE(sd.status().message().find("no_such_file.pt"), std::string::npos);
}

}  // namespace
