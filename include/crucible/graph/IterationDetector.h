// IterationDetector.h — find training-loop iterations in a recorded op sequence.
//
// Input: one thread's ops. Each op gets a signature: hash of its schema and its tensors'
// shapes and dtypes (not addresses, not scalar values: a learning rate that changes does not
// make a new iteration). Boundaries come from signatures alone, so any frontend works:
//   1. the smallest period P whose last two blocks repeat exactly (P up to n/2);
//   2. the block is rotated to start at a signature that occurs once in it (the anchor), and
//      the whole sequence is cut at every occurrence of the anchor;
//   3. segments are grouped by their content hash: the steady kind is the one the last
//      segments share; the first segment may differ (gradients and optimizer state created);
//      a kind that recurs every N segments is a periodic variant (logging, a scheduler).
// A sequence with no repeating tail is reported as not periodic, with the reason: never guessed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "crucible/core/ContentHash.h"
#include "crucible/record/Trace.h"

namespace crucible::graph {

struct Segment {
  std::size_t begin = 0, end = 0;  // op positions in the input sequence, [begin, end)
  ContentHash hash;                // of the segment's signature sequence
  int kind = 0;                    // 0 = steady; 1.. = other kinds, in order of appearance
};

struct IterationReport {
  bool periodic = false;
  std::string reason;              // why not periodic, or a one-line summary when it is
  std::size_t period_ops = 0;      // ops in a steady iteration
  std::vector<Segment> segments;   // covers [first boundary, n); ops before it are a prologue
  std::size_t prologue_ops = 0;    // ops before the first boundary
  bool first_differs = false;      // segment 0 is not of the steady kind
  int variant_every = 0;           // >0: a non-steady kind recurs every this many segments
  std::size_t steady_count() const;
  // Index into `segments` of the last steady segment (the one to compile), or -1.
  long last_steady() const;
};

// Signature of one op: schema + (shape, dtype, device) of every tensor, inputs and outputs.
std::uint64_t op_signature(const record::Trace& t, std::size_t op);

IterationReport detect_iterations(std::span<const std::uint64_t> signatures);

// Ops of one recording thread, in order (indices into t.ops).
std::vector<std::size_t> ops_of_thread(const record::Trace& t, std::uint32_t thread);

}  // namespace crucible::graph
