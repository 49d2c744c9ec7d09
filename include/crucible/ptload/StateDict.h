// StateDict.h — opens a torch.save .pt file without torch: tensors by name, plus the object tree.
//
// open() maps the file, validates the ZIP (ZipArchive), refuses TorchScript archives and legacy
// (pre-1.6, non-zip) files, runs the restricted unpickler (Unpickler) and resolves storages:
// stored records are viewed in place, deflated ones inflated, big-endian ones byte-swapped into
// an owned copy. Either the whole load succeeds or only an error comes back.
//
// Names: tensors anywhere in the tree are listed depth-first with their path joined by '.':
// {'model': {'fc.weight': t}, 'step': 3} lists "model.fc.weight"; list and tuple items are
// numbered ("layers.0"); a top-level tensor is named "". Two tensors whose paths spell the same
// name are refused (find() could not tell them apart).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/ptload/PickleValue.h"
#include "crucible/ptload/TensorView.h"

namespace crucible::ptload {

struct LoadOptions {
  // CRC-32 of every storage record is checked (zlib crc32, several GB/s); turn off to keep
  // stored records lazily paged in for very large files.
  bool verify_checksums = true;
  // Decompression bombs (Note [Inflation limits] in ZipArchive.cpp): data.pkl may be at most
  // this many bytes uncompressed (a pickle is about 200 bytes a tensor) ...
  std::uint64_t max_pickle_bytes = std::uint64_t{64} << 20;
  // ... and a deflated record over 1 MiB may inflate at most this many times its size in the
  // file (torch.save stores records uncompressed; real data deflates under 10:1).
  std::uint64_t max_inflate_ratio = 100;
  // Memory bombs: heap bytes the unpickler's objects, stack and memo, the object tree and the
  // tensor list may take together (UnpickleLimits::max_memory_bytes; Note [Unpickler memory
  // budget] in Unpickler.cpp). torch.save's pickles take 2-3 KB a tensor (about 100,000
  // tensors fit); one byte of a crafted pickle can ask for tens.
  std::uint64_t max_pickle_memory = std::uint64_t{256} << 20;
  // Load an archive whose every CRC-32 field is 0 (torch.save under
  // torch.serialization.set_crc32_options(False)) without verifying it; off, it is refused with
  // a message saying so. A single 0 among real checksums is still a mismatch.
  bool allow_zero_crc = false;
};

struct NamedTensor {
  std::string name;
  TensorView tensor;
};

class StateDict {
 public:
  static Result<StateDict> open(const std::string& path, const LoadOptions& options = {});
  // The same from bytes in memory; `owner` keeps them alive for the views (may be null when the
  // caller guarantees the bytes outlive every view).
  static Result<StateDict> from_bytes(std::span<const std::byte> bytes,
                                      std::shared_ptr<const void> owner,
                                      const LoadOptions& options = {});

  const PickleValue& root() const { return root_; }
  const std::vector<NamedTensor>& tensors() const { return tensors_; }
  const TensorView* find(std::string_view name) const;
  // True when the file's byteorder record said "big" (storages were swapped on load).
  bool big_endian_source() const { return big_endian_; }
  // True when the archive had no checksums (every CRC-32 field 0) and LoadOptions::allow_zero_crc
  // let it load unverified.
  bool crc_unverified() const { return crc_unverified_; }

 private:
  PickleValue root_;
  std::vector<NamedTensor> tensors_;  // in tree order
  bool big_endian_ = false;
  bool crc_unverified_ = false;
};

}  // namespace crucible::ptload
