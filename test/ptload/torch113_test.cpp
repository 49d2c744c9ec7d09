// torch113_test.cpp — files torch 1.13.1 wrote (committed in fixtures-1.13/) load as it saw them.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "crucible/ptload/StateDict.h"
#include "crucible/ptload/ZipArchive.h"

namespace {
using namespace crucible::ptload;
using K = PickleValue::Kind;

// CRUCIBLE_PTLOAD_FIXTURES_113 is test/ptload/fixtures-1.13 in the source tree.
std::string path_of(const std::string& name) {
  return std::string(CRUCIBLE_PTLOAD_FIXTURES_113) + "/" + name;
}

nlohmann::json expected(const std::string& file) {
  std::ifstream in(path_of("expected.json"));
  const auto all = nlohmann::json::parse(in);
  EXPECT_EQ(all["torch"].get<std::string>().rfind("1.13", 0), 0u) << "written by torch 1.13";
  return all["files"][file];
}

// Every tensor torch 1.13 listed, in its order, with its metadata and bit-identical float32
// values; tensors torch says share a storage share one here, and only those.
void expect_as_torch_saw(const StateDict& sd, const nlohmann::json& want) {
  ASSERT_EQ(sd.tensors().size(), want["tensors"].size());
  std::map<int, const TensorStorage*> storages;
  for (std::size_t i = 0; i < sd.tensors().size(); ++i) {
    const auto& row = want["tensors"][i];
    const auto& [name, t] = sd.tensors()[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(name, row["name"].get<std::string>());
    EXPECT_EQ(t.dtype_name(), row["dtype"].get<std::string>());
    EXPECT_EQ(std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end()),
              row["sizes"].get<std::vector<std::int64_t>>());
    EXPECT_EQ(std::vector<std::int64_t>(t.strides().begin(), t.strides().end()),
              row["strides"].get<std::vector<std::int64_t>>());
    EXPECT_EQ(t.storage_offset(), row["offset"].get<std::int64_t>());
    EXPECT_EQ(t.requires_grad(), row["requires_grad"].get<bool>());
    EXPECT_EQ(t.is_parameter(), row["parameter"].get<bool>());
    std::vector<float> values;  // non-finite values are written as "inf", "-inf", "nan"
    for (const auto& v : row["values"])
      values.push_back(v.is_string() ? std::stof(v.get<std::string>())
                                     : static_cast<float>(v.get<double>()));
    const auto got = t.materialize_f32();
    ASSERT_EQ(got.size(), values.size());
    EXPECT_TRUE(got.empty() || std::memcmp(got.data(), values.data(), got.size() * 4) == 0)
        << "float32 values differ from torch 1.13's";
    auto [it, fresh] = storages.emplace(row["storage"].get<int>(), &t.storage());
    EXPECT_EQ(it->second, &t.storage()) << "torch shares this storage with an earlier tensor";
    if (fresh) {
      for (const auto& [k, s] : storages) {
        EXPECT_TRUE(k == it->first || s != &t.storage()) << "torch keeps these storages apart";
      }
    }
  }
}

StateDict open_ok(const std::string& file) {
  auto sd = StateDict::open(path_of(file));
  if (!sd.ok()) {
    ADD_FAILURE() << sd.status();
    std::abort();
  }
  return std::move(*sd);
}

TEST(Torch113, StateDictOfEveryDtypeAndSharedViews) {
  const auto want = expected("state_dict.pt");
  EXPECT_EQ(want["records"], nlohmann::json({"data.pkl", "version"}))
      << "1.13 writes no byteorder or other 2.x records";
  const StateDict sd = open_ok("state_dict.pt");
  EXPECT_TRUE(sd.root().is_ordered_dict());
  EXPECT_FALSE(sd.big_endian_source()) << "no byteorder record: little-endian";
  expect_as_torch_saw(sd, want);
  EXPECT_EQ(&sd.find("base")->storage(), &sd.find("transposed")->storage());
  EXPECT_EQ(sd.find("sliced")->storage_offset(), 16);
}

TEST(Torch113, CheckpointWithOptimizerStatesParametersAndPlainValues) {
  const auto want = expected("checkpoint.pt");
  const StateDict sd = open_ok("checkpoint.pt");
  expect_as_torch_saw(sd, want);
  const auto& plain = want["plain"];
  const PickleValue& r = sd.root();
  EXPECT_EQ(r.get("epoch")->as_int(), plain["epoch"].get<std::int64_t>());
  EXPECT_EQ(r.get("lr")->as_float(), plain["lr"].get<double>());
  EXPECT_EQ(r.get("name")->as_string(), plain["name"].get<std::string>());
  EXPECT_EQ(r.get("flag")->as_bool(), plain["flag"].get<bool>());
  EXPECT_TRUE(r.get("nothing")->is(K::None));
  EXPECT_EQ(r.get("dt")->as_dtype(), 5) << "torch.float16";
  EXPECT_EQ(r.get("sz")->repr(), "(2, 3)");
  EXPECT_TRUE(r.get("big")->is(K::BigInt));
  const PickleValue& group = r.get("adam")->get("param_groups")->items()[0];
  EXPECT_EQ(group.get("lr")->as_float(), plain["adam_lr"].get<double>());
  std::vector<std::int64_t> params;
  for (const auto& p : group.get("params")->items()) params.push_back(p.as_int());
  EXPECT_EQ(params, plain["adam_params"].get<std::vector<std::int64_t>>());
  EXPECT_EQ(r.get("sgd")->get("param_groups")->items()[0].get("momentum")->as_float(),
            plain["sgd_momentum"].get<double>());
  const TensorView* step = sd.find("adam.state.0.step");
  ASSERT_NE(step, nullptr) << "Adam's step is a tensor since torch 1.12";
  EXPECT_EQ(step->ndim(), 0u);
  EXPECT_TRUE(sd.find("param")->is_parameter());
  EXPECT_TRUE(r.get("model")->attributes().get("_metadata") != nullptr);
}

}  // namespace
