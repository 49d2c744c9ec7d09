// fixture_util.h — reads what make_fixtures.py wrote: file paths and PyTorch's expected values.
#pragma once

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace crucible::ptload::test {

// CRUCIBLE_PTLOAD_FIXTURES is the generator's output directory (a compile definition).
inline std::string fixture(const std::string& rel) {
  return std::string(CRUCIBLE_PTLOAD_FIXTURES) + "/" + rel;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline nlohmann::json manifest(const std::string& name) {
  const std::string text = read_file(fixture(name + ".json"));
  if (text.empty()) return nlohmann::json::object({{"tensors", nlohmann::json::array()}});
  return nlohmann::json::parse(text);
}

inline std::vector<float> expected_f32(const nlohmann::json& row) {
  const std::string raw = read_file(fixture(row["f32"].get<std::string>()));
  std::vector<float> out(raw.size() / sizeof(float));
  if (!raw.empty()) std::memcpy(out.data(), raw.data(), out.size() * sizeof(float));
  return out;
}

}  // namespace crucible::ptload::test
