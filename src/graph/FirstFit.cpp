// FirstFit.cpp — the memory plan's first-fit walk, scalar and four blocks at a time (AVX2).
#include "crucible/graph/FirstFit.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "crucible/core/Contract.h"

namespace crucible::graph {

void PlacedBlocks::reserve(std::size_t n) {
  offset.reserve(n);
  end.reserve(n);
  first.reserve(n);
  last.reserve(n);
}

void PlacedBlocks::insert(std::size_t at, std::uint64_t off, std::uint64_t block_end,
                          std::uint32_t first_use, std::uint32_t last_use) {
  const auto i = static_cast<std::ptrdiff_t>(at);
  offset.insert(offset.begin() + i, off);
  end.insert(end.begin() + i, block_end);
  first.insert(first.begin() + i, first_use);
  last.insert(last.begin() + i, last_use);
}

Fit first_fit_scalar(const PlacedBlocks& placed, std::uint64_t bytes, std::uint32_t first_use,
                     std::uint32_t last_use, std::size_t from, std::uint64_t off) {
  const std::size_t n = placed.size();
  const std::uint64_t* offset = placed.offset.data();
  const std::uint64_t* end = placed.end.data();
  const std::uint32_t* first = placed.first.data();
  const std::uint32_t* last = placed.last.data();
  std::size_t i = from;
  for (; i < n; ++i) {
    if (off + bytes <= offset[i]) break;
    // Branch-free: whether two lifetimes intersect is close to a coin toss per pair (resnet18's
    // step: 10k of its 29k block pairs live together); as two branches the plan measured about
    // 4% slower there.
    const std::uint64_t live_together = static_cast<std::uint64_t>(first[i] <= last_use) &
                                        static_cast<std::uint64_t>(first_use <= last[i]);
    const std::uint64_t e = end[i] & (0 - live_together);  // 0 when they are not
    off = e > off ? e : off;
  }
  return Fit{off, i};
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace {
// AVX2 where the build targets it (the release preset's -march=native); otherwise compiled for
// AVX2 anyway and chosen at run time (first_fit), so that the presets without -march (the
// sanitizer builds) test this walk too, with the other maximum below.
#if defined(__AVX2__)
#define CRUCIBLE_AVX2
#else
#define CRUCIBLE_AVX2 [[gnu::target("avx2")]]
#endif
// Lanes as signed 64-bit: every value is below 2^62 (PlacedBlocks). The maximum is on the
// carried chain: one instruction with AVX-512VL, a compare and a blend without (the walk then
// measured 41.3 against 37.9 us on resnet18's step).
CRUCIBLE_AVX2 inline __m256i max64(__m256i a, __m256i b) {
#if defined(__AVX512VL__)
  return _mm256_max_epi64(a, b);
#else
  return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a));
#endif
}
// [0, x0, x1, x2] and [0, 0, x0, x1].
CRUCIBLE_AVX2 inline __m256i up1(__m256i x) {
  return _mm256_blend_epi32(_mm256_permute4x64_epi64(x, 0x90), _mm256_setzero_si256(), 0x03);
}
CRUCIBLE_AVX2 inline __m256i up2(__m256i x) {
  return _mm256_blend_epi32(_mm256_permute4x64_epi64(x, 0x40), _mm256_setzero_si256(), 0x0F);
}
CRUCIBLE_AVX2 __m256i load4(const std::uint64_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
CRUCIBLE_AVX2 __m256i load4(const std::uint32_t* p) {  // zero-extended to 64-bit lanes
  return _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

CRUCIBLE_AVX2 Fit first_fit_avx2(const PlacedBlocks& placed, std::uint64_t bytes,
                                 std::uint32_t first_use, std::uint32_t last_use) {
  const std::size_t n = placed.size();
  const __m256i vbytes = _mm256_set1_epi64x(static_cast<long long>(bytes));
  const __m256i vfirst = _mm256_set1_epi64x(first_use), vlast = _mm256_set1_epi64x(last_use);
  __m256i voff = _mm256_setzero_si256();  // the candidate offset in every lane
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i f = load4(placed.first.data() + i), l = load4(placed.last.data() + i);
    const __m256i apart =
        _mm256_or_si256(_mm256_cmpgt_epi64(f, vlast), _mm256_cmpgt_epi64(vfirst, l));
    const __m256i live_end = _mm256_andnot_si256(apart, load4(placed.end.data() + i));  // 0: apart
    // Running maximum of the four live ends, without the carried offset (off the chain).
    __m256i run = max64(live_end, up1(live_end));
    run = max64(run, up2(run));
    // Before block k the candidate is max(off, ends of blocks 0..k-1); the walk stops at the
    // first k where candidate + bytes <= offset[k].
    const __m256i before = max64(up1(run), voff);
    const __m256i go_on =
        _mm256_cmpgt_epi64(_mm256_add_epi64(before, vbytes), load4(placed.offset.data() + i));
    const int stop = ~_mm256_movemask_pd(_mm256_castsi256_pd(go_on)) & 0xF;
    if (stop != 0) [[unlikely]] {
      alignas(32) std::uint64_t lanes[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), before);
      const int k = __builtin_ctz(static_cast<unsigned>(stop));
      return Fit{lanes[k], i + static_cast<std::size_t>(k)};
    }
    voff = _mm256_permute4x64_epi64(max64(run, voff), 0xFF);  // after block i + 3
  }
  return first_fit_scalar(placed, bytes, first_use, last_use, i,
                          static_cast<std::uint64_t>(_mm256_extract_epi64(voff, 0)));
}
#undef CRUCIBLE_AVX2
}  // namespace

bool first_fit_is_vector() {
#if defined(__AVX2__)
  return true;
#else
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#endif
}

Fit first_fit(const PlacedBlocks& placed, std::uint64_t bytes, std::uint32_t first_use,
              std::uint32_t last_use) {
  CRUCIBLE_PRE(bytes < kMaxPlacedBytes, "sizes stay below 2^62 (plan_memory refuses larger)");
  if (first_fit_is_vector()) return first_fit_avx2(placed, bytes, first_use, last_use);
  return first_fit_scalar(placed, bytes, first_use, last_use);
}
#else
bool first_fit_is_vector() { return false; }

Fit first_fit(const PlacedBlocks& placed, std::uint64_t bytes, std::uint32_t first_use,
              std::uint32_t last_use) {
  CRUCIBLE_PRE(bytes < kMaxPlacedBytes, "sizes stay below 2^62 (plan_memory refuses larger)");
  return first_fit_scalar(placed, bytes, first_use, last_use);
}
#endif

}  // namespace crucible::graph
