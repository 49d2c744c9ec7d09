// ContentHash.h — 128-bit content hashes (XXH3-128, from xxhash.h) with a stable streaming API.
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

#include <bit>
#include <compare>
#include <cstring>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

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
  explicit ContentHasher(std::uint64_t seed = 0) : seed_(seed) {}
  ~ContentHasher() = default;
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;

  ContentHasher& update_bytes(std::span<const std::byte> bytes) { return update_bytes(bytes.data(), bytes.size()); }
  ContentHasher& update_bytes(const void* data, std::size_t n) {
    if (n == 0) return *this;  // data may be null (an empty span): no memcpy from it
    if (pending_n_ + n > kPending) return update_slow(data, n);
    std::memcpy(pending_ + pending_n_, data, n);
    pending_n_ += n;
    return *this;
  }
  ContentHasher& update_u8(std::uint8_t v) { return update_bytes(&v, 1); }
  ContentHasher& update_u32(std::uint32_t v) {
    if constexpr (std::endian::native != std::endian::little) v = byteswap32(v);
    return update_bytes(&v, 4);
  }
  ContentHasher& update_u64(std::uint64_t v) {
    if constexpr (std::endian::native != std::endian::little) v = byteswap64(v);
    return update_bytes(&v, 8);
  }
  ContentHasher& update_i64(std::int64_t v) { return update_u64(static_cast<std::uint64_t>(v)); }
  // The same bytes as update_u64(w) for each word in turn, written with one bounds check and
  // one update of the fill count. Hot loops (a node's metadata: a dozen fields per tensor)
  // pack fields into words and feed them here: a separate update per field reloads and stores
  // the fill count each time, and that chain cost more than the hashing.
  template <class... W>
  ContentHasher& update_words(W... words) {
    static_assert((std::is_same_v<W, std::uint64_t> && ...), "update_words takes std::uint64_t words");
    constexpr std::size_t kBytes = 8 * sizeof...(W);
    std::size_t n = pending_n_;
    if (n + kBytes > kPending) {
      (update_u64(words), ...);
      return *this;
    }
    unsigned char* out = pending_ + n;
    ((store_le64(out, words), out += 8), ...);
    pending_n_ = n + kBytes;
    return *this;
  }
  // Each element as update_i64 would feed it (one copy on little-endian hosts).
  ContentHasher& update_i64s(std::span<const std::int64_t> v) {
    if constexpr (std::endian::native == std::endian::little) return update_bytes(v.data(), v.size_bytes());
    for (std::int64_t x : v) update_i64(x);
    return *this;
  }
  // Each word as update_u64 would feed it (one copy on little-endian hosts).
  ContentHasher& update_u64s(std::span<const std::uint64_t> v) {
    if constexpr (std::endian::native == std::endian::little)
      return update_bytes(v.data(), v.size_bytes());
    for (std::uint64_t x : v) update_u64(x);
    return *this;
  }
  ContentHasher& update_f64(double v) { return update_u64(std::bit_cast<std::uint64_t>(v)); }  // -0.0 != 0.0, NaNs by bits
  ContentHasher& update_string(std::string_view s) {  // length-prefixed
    update_u64(s.size());
    return update_bytes(s.data(), s.size());
  }
  ContentHasher& update_hash(const ContentHash& h) { return update_u64(h.lo).update_u64(h.hi); }  // lo then hi

  // The hash of everything fed so far. Can be called again after more updates.
  [[nodiscard]] ContentHash digest() const;

 private:
  static constexpr std::uint32_t byteswap32(std::uint32_t v) {
    return (v >> 24) | ((v >> 8) & 0xFF00u) | ((v << 8) & 0xFF0000u) | (v << 24);
  }
  static constexpr std::uint64_t byteswap64(std::uint64_t v) {
    return (static_cast<std::uint64_t>(byteswap32(static_cast<std::uint32_t>(v))) << 32) | byteswap32(static_cast<std::uint32_t>(v >> 32));
  }
  ContentHasher& update_slow(const void* data, std::size_t n);
  static void store_le64(unsigned char* out, std::uint64_t v) {
    if constexpr (std::endian::native != std::endian::little) v = byteswap64(v);
    std::memcpy(out, &v, 8);
  }

  // Note [Lazy XXH3 state]: most hashes here are short (a DAG node's local description is
  // 100-200 bytes), and one-shot XXH3-128 over them gives the same digest as the streaming API.
  // So bytes gather in pending_ and the 576-byte XXH3 state (whose reset copies a 192-byte
  // secret) is set up only once more than kPending bytes arrive; the graph stage makes several
  // hashers per node, and building a state each time cost about half of the DAG's build time.
  static constexpr std::size_t kPending = 1024;
  static constexpr std::size_t kStateBytes = 640;
  std::uint64_t seed_;
  std::size_t pending_n_ = 0;
  bool streaming_ = false;  // state_ holds everything before pending_
  unsigned char pending_[kPending];
  alignas(64) unsigned char state_[kStateBytes];
};

// Words for one ContentHasher, gathered in a local array and fed in runs of up to 64: the same
// bytes as update_u64 per word. For loops that feed a word or two per step (a region's members
// and edges): each update_* reloads and stores the hasher's fill count, which the compiler
// cannot keep in a register across the byte copies into the same object, so a loop of single
// updates runs at the store-to-load latency per word. Here the count is a local; hashing
// resnet18's 504 node hashes (the DAG's root) took 2.7 us word by word, 0.9 us through a WordBatch.
class WordBatch {
 public:
  explicit WordBatch(ContentHasher& h) : h_(h) {}
  ~WordBatch() { flush(); }
  WordBatch(const WordBatch&) = delete;
  WordBatch& operator=(const WordBatch&) = delete;
  void add(std::uint64_t w) {
    if (n_ == kWords) [[unlikely]] flush();
    words_[n_++] = w;
  }
  // Feeds what is gathered (call before reading the hasher's digest).
  void flush() {
    h_.update_u64s({words_, n_});
    n_ = 0;
  }

 private:
  static constexpr std::uint32_t kWords = 64;
  ContentHasher& h_;
  std::uint32_t n_ = 0;  // not a std::uint64_t: stores to words_ cannot alias it
  std::uint64_t words_[kWords];
};

// One-shot XXH3-128 of a byte string.
ContentHash content_hash(std::span<const std::byte> bytes, std::uint64_t seed = 0);
ContentHash content_hash(std::string_view s, std::uint64_t seed = 0);

// Order-sensitive combination of two hashes: combine(a, b) != combine(b, a) in general.
ContentHash combine(const ContentHash& a, const ContentHash& b);

// 64-bit XXH3 of a string, for schema identity ("aten::add.Tensor").
std::uint64_t hash64(std::string_view s, std::uint64_t seed = 0);

// Note [Seeded table hash]
// Open-addressed tables keyed by ids that input controls (a loaded trace's storage ids, a C
// host's buffer ids) place keys by table_hash(id, table_seed()) (the wiring log: of id >> 6,
// keeping runs of 64 ids together): the murmur3 finalizer of the id xor a seed drawn once per
// process. A fixed multiplicative hash is a bijection anyone can
// invert, so a file could put every id in one slot and make each probe walk the table; with
// an unknown seed no set of ids is known to collide. For placement only: it differs between
// processes, and nothing stable (a content hash, a key) may depend on it.
std::uint64_t table_seed();
inline std::uint64_t table_hash(std::uint64_t id, std::uint64_t seed) {
  std::uint64_t x = id ^ seed;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace crucible
