// ShapeText.h — a tensor shape as text for messages: "[2, 3, 4]".
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace crucible {
inline std::string shape_text(std::span<const std::int64_t> sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}
}  // namespace crucible
