// fuzz_pt_zip.cpp — libFuzzer harness for the .pt path from raw bytes: ZIP reader, storage
// records and the restricted unpickler together (StateDict::from_bytes), plus every entry
// extracted. Any crash, sanitizer report or contract violation is a bug; errors are expected.
#include <cstddef>
#include <cstdint>
#include <span>

#include "crucible/ptload/StateDict.h"
#include "crucible/ptload/ZipArchive.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace crucible::ptload;
  const auto bytes = std::as_bytes(std::span<const std::uint8_t>(data, size));
  if (auto zip = ZipArchive::parse(bytes); zip.ok()) {
    // Each entry twice: unbounded, and under the limits StateDict applies to data.pkl.
    InflateLimits limits;
    limits.max_bytes = LoadOptions{}.max_pickle_bytes;
    limits.max_ratio = LoadOptions{}.max_inflate_ratio;
    for (const ZipEntry& e : zip->entries()) {
      if (zip->find(e.name) != &e) __builtin_trap();  // names are unique and findable
      const auto whole = zip->extract(e);
      const auto bounded = zip->extract(e, limits);
      if (bounded.ok() && (!whole.ok() || *whole != *bounded)) __builtin_trap();
    }
  }
  auto sd = StateDict::from_bytes(bytes, nullptr);
  if (sd.ok()) {
    // Whatever loads must be safe to read in full.
    for (const auto& nt : sd->tensors()) {
      const auto f = nt.tensor.materialize_f32();
      if (f.size() != static_cast<std::size_t>(nt.tensor.numel())) __builtin_trap();
      if (sd->find(nt.name) == nullptr) __builtin_trap();
    }
    (void)sd->root().repr();
  }
  // allow_zero_crc only skips checks, and only on an archive whose every CRC-32 field is 0.
  LoadOptions unverified;
  unverified.allow_zero_crc = true;
  auto sd2 = StateDict::from_bytes(bytes, nullptr, unverified);
  if (sd.ok() && (!sd2.ok() || sd2->tensors().size() != sd->tensors().size())) __builtin_trap();
  if (sd2.ok() && !sd2->crc_unverified() && !sd.ok()) __builtin_trap();
  return 0;
}
