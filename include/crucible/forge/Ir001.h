// Ir001.h — Forge's first IR: one recorded iteration as classified ops over symbolic-shape values.
//
// Built from a trace and the op indices of one iteration (graph::Iteration::ops). Values are the
// tensors the iteration reads and writes, identified like the TraceGraph does — by storage and
// version, plus the view geometry (a view and its base share storage and version) — never by data
// pointer. A value is produced by exactly one node or is external (parameter, gradient, optimizer
// state, batch input, constant, or "unknown" when the trace did not classify it).
//
// Shapes are ExprPool expressions. build_ir001() makes constant shapes from one recording;
// symbolize_batch() unifies two recordings of the same program at different batch sizes into one
// IR whose batch-proportional dims are k*B, so a plan can be instantiated for another batch.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "crucible/core/Status.h"
#include "crucible/core/OpTable.h"
#include "crucible/forge/ExprPool.h"
#include "crucible/record/Trace.h"

namespace crucible::forge {

inline constexpr std::uint32_t kNoNode = UINT32_MAX;

struct Value {
  std::vector<const Expr*> shape;
  std::int8_t dtype = -1;             // c10 ScalarType ordinal
  std::uint32_t producer = kNoNode;   // node that writes it, or kNoNode for an external
  std::uint32_t producer_output = 0;  // which output of the producer
  std::uint8_t external = 0;          // record::ExternalKind when external, 0 = unclassified
  std::uint64_t storage = 0;          // storage identity (aliasing), 0 for none
  std::uint32_t version = 0;
  bool is_view = false;
  bool live_out = false;              // observable after the iteration (see Note [Live-out])
  std::int64_t nbytes = 0;            // at the recorded batch size
  // As recorded (Ir001::recorded_geometry says whether they still hold): what an execution plan
  // needs to place the tensor in its storage's memory.
  std::vector<std::int64_t> strides;  // in elements, one per dim
  std::int64_t storage_offset = 0;    // in elements
  std::uint64_t storage_nbytes = 0;   // the storage's size
  bool wrapped_number = false;        // a Python number made a 0-d tensor
  double wrapped_value = 0;           // its value when wrapped_number
};

// Where a tensor sits among its op's schema arguments (inputs) or returns (outputs): the
// position, and the index inside a tensor list. What a library call needs to rebuild the op's
// arguments.
struct ArgPosition {
  std::uint32_t arg = 0;
  std::uint32_t list = 0;
};

struct Node {
  std::uint64_t schema_hash = 0;
  std::string op;                     // "aten::addmm", as recorded
  CKernel kind = CKernel::Opaque;
  std::string_view opaque_reason;     // non-empty iff kind == Opaque
  record::Phase phase = record::Phase::Forward;
  std::uint32_t module_id = 0;
  std::vector<std::uint32_t> inputs;   // value ids, schema order
  std::vector<std::uint32_t> outputs;  // value ids
  std::vector<ArgPosition> input_args;   // parallel to inputs (empty in hand-built IR)
  std::vector<ArgPosition> output_args;  // parallel to outputs (empty in hand-built IR)
  std::vector<record::ScalarRecord> scalars;
  // Per scalar (empty, or scalars.size() entries): the symbolic value of an int argument that
  // scales with the batch (a view's size, a split length), set by symbolize_batch; else nullptr.
  std::vector<const Expr*> scalar_exprs;
  bool mutates = false;               // writes one of its inputs (in-place / out= / optimizer)
  bool grad_mode = false;             // autograd's grad mode was on when it ran
  bool in_place = false;              // canonicalize: "add_" style, writes inputs[0]
  std::uint32_t alias_of = UINT32_MAX;  // canonicalize: View output aliases this input value
  std::size_t trace_op = 0;           // index in the trace
  std::int64_t flops = 0;             // estimated at the recorded shapes (Note [Cost model])
  std::int64_t bytes = 0;             // bytes read + written at the recorded shapes
};

// Note [Live-out]: a value is live-out when it may be observed after the iteration: it is a
// write to external storage (parameters, gradients, optimizer state, buffers updated in place —
// a view of a parameter at its incoming version is not; only the storage's last version written
// in the iteration: an earlier one is overwritten before anyone can see it), or no node of the
// iteration reads it (Python may hold it: the loss, logits). Dead-code elimination keeps every node a live-out value
// depends on, every node that mutates, and every RNG, OPAQUE and COLLECTIVE node.
struct Ir001 {
  ExprPool* pool = nullptr;
  std::vector<Node> nodes;    // execution order
  std::vector<Value> values;
  std::vector<std::string> module_paths;  // module_id -> path (from the trace)
  std::int64_t batch_size = 0;            // the recorded batch (0 if unknown)
  bool symbolic = false;                  // shapes mention the batch symbol
  // Whether every value's strides, offset and storage size are those of its shape (built from
  // one recording). symbolize_batch keeps the first recording's and clears this; instantiate
  // does not set it again.
  bool recorded_geometry = true;
};

struct BuildOptions {
  // Refuse (instead of marking OPAQUE with a reason) ops missing from the op table.
  bool strict_op_table = false;
};

Result<Ir001> build_ir001(const record::Trace& t, std::span<const std::size_t> ops, ExprPool& pool,
                          const BuildOptions& options = {});

// Unifies two IRs of the same program recorded at batch sizes a.batch_size != b.batch_size: same
// nodes, same value graph, dims and int scalar arguments equal or proportional to the batch (then
// k*B). Anything else is an error naming the first node and dim or argument that differ.
Result<Ir001> symbolize_batch(const Ir001& a, const Ir001& b, ExprPool& pool,
                              std::string_view symbol = "B");
// One symbol of symbolize_sizes: its name, its values in the two recordings, and the batch input
// dim it was first seen at.
struct SizeSymbol {
  std::string name;
  std::int64_t a = 0, b = 0;
  std::uint32_t value = 0, dim = 0;
};
// Unifies two IRs of one program recorded at other sizes of its batch inputs (a batch, a sequence
// length): each distinct pair of values a batch input's dim takes is a symbol ("B" for the leading
// dim at the recorded batch sizes, else S, T, U, V, S4, ...), and every dim and int scalar argument
// that differs is its first one-parameter fit of them (Note [Size symbols]: S + d, c*S, c*S*T with c
// rational, "(3*S)//2" only where both values divide). Sizes 0 and 1 are never symbols. Anything
// else is an error naming the first value or argument no fit explains. Two recordings cannot tell
// fits apart that agree at both (a size S*T where S and T vary together), nor a rounded division
// (S//2 at two even S): instantiate at a third size and compare where it matters.
Result<Ir001> symbolize_sizes(const Ir001& a, const Ir001& b, ExprPool& pool,
                              std::vector<SizeSymbol>* symbols = nullptr);
// The IR with every symbol bound (shapes constant again).
Result<Ir001> instantiate(const Ir001& ir, const std::map<std::string, std::int64_t, std::less<>>& bindings);

// Structural checks: ids in range, each value produced at most once and before use, producers
// consistent, views alias an input, OPAQUE nodes have a reason, shapes non-negative where constant.
Status verify(const Ir001& ir);

}  // namespace crucible::forge
