// MappedFile.h — a read-only memory map of a whole file, shared by every view into it.
//
// Stored zip entries (the tensor storages torch.save writes) are viewed in place: no copy, and
// pages are read only when a tensor is touched. The map lives as long as any shared_ptr to it.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "crucible/core/Status.h"

namespace crucible::ptload {

class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE). An empty file maps to an empty span.
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const std::byte* data, std::size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const std::byte* data_;
  std::size_t size_;
};

}  // namespace crucible::ptload
