// ContentHash.cpp — ContentHash over XXH3-128 (xxhash.h, compiled in: Note [Inlined XXH3]).
#include "crucible/core/ContentHash.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <new>
#include <random>

// Note [Inlined XXH3]: the implementation from Debian's xxhash.h, compiled here with the build's
// target flags, instead of the calls into libxxhash.so (built for baseline x86-64: SSE2, and a
// PLT call per hash). The digests are the same (XXH3 is one algorithm however it is
// vectorised; a test compares inputs up to 1 MiB with libxxhash.so's). On resnet18's step an
// 8 KB hash (the DAG's root) took 0.60 us through the library and 0.18 us inlined with AVX-512
// (-march=native), and the structure key 22.5 against 20.5 us (alternating runs, warm).
#define XXH_INLINE_ALL  // implies XXH_STATIC_LINKING_ONLY: XXH3_state_t's definition, held inline
// GCC 12 warns that an AVX-512 intrinsic's operand "may be used uninitialized" inside xxhash.h's
// streaming update (a false positive in that header's code). Clang has no such warning group.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <xxhash.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace crucible {
namespace {
XXH3_state_t* st(unsigned char* p) { return reinterpret_cast<XXH3_state_t*>(p); }

void put_le64(unsigned char* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
}  // namespace

std::string ContentHash::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kDigits[(hi >> (4 * i)) & 0xF];
    s[31 - i] = kDigits[(lo >> (4 * i)) & 0xF];
  }
  return s;
}

ContentHasher& ContentHasher::update_slow(const void* data, std::size_t n) {
  static_assert(sizeof(XXH3_state_t) <= kStateBytes && alignof(XXH3_state_t) <= 64,
                "ContentHasher::kStateBytes must hold XXH3_state_t");
  if (!streaming_) {
    XXH3_INITSTATE(st(state_));
    XXH3_128bits_reset_withSeed(st(state_), seed_);
    streaming_ = true;
  }
  if (pending_n_ != 0) XXH3_128bits_update(st(state_), pending_, pending_n_);
  pending_n_ = 0;
  if (n < kPending) {
    std::memcpy(pending_, data, n);
    pending_n_ = n;
  } else {
    XXH3_128bits_update(st(state_), data, n);
  }
  return *this;
}

ContentHash ContentHasher::digest() const {
  XXH128_hash_t h;
  if (!streaming_) {
    h = XXH3_128bits_withSeed(pending_, pending_n_, seed_);
  } else {
    // A copy of the state, so that more updates may follow this digest.
    alignas(64) unsigned char copy[kStateBytes];
    std::memcpy(copy, state_, sizeof(XXH3_state_t));
    if (pending_n_ != 0) XXH3_128bits_update(st(copy), pending_, pending_n_);
    h = XXH3_128bits_digest(st(copy));
  }
  return ContentHash{h.low64, h.high64};
}

ContentHash content_hash(std::span<const std::byte> bytes, std::uint64_t seed) {
  XXH128_hash_t h = XXH3_128bits_withSeed(bytes.data(), bytes.size(), seed);
  return ContentHash{h.low64, h.high64};
}
ContentHash content_hash(std::string_view s, std::uint64_t seed) {
  XXH128_hash_t h = XXH3_128bits_withSeed(s.data(), s.size(), seed);
  return ContentHash{h.low64, h.high64};
}

ContentHash combine(const ContentHash& a, const ContentHash& b) {
  unsigned char buf[32];
  put_le64(buf, a.lo);
  put_le64(buf + 8, a.hi);
  put_le64(buf + 16, b.lo);
  put_le64(buf + 24, b.hi);
  XXH128_hash_t h = XXH3_128bits(buf, sizeof buf);
  return ContentHash{h.low64, h.high64};
}

std::uint64_t hash64(std::string_view s, std::uint64_t seed) {
  return XXH3_64bits_withSeed(s.data(), s.size(), seed);
}

std::uint64_t table_seed() {
  static const std::uint64_t seed = []() -> std::uint64_t {
    try {
      std::random_device rd;
      return std::uint64_t{rd()} << 32 ^ rd();
    } catch (const std::exception&) {  // no entropy source: the clock and an address (ASLR)
      static const int here = 0;
      return static_cast<std::uint64_t>(
                 std::chrono::steady_clock::now().time_since_epoch().count()) ^
             static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&here)) *
                 0x9E3779B97F4A7C15ull;
    }
  }();
  return seed;
}

}  // namespace crucible
