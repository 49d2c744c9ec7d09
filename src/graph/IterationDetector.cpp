// IterationDetector.cpp — period search, anchoring and segment classification.
#include "crucible/graph/IterationDetector.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "crucible/core/ContentHash.h"

namespace crucible::graph {

std::size_t IterationReport::steady_count() const {
  return static_cast<std::size_t>(
      std::count_if(segments.begin(), segments.end(), [](const Segment& s) { return s.kind == 0; }));
}

long IterationReport::last_steady() const {
  for (std::size_t i = segments.size(); i-- > 0;)
    if (segments[i].kind == 0) return static_cast<long>(i);
  return -1;
}

std::uint64_t op_signature(const record::Trace& t, std::size_t op) {
  ContentHasher h;
  h.update_u64(t.ops[op].schema_hash);
  const std::size_t base = t.op_tensor_begin[op];
  for (std::size_t k = 0; k < t.ops[op].n_tensors; ++k) {
    const auto& m = t.tensors[base + k];
    h.update_u8(static_cast<std::uint8_t>(m.dtype)).update_u8(m.device_kind).update_u8(m.flags & record::tensor_flag::kOutput);
    h.update_i64s(t.sizes(base + k));
    h.update_u8(0xFF);  // separates tensors: [2,3][4] != [2][3,4]
  }
  return h.digest().lo;
}

std::vector<std::size_t> ops_of_thread(const record::Trace& t, std::uint32_t thread) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < t.num_ops(); ++i)
    if (t.ops[i].thread == thread) out.push_back(i);
  return out;
}

namespace {
ContentHash hash_range(std::span<const std::uint64_t> s, std::size_t b, std::size_t e) {
  ContentHasher h;
  for (std::size_t i = b; i < e; ++i) h.update_u64(s[i]);
  h.update_u64(e - b);
  return h.digest();
}
}  // namespace

IterationReport detect_iterations(std::span<const std::uint64_t> sig) {
  IterationReport r;
  const std::size_t n = sig.size();
  if (n < 2) {
    r.reason = "fewer than 2 ops: record at least two iterations";
    return r;
  }
  // 1. Period: for each P, L(P) = how many ops at the end equal the op P before them. A real
  // period repeats for a long stretch; a coincidence (the last two ops alike) does not. Pick
  // the P whose repetition covers the most ops (L + P), the smallest such P on ties (a
  // multiple of the period covers the same stretch), and require it to cover a third of the
  // sequence and at least two whole blocks.
  // L(P) for every P at once: the Z-array of the reversed sequence (O(n), no quadratic scan).
  std::vector<std::uint64_t> rev(sig.rbegin(), sig.rend());
  std::vector<std::size_t> z(n, 0);
  for (std::size_t i = 1, lo = 0, hi = 0; i < n; ++i) {
    if (i < hi) z[i] = std::min(hi - i, z[i - lo]);
    while (i + z[i] < n && rev[z[i]] == rev[i + z[i]]) ++z[i];
    if (i + z[i] > hi) {
      lo = i;
      hi = i + z[i];
    }
  }
  std::size_t period = 0, coverage = 0;
  for (std::size_t p = 1; 2 * p <= n; ++p) {
    const std::size_t l = z[p];
    if (l < p) continue;
    if (l + p > coverage) {
      coverage = l + p;
      period = p;
    }
  }
  if (period == 0 || 3 * coverage < n) {
    r.reason = "not periodic: " +
               (period == 0 ? std::string("no block of ops repeats at the end")
                            : "only the last " + std::to_string(coverage) + " ops repeat") +
               " of the " + std::to_string(n) + "-op sequence (record at least two identical "
               "iterations, or the loop's iterations really differ, e.g. data-dependent control flow)";
    return r;
  }
  // 2. Anchor. The repeating block may hold several iterations when some op occurs only every
  // N iterations (then the block is N iterations long). A signature occurring c >= 3 times in
  // the block is a good anchor if cutting the block (cyclically) at it gives segments of two
  // kinds — a steady kind c-1 times and a variant once that is the steady sequence plus
  // inserted ops (at most half as many again). The most frequent good anchor wins. Otherwise the block is one iteration and
  // the anchor is a signature occurring once in it. Among equals, the signature seen earliest
  // in the whole sequence wins: it starts the first iteration as early as the data allows.
  const std::size_t block_begin = n - period;
  // absl's hash is seeded per process: signatures come from a possibly crafted trace, and
  // std::hash on an integer is the integer.
  absl::flat_hash_map<std::uint64_t, std::vector<std::size_t>> where;
  for (std::size_t i = block_begin; i < n; ++i) where[sig[i]].push_back(i);
  absl::flat_hash_map<std::uint64_t, std::size_t> first_seen;
  for (std::size_t i = 0; i < n; ++i) first_seen.emplace(sig[i], i);
  std::vector<std::uint64_t> doubled(sig.begin() + static_cast<long>(block_begin), sig.end());
  doubled.insert(doubled.end(), sig.begin() + static_cast<long>(block_begin), sig.end());
  auto contains_in_order = [&](std::size_t sb, std::size_t se, std::size_t vb, std::size_t ve) {
    std::size_t k = sb;  // is doubled[sb, se) a subsequence of doubled[vb, ve)?
    for (std::size_t i = vb; i < ve && k < se; ++i) k += doubled[i] == doubled[k];
    return k == se;
  };
  // Candidates in order of preference (most occurrences, then seen earliest): the first that
  // passes is the anchor, as the best of all that pass would be. A candidate's segments are
  // compared by polynomial hashes of `doubled` (mod 2^61 - 1, base and element mixing seeded
  // per process: Note [Seeded table hash]), O(1) per segment, and it stops at its first
  // contradiction (a third kind, or two kinds seen twice each): the search costs the block's
  // length, not its square, whatever a loaded trace puts in it, except the subsequence check
  // (O(block)) of candidates that pass every other test. The kinds of the winner are then
  // hashed in full (ContentHash), as before.
  struct Candidate {
    std::size_t count, first, pos;
  };
  std::vector<Candidate> candidates;
  std::size_t single_pos = n, single_first = n;
  for (std::size_t i = block_begin; i < n; ++i) {
    const auto& occ = where[sig[i]];
    if (occ.front() != i) continue;  // each signature once, at its first occurrence
    const std::size_t c = occ.size(), first = first_seen[sig[i]];
    if (c == 1 && first < single_first) {
      single_pos = i;
      single_first = first;
    }
    if (c >= 3) candidates.push_back({c, first, i});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.count != b.count ? a.count > b.count : a.first < b.first;
  });
  constexpr std::uint64_t kMod = (std::uint64_t{1} << 61) - 1;
  auto mulmod = [](std::uint64_t a, std::uint64_t b) {
    __extension__ using U128 = unsigned __int128;  // GCC and clang: a 64 x 64 -> 128-bit product
    const U128 p = static_cast<U128>(a) * b;
    std::uint64_t r = static_cast<std::uint64_t>(p & kMod) + static_cast<std::uint64_t>(p >> 61);
    return r >= kMod ? r - kMod : r;
  };
  const std::uint64_t seed = table_seed();
  const std::uint64_t base = table_hash(1, seed) % (kMod - 2) + 2;
  std::vector<std::uint64_t> prefix(doubled.size() + 1, 0), power(doubled.size() + 1, 1);
  if (!candidates.empty())
    for (std::size_t i = 0; i < doubled.size(); ++i) {
      prefix[i + 1] = (mulmod(prefix[i], base) + table_hash(doubled[i], seed) % kMod) % kMod;
      power[i + 1] = mulmod(power[i], base);
    }
  auto segment = [&](std::size_t from, std::size_t to) {  // hash of doubled[from, to)
    const std::uint64_t sub = mulmod(prefix[from], power[to - from]);
    return prefix[to] >= sub ? prefix[to] - sub : prefix[to] + kMod - sub;
  };
  std::size_t anchor_pos = n, best_count = 0;
  std::vector<ContentHash> block_kinds;
  for (const Candidate& cand : candidates) {
    const auto& occ = where[sig[cand.pos]];
    const std::size_t c = cand.count;
    struct Kind {
      std::uint64_t h;
      std::size_t len, count, from, to;
    };
    std::vector<Kind> kinds;
    bool contradicted = false;
    for (std::size_t k = 0; k < c && !contradicted; ++k) {
      const std::size_t from = occ[k] - block_begin;
      const std::size_t to = k + 1 < c ? occ[k + 1] - block_begin : occ[0] - block_begin + period;
      const std::uint64_t h = segment(from, to);
      auto it = std::find_if(kinds.begin(), kinds.end(),
                             [&](const Kind& x) { return x.h == h && x.len == to - from; });
      if (it == kinds.end())
        kinds.push_back({h, to - from, 1, from, to});
      else ++it->count;
      contradicted =
          kinds.size() > 2 || (kinds.size() == 2 && kinds[0].count > 1 && kinds[1].count > 1);
    }
    if (contradicted || kinds.size() != 2) continue;
    const Kind& major = kinds[0].count >= kinds[1].count ? kinds[0] : kinds[1];
    const Kind& minor = kinds[0].count >= kinds[1].count ? kinds[1] : kinds[0];
    if (major.count + 1 != c || minor.count != 1) continue;
    // The variant is the steady iteration plus a few inserted ops (at most half as many again).
    const std::size_t major_len = major.to - major.from, minor_len = minor.to - minor.from;
    if (minor_len <= major_len || 2 * (minor_len - major_len) > major_len) continue;
    if (!contains_in_order(major.from, major.to, minor.from, minor.to)) continue;
    best_count = c;
    anchor_pos = cand.pos;
    block_kinds = {hash_range(doubled, major.from, major.to),
                   hash_range(doubled, minor.from, minor.to)};
    break;
  }
  if (best_count == 0 &&
      single_pos != n) {  // a signature that occurs once: the block is one iteration
    anchor_pos = single_pos;
    block_kinds = {hash_range(sig, anchor_pos - period, anchor_pos)};
  }
  if (anchor_pos == n) {
    r.reason = "not periodic: the repeating block of " + std::to_string(period) +
               " ops has no op at which it can be cut into iterations";
    return r;
  }
  const std::uint64_t anchor = sig[anchor_pos];
  std::vector<std::size_t> cuts;
  for (std::size_t i = 0; i < n; ++i)
    if (sig[i] == anchor) cuts.push_back(i);
  r.prologue_ops = cuts.front();
  for (std::size_t c = 0; c < cuts.size(); ++c) {
    Segment sg;
    sg.begin = cuts[c];
    sg.end = c + 1 < cuts.size() ? cuts[c + 1] : n;
    sg.hash = hash_range(sig, sg.begin, sg.end);
    r.segments.push_back(sg);
  }
  // 3. Kinds: 0 = steady; then the block's variant; then anything else, in order of appearance
  // (looked up by hash: a prologue can hold as many kinds as segments).
  std::map<std::pair<std::uint64_t, std::uint64_t>, int> kind_of;
  for (const ContentHash& h : block_kinds)
    kind_of.emplace(std::pair{h.lo, h.hi}, static_cast<int>(kind_of.size()));
  for (auto& sg : r.segments)
    sg.kind = kind_of.emplace(std::pair{sg.hash.lo, sg.hash.hi}, static_cast<int>(kind_of.size()))
                  .first->second;
  // A trailing segment of no known kind is a recording stopped mid-iteration: not an iteration.
  if (!r.segments.empty() && r.segments.back().kind >= static_cast<int>(block_kinds.size()))
    r.segments.pop_back();
  r.period_ops = period;
  if (const long last = r.last_steady(); last >= 0)
    r.period_ops = r.segments[static_cast<std::size_t>(last)].end - r.segments[static_cast<std::size_t>(last)].begin;
  r.periodic = r.steady_count() >= 1;
  r.first_differs = !r.segments.empty() && r.segments.front().kind != 0;
  // Variants: non-steady kinds (ignoring segment 0) recurring at a fixed stride.
  std::vector<std::size_t> variant_at;
  for (std::size_t i = 1; i < r.segments.size(); ++i)
    if (r.segments[i].kind != 0) variant_at.push_back(i);
  if (variant_at.size() >= 2) {
    const std::size_t stride = variant_at[1] - variant_at[0];
    bool regular = true;
    for (std::size_t k = 2; k < variant_at.size(); ++k) regular &= variant_at[k] - variant_at[k - 1] == stride;
    if (regular) r.variant_every = static_cast<int>(stride);
  }
  r.reason = std::to_string(r.segments.size()) + " iterations of " + std::to_string(period) +
             " ops (" + std::to_string(r.steady_count()) + " steady" +
             (r.first_differs ? ", the first differs" : "") +
             (r.variant_every ? ", a variant every " + std::to_string(r.variant_every) : "") + ")";
  return r;
}

}  // namespace crucible::graph
