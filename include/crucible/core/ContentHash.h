// ContentHash.h — 128-bit content hashes (XXH3-128 from libxxhash) with a stable streaming API.
//
// "Stable" means: the same sequence of update_* calls gives the same hash on every run, in
// every process and on every little- or big-endian machine. Integers are fed as their
// little-endian bytes, never as raw host memory; strings are length-prefixed, so ("ab","c")
// and ("a","bc") differ. The hash of a composite (a DAG node) is built by feeding its parts,
// children's hashes included, into one ContentHasher: combine(a, b) is that for two hashes.
//
// XXH3-128 is not cryptographic: use it for caches and identity, SHA-256 for digests a user
// signs or compares across trust boundaries.
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace crucible {

struct ContentHash {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;

  constexpr auto operator<=>(const ContentHash&) const = default;
  [[nodiscard]] constexpr bool is_zero() const { return lo == 0 && hi == 0; }
  // 32 lowercase hex digits, high half first (the order xxhsum -H2 prints).
  std::string hex() const;
};
static_assert(sizeof(ContentHash) == 16);

class ContentHasher {
 public:
  explicit ContentHasher(std::uint64_t seed = 0);
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;

  ContentHasher& update_bytes(std::span<const std::byte> bytes);
  ContentHasher& update_bytes(const void* data, std::size_t n);
  ContentHasher& update_u8(std::uint8_t v);
  ContentHasher& update_u32(std::uint32_t v);
  ContentHasher& update_u64(std::uint64_t v);
  ContentHasher& update_i64(std::int64_t v) { return update_u64(static_cast<std::uint64_t>(v)); }
  ContentHasher& update_f64(double v);               // IEEE-754 bits; -0.0 != 0.0, NaNs by bits
  ContentHasher& update_string(std::string_view s);  // length-prefixed
  ContentHasher& update_hash(const ContentHash& h);  // lo then hi, little-endian

  // The hash of everything fed so far. Can be called again after more updates.
  [[nodiscard]] ContentHash digest() const;

 private:
  // XXH3_state_t lives inline (576 bytes, 64-aligned; checked in ContentHash.cpp) so a hasher
  // costs no heap allocation: the graph stage makes several per node.
  static constexpr std::size_t kStateBytes = 640;
  alignas(64) mutable unsigned char state_[kStateBytes];
  // Small updates (a u32, a dim) gather here and reach XXH3 in 256-byte chunks: one library
  // call per chunk instead of per field. Chunking does not change the hash.
  void flush() const;
  mutable unsigned char pending_[256];
  mutable std::size_t pending_n_ = 0;
};

// One-shot XXH3-128 of a byte string.
ContentHash content_hash(std::span<const std::byte> bytes, std::uint64_t seed = 0);
ContentHash content_hash(std::string_view s, std::uint64_t seed = 0);

// Order-sensitive combination of two hashes: combine(a, b) != combine(b, a) in general.
ContentHash combine(const ContentHash& a, const ContentHash& b);

// 64-bit XXH3 of a string, for schema identity ("aten::add.Tensor").
std::uint64_t hash64(std::string_view s, std::uint64_t seed = 0);

}  // namespace crucible
