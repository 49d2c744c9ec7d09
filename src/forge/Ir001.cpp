// Ir001.cpp — IR001 from a recorded iteration; batch symbolization and instantiation; costs and
// compaction shared by the passes.
#include "crucible/forge/Ir001.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <unordered_map>

#include "IrEdit.h"
#include "crucible/core/Contract.h"
#include "crucible/core/OpTable.h"
#include "crucible/core/ScalarType.h"
#include "crucible/core/ShapeText.h"

namespace crucible::forge {
namespace {

// Identity of a tensor as the iteration sees it: storage, version and view geometry.
using ValueKey = std::tuple<std::uint64_t, std::uint32_t, std::int64_t, std::vector<std::int64_t>,
                            std::vector<std::int64_t>, std::int8_t>;

// Shapes come from the trace, and a loaded .crtrace says what it likes (or a batch binding
// makes them large): every tensor is checked to hold at most 2^62 elements and bytes, with no
// negative dim, before its counts are used; the costs computed from them saturate.
constexpr std::int64_t kMaxTensorSize = std::int64_t{1} << 62;

std::int64_t sat_mul(std::int64_t a, std::int64_t b) {  // a, b >= 0
  std::int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}
std::int64_t sat_add(std::int64_t a, std::int64_t b) {  // a, b >= 0
  std::int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

// The byte size of a tensor of `sizes` and `dtype` (0 for a dtype of unknown size), or an
// error naming `what` when a dim is negative or the elements or bytes pass 2^62.
Result<std::int64_t> tensor_bytes(std::span<const std::int64_t> sizes, std::int8_t dtype, const std::string& what,
                                  std::string_view fix = "the trace is corrupt or not of a real program: record it again") {
  std::int64_t numel = 1;
  bool ok = true;
  for (std::int64_t d : sizes) ok = ok && d >= 0 && !__builtin_mul_overflow(numel, d, &numel) && numel <= kMaxTensorSize;
  auto es = element_size(dtype);
  std::int64_t bytes = 0;
  ok = ok && !__builtin_mul_overflow(numel, es.ok() ? static_cast<std::int64_t>(*es) : 0, &bytes) &&
       bytes <= kMaxTensorSize;
  if (!ok)
    return invalid_input(what + " has sizes " + shape_text(sizes) +
                             ": a negative dim, or more than 2^62 elements or bytes",
                         fix);
  return bytes;
}

// compute_costs runs on concrete IR only (build_ir001, instantiate): every dim is a constant.
std::int64_t eval_dim(const Expr* e) {
  CRUCIBLE_ASSERT(e->kind == Expr::Kind::Const, "costs are computed on concrete shapes");
  return e->kind == Expr::Kind::Const ? e->value : 0;
}

std::int64_t value_numel(const Ir001& ir, std::uint32_t v) {  // at most 2^62 (tensor_bytes)
  std::int64_t n = 1;
  for (const Expr* d : ir.values[v].shape) n = sat_mul(n, eval_dim(d));
  return n;
}

}  // namespace

namespace detail {

void compute_costs(Ir001& ir) {
  for (Node& n : ir.nodes) {
    std::int64_t in_bytes = 0, out_bytes = 0, in_elems = 0, out_elems = 0;
    for (std::uint32_t v : n.inputs) {
      in_bytes = sat_add(in_bytes, ir.values[v].is_view ? 0 : ir.values[v].nbytes);
      in_elems = std::max(in_elems, value_numel(ir, v));
    }
    for (std::uint32_t v : n.outputs) {
      out_bytes = sat_add(out_bytes, ir.values[v].is_view ? 0 : ir.values[v].nbytes);
      out_elems = std::max(out_elems, value_numel(ir, v));
    }
    const std::string_view base = op_base_name(n.op);
    std::int64_t flops = 0;
    switch (n.kind) {
      case CKernel::Gemm: {
        // 2 * numel(out) * k, k the contracted dim of the first matrix operand.
        const std::size_t m1 = (base == "addmm" || base == "baddbmm" || base == "addbmm") ? 1 : 0;
        if (n.inputs.size() > m1 && !n.outputs.empty() && !ir.values[n.inputs[m1]].shape.empty()) {
          const std::int64_t k = eval_dim(ir.values[n.inputs[m1]].shape.back());
          flops = sat_mul(2 * value_numel(ir, n.outputs[0]), std::max<std::int64_t>(k, 0));
        }
        break;
      }
      case CKernel::Conv: {
        // Forward: 2 * numel(out) * (numel(weight) / out_channels); backward: twice that (grad
        // input and grad weight), from grad_output and the weight.
        const bool backward = base.find("backward") != std::string_view::npos;
        const std::size_t w = backward ? 2 : 1;
        if (n.inputs.size() > w && !ir.values[n.inputs[w]].shape.empty()) {
          const std::int64_t oc = std::max<std::int64_t>(1, eval_dim(ir.values[n.inputs[w]].shape[0]));
          const std::int64_t per = value_numel(ir, n.inputs[w]) / oc;
          const std::int64_t out = backward ? value_numel(ir, n.inputs[0])
                                            : (n.outputs.empty() ? 0 : value_numel(ir, n.outputs[0]));
          flops = sat_mul(sat_mul(2 * out, per), backward ? 2 : 1);
        }
        break;
      }
      case CKernel::Norm: flops = sat_mul(5, std::max(in_elems, out_elems)); break;
      case CKernel::Softmax: flops = sat_mul(4, std::max(in_elems, out_elems)); break;
      case CKernel::Loss: flops = sat_mul(3, std::max(in_elems, out_elems)); break;
      case CKernel::OptimizerUpdate: flops = sat_mul(4, std::max(in_elems, out_elems)); break;
      case CKernel::Reduce:
      case CKernel::Pooling: flops = std::max(in_elems, out_elems); break;
      case CKernel::PointwiseUnary:
      case CKernel::PointwiseBinary:
      case CKernel::Rng: flops = out_elems; break;
      default: flops = 0; break;
    }
    n.flops = flops;
    // Views move nothing; factories (zero_, fill_, empty) only write, even when in place.
    n.bytes = n.kind == CKernel::View ? 0 : n.kind == CKernel::Factory ? out_bytes : sat_add(in_bytes, out_bytes);
  }
}

void replace_uses(Ir001& ir, std::uint32_t from, std::uint32_t to) {
  for (Node& n : ir.nodes) {
    for (std::uint32_t& v : n.inputs) {
      if (v == from) v = to;
    }
    if (n.alias_of == from) n.alias_of = to;
  }
  if (ir.values[from].live_out) ir.values[to].live_out = true;
}

Ir001 compact(const Ir001& ir, const std::vector<bool>& keep) {
  Ir001 out;
  out.pool = ir.pool;
  out.module_paths = ir.module_paths;
  out.batch_size = ir.batch_size;
  out.symbolic = ir.symbolic;
  out.recorded_geometry = ir.recorded_geometry;
  std::vector<std::uint32_t> node_map(ir.nodes.size(), kNoNode);
  for (std::size_t i = 0; i < ir.nodes.size(); ++i) {
    if (keep[i]) node_map[i] = static_cast<std::uint32_t>(out.nodes.size()), out.nodes.push_back(ir.nodes[i]);
  }
  std::vector<bool> used(ir.values.size(), false);
  for (const Node& n : out.nodes) {
    for (std::uint32_t v : n.inputs) used[v] = true;
    for (std::uint32_t v : n.outputs) used[v] = true;
  }
  for (std::size_t v = 0; v < ir.values.size(); ++v) {
    const Value& val = ir.values[v];
    if (val.live_out && (val.producer == kNoNode || keep[val.producer])) used[v] = true;
  }
  std::vector<std::uint32_t> value_map(ir.values.size(), UINT32_MAX);
  for (std::size_t v = 0; v < ir.values.size(); ++v) {
    if (!used[v]) continue;
    value_map[v] = static_cast<std::uint32_t>(out.values.size());
    Value val = ir.values[v];
    if (val.producer != kNoNode) val.producer = node_map[val.producer];
    out.values.push_back(std::move(val));
  }
  for (Node& n : out.nodes) {
    for (std::uint32_t& v : n.inputs) v = value_map[v];
    for (std::uint32_t& v : n.outputs) v = value_map[v];
    if (n.alias_of != UINT32_MAX) n.alias_of = value_map[n.alias_of];
  }
  return out;
}

}  // namespace detail

Result<Ir001> build_ir001(const record::Trace& t, std::span<const std::size_t> ops, ExprPool& pool,
                          const BuildOptions& options) {
  if (ops.empty()) return invalid_input("build_ir001: no ops", "pass the op indices of one iteration");
  Ir001 ir;
  ir.pool = &pool;
  ir.module_paths = t.module_paths;
  std::map<ValueKey, std::uint32_t> current;  // newest value for each key
  std::unordered_map<std::uint64_t, std::uint32_t> written;  // storage -> the newest value an op wrote
  std::vector<std::int64_t> op_bytes;  // the current op's tensors' bytes, checked (tensor_bytes)
  std::size_t op_base = 0;             // its first tensor's index in t
  auto make_value = [&](const record::TensorMeta& m) {
    Value v;
    const std::size_t ti = t.tensor_index(&m);
    for (std::int64_t d : t.sizes(ti)) v.shape.push_back(pool.constant(d));
    v.dtype = m.dtype;
    v.storage = m.storage_id;
    v.version = m.version;
    v.is_view = (m.flags & record::tensor_flag::kIsView) != 0;
    v.nbytes = op_bytes[ti - op_base];
    const auto st = t.strides(ti);
    v.strides.assign(st.begin(), st.end());
    v.storage_offset = m.storage_offset;
    v.storage_nbytes = m.storage_nbytes;
    v.wrapped_number = (m.flags & record::tensor_flag::kWrappedNumber) != 0;
    v.wrapped_value = m.wrapped_value;
    return v;
  };
  auto key_of = [&](const record::TensorMeta& m) {
    const std::size_t ti = t.tensor_index(&m);
    const auto sz = t.sizes(ti), st = t.strides(ti);
    return ValueKey{m.storage_id, m.version, m.storage_offset,
                    std::vector<std::int64_t>(sz.begin(), sz.end()),
                    std::vector<std::int64_t>(st.begin(), st.end()), m.dtype};
  };
  for (std::size_t op : ops) {
    if (op >= t.num_ops()) {
      return invalid_input("build_ir001: op index " + std::to_string(op) + " is past the trace's " +
                               std::to_string(t.num_ops()) + " ops",
                           "pass indices from graph::analyze_latest_iteration on the same trace");
    }
    const record::TraceEntry& e = t.ops[op];
    Node n;
    n.schema_hash = e.schema_hash;
    n.op = t.schema_name(e.schema_hash);
    const OpClass cls = classify_op(n.op);
    if (options.strict_op_table && cls.kind == CKernel::Opaque && cls.reason == kNotInOpTable) {
      return unsupported("build_ir001: op '" + n.op + "' (trace op " + std::to_string(op) +
                             ") is not in Forge's op table",
                         "add it to src/core/OpTable.cpp with its kernel kind");
    }
    n.kind = cls.kind;
    n.opaque_reason = cls.reason;
    n.phase = e.phase;
    n.module_id = e.module_id;
    n.mutates = (e.flags & record::op_flag::kMutable) != 0;
    n.grad_mode = (e.flags & record::op_flag::kGradMode) != 0;
    n.trace_op = op;
    const auto sc = t.scalars_of(op);
    n.scalars.assign(sc.begin(), sc.end());
    op_base = t.op_tensor_begin[op];
    op_bytes.clear();
    for (std::size_t k = 0; k < e.n_tensors; ++k) {
      const std::size_t ti = op_base + k;
      auto bytes = tensor_bytes(t.sizes(ti), t.tensors[ti].dtype,
                                "build_ir001: trace op " + std::to_string(op) + " ('" + n.op + "') " +
                                    (k < e.n_inputs ? "input " : "output ") + std::to_string(k));
      if (!bytes.ok()) return bytes.status();
      op_bytes.push_back(*bytes);
    }
    for (const record::TensorMeta& m : t.inputs(op)) {
      n.input_args.push_back(ArgPosition{m.arg_index, m.list_index});
      if (m.storage_id != 0) {
        auto it = current.find(key_of(m));
        if (it != current.end()) {
          n.inputs.push_back(it->second);
          continue;
        }
        // Note [Unrecorded views]: a storage this iteration wrote, read at the version it
        // wrote but through a geometry no op produced (the base of a view written in place:
        // autograd's as_strided scatter writes a view, then reads the whole buffer). Its
        // contents are the write's: a view node of the written value stands for the read
        // (no call; the plan places it in the same storage), not an external input.
        auto w = written.find(m.storage_id);
        if (w != written.end() && ir.values[w->second].version == m.version) {
          Node view;
          view.op = "aten::as_strided";
          const OpClass vc = classify_op(view.op);
          view.kind = vc.kind;
          view.opaque_reason = vc.reason;
          view.phase = e.phase;
          view.module_id = e.module_id;
          view.grad_mode = n.grad_mode;
          view.trace_op = op;
          view.input_args.push_back(ArgPosition{0, 0});
          view.output_args.push_back(ArgPosition{0, 0});
          view.inputs.push_back(w->second);
          view.alias_of = w->second;
          Value v = make_value(m);
          v.is_view = true;
          v.producer = static_cast<std::uint32_t>(ir.nodes.size());
          v.producer_output = 0;
          const auto vid = static_cast<std::uint32_t>(ir.values.size());
          ir.values.push_back(std::move(v));
          current[key_of(m)] = vid;
          view.outputs.push_back(vid);
          ir.nodes.push_back(std::move(view));
          n.inputs.push_back(vid);
          continue;
        }
      }
      Value v = make_value(m);
      if (auto ext = t.externals.find(m.storage_id); ext != t.externals.end()) {
        v.external = static_cast<std::uint8_t>(ext->second);
      }
      const auto vid = static_cast<std::uint32_t>(ir.values.size());
      ir.values.push_back(std::move(v));
      if (m.storage_id != 0) current[key_of(m)] = vid;
      n.inputs.push_back(vid);
    }
    const std::uint32_t id = static_cast<std::uint32_t>(ir.nodes.size());
    std::uint32_t k = 0;
    for (const record::TensorMeta& m : t.outputs(op)) {
      n.output_args.push_back(ArgPosition{m.arg_index, m.list_index});
      Value v = make_value(m);
      v.producer = id;
      v.producer_output = k++;
      const auto vid = static_cast<std::uint32_t>(ir.values.size());
      ir.values.push_back(std::move(v));
      if (m.storage_id != 0) current[key_of(m)] = vid, written[m.storage_id] = vid;
      n.outputs.push_back(vid);
    }
    ir.nodes.push_back(std::move(n));
  }
  // Live-out: external storage (state updated in place) or read by no node of the iteration.
  std::vector<bool> read(ir.values.size(), false);
  for (const Node& n : ir.nodes) {
    for (std::uint32_t v : n.inputs) read[v] = true;
  }
  // A write to external storage is a state update (a new version); a view of a parameter at
  // the version it came in with is not.
  std::map<std::uint64_t, std::uint32_t> initial_version;
  for (const Value& val : ir.values) {
    if (val.producer == kNoNode && val.storage != 0) {
      auto [it, fresh] = initial_version.emplace(val.storage, val.version);
      if (!fresh) it->second = std::min(it->second, val.version);
    }
  }
  // Only the last version of a storage the iteration writes is observable after it: an
  // optimizer's param.mul_(...) followed by param.addcdiv_(...) leaves the second version, so the
  // first is a temporary of the update (a fused kernel need never write it back).
  std::map<std::uint64_t, std::uint32_t> last_version;
  for (const Value& val : ir.values) {
    if (val.producer == kNoNode || val.storage == 0) continue;
    auto [it, fresh] = last_version.emplace(val.storage, val.version);
    if (!fresh) it->second = std::max(it->second, val.version);
  }
  for (std::size_t v = 0; v < ir.values.size(); ++v) {
    Value& val = ir.values[v];
    if (val.producer == kNoNode) continue;
    const bool external_storage = val.storage != 0 && t.externals.contains(val.storage);
    auto init = initial_version.find(val.storage);
    const bool state_write =
        external_storage &&
        (!val.is_view || init == initial_version.end() || val.version != init->second) &&
        val.version == last_version[val.storage];
    val.live_out = state_write || !read[v];
  }
  // The recorded batch: leading dim of the batch inputs (the most common one if they differ).
  std::map<std::int64_t, int> votes;
  for (const Value& v : ir.values) {
    if (v.external == static_cast<std::uint8_t>(record::ExternalKind::Input) && !v.shape.empty() &&
        v.shape[0]->kind == Expr::Kind::Const) {
      ++votes[v.shape[0]->value];
    }
  }
  for (const auto& [b, n] : votes) {
    if (ir.batch_size == 0 || n > votes[ir.batch_size]) ir.batch_size = b;
  }
  detail::compute_costs(ir);
  return ir;
}

namespace {
// Two recordings of one program: the same nodes, each with the same op, inputs, outputs and
// number of scalars, over the same values. `who` names the caller in the error, `fix` says what
// to do.
Status same_program(const Ir001& a, const Ir001& b, std::string_view who, std::string_view fix) {
  if (a.nodes.size() != b.nodes.size() || a.values.size() != b.values.size())
    return invalid_input(std::string(who) + ": the recordings differ in structure (" + std::to_string(a.nodes.size()) +
                             " vs " + std::to_string(b.nodes.size()) + " nodes, " + std::to_string(a.values.size()) +
                             " vs " + std::to_string(b.values.size()) + " values)",
                         std::string(fix));
  for (std::size_t i = 0; i < a.nodes.size(); ++i) {
    const Node& x = a.nodes[i];
    const Node& y = b.nodes[i];
    if (x.op != y.op || x.inputs != y.inputs || x.outputs != y.outputs || x.scalars.size() != y.scalars.size())
      return invalid_input(std::string(who) + ": node #" + std::to_string(i) + " differs (" + x.op + " vs " + y.op + ")",
                           std::string(fix));
  }
  return ok_status();
}

// How two recordings of one program become one symbolic IR: fit(x, y) is the expression of an
// integer that is x in the first and y in the second (nullptr: none), values_text(x, y) says
// what two values were refused ("is 48 at batch 4 and 56 at batch 8: not proportional to the
// batch").
struct Symbolizer {
  std::string who;
  std::function<const Expr*(std::int64_t, std::int64_t)> fit;
  std::function<std::string(std::int64_t, std::int64_t)> values_text;
  std::string scalar_fix, rank_fix, dim_fix;
};

// a's IR with every int scalar argument and every value dim that differs from b's replaced by
// its fit (dims negative or not constant have none); the first one without a fit is the error.
Result<Ir001> symbolize_with(const Ir001& a, const Ir001& b, const Symbolizer& s) {
  Ir001 out = a;
  out.symbolic = true;
  out.recorded_geometry = false;  // strides, offsets and storage sizes stay a's
  for (std::size_t i = 0; i < a.nodes.size(); ++i) {
    const Node& x = a.nodes[i];
    const Node& y = b.nodes[i];
    for (std::size_t k = 0; k < x.scalars.size(); ++k) {
      const record::ScalarRecord& r = x.scalars[k];
      const record::ScalarRecord& q = y.scalars[k];
      if (r.kind == q.kind && r.arg_index == q.arg_index && r.aux == q.aux && r.bits == q.bits) continue;
      const auto va = static_cast<std::int64_t>(r.bits), vb = static_cast<std::int64_t>(q.bits);
      const Expr* e = r.kind == record::ScalarKind::Int && q.kind == r.kind && r.arg_index == q.arg_index
                          ? s.fit(va, vb)
                          : nullptr;
      if (e == nullptr)
        return invalid_input(s.who + ": scalar argument " + std::to_string(r.arg_index) + " of node #" +
                                 std::to_string(i) + " " + x.op + s.values_text(va, vb),
                             s.scalar_fix);
      Node& n = out.nodes[i];
      if (n.scalar_exprs.empty()) n.scalar_exprs.assign(n.scalars.size(), nullptr);
      n.scalar_exprs[k] = e;
    }
  }
  for (std::size_t v = 0; v < a.values.size(); ++v) {
    const auto& sa = a.values[v].shape;
    const auto& sb = b.values[v].shape;
    if (sa.size() != sb.size())
      return invalid_input(s.who + ": value " + std::to_string(v) + " has rank " + std::to_string(sa.size()) + " vs " +
                               std::to_string(sb.size()),
                           s.rank_fix);
    for (std::size_t d = 0; d < sa.size(); ++d) {
      if (sa[d] == sb[d]) continue;
      const std::int64_t da = sa[d]->kind == Expr::Kind::Const ? sa[d]->value : -1;
      const std::int64_t db = sb[d]->kind == Expr::Kind::Const ? sb[d]->value : -1;
      const Expr* e = da >= 0 && db >= 0 ? s.fit(da, db) : nullptr;
      if (e == nullptr) {
        const std::uint32_t p = a.values[v].producer;
        return invalid_input(s.who + ": dim " + std::to_string(d) + " of value " + std::to_string(v) +
                                 (p == kNoNode ? std::string(" (external)")
                                               : " (output of node #" + std::to_string(p) + " " + a.nodes[p].op + ")") +
                                 s.values_text(da, db),
                             s.dim_fix);
      }
      out.values[v].shape[d] = e;
    }
  }
  return out;
}
}  // namespace

Result<Ir001> symbolize_batch(const Ir001& a, const Ir001& b, ExprPool& pool, std::string_view symbol) {
  if (a.pool != &pool || b.pool != &pool) {
    return invalid_input("symbolize_batch: both IRs must come from this pool", "build them with the same ExprPool");
  }
  if (a.batch_size <= 0 || b.batch_size <= 0 || a.batch_size == b.batch_size) {
    return invalid_input("symbolize_batch: needs two recordings at different known batch sizes (got " +
                             std::to_string(a.batch_size) + " and " + std::to_string(b.batch_size) + ")",
                         "record the step at two batch sizes with inputs marked as batch inputs");
  }
  if (Status st = same_program(a, b, "symbolize_batch", "the program's ops must not depend on the batch size");
      !st.ok())
    return st;
  const Expr* sym = pool.symbol(symbol);
  const std::int64_t ba = a.batch_size, bb = b.batch_size;
  Symbolizer sz;
  sz.who = "symbolize_batch";
  sz.fit = [&](std::int64_t x, std::int64_t y) -> const Expr* {  // k*B
    if (x <= 0 || y <= 0 || x % ba != 0 || y % bb != 0 || x / ba != y / bb) return nullptr;
    return pool.mul(pool.constant(x / ba), sym);
  };
  sz.values_text = [&](std::int64_t x, std::int64_t y) {
    return " is " + std::to_string(x) + " at batch " + std::to_string(ba) + " and " + std::to_string(y) +
           " at batch " + std::to_string(bb) + ": not proportional to the batch";
  };
  sz.scalar_fix = "this program's arguments cannot be expressed in the batch size; plan it per batch size";
  sz.rank_fix = "the program's shapes must not depend on the batch size except proportionally";
  sz.dim_fix = "this program's shapes cannot be expressed in the batch size; plan it per batch size";
  return symbolize_with(a, b, sz);
}

namespace {
// Note [Size symbols]: the expression of an integer that is x at the symbols' values in one
// recording and y in the other: a symbol's own pair of values is that symbol, else its first
// one-parameter fit (S + d, c*S, c*S*T with c rational; a division only where both recorded
// values divide), else nullptr. Two values always fit a line a*S + b, so a free affine fit would
// explain anything. With several symbols, two recordings cannot tell apart fits over symbols
// that vary alike (a length 16 -> 32 beside a batch 4 -> 8: 4*S and 16*B agree at both): the
// first symbol's fit is taken.
const Expr* size_fit(std::int64_t x, std::int64_t y, const std::vector<std::pair<std::int64_t, std::int64_t>>& at,
                     const std::vector<const Expr*>& syms, ExprPool& pool) {
  constexpr std::int64_t kMax = std::int64_t{1} << 40;
  if (x > kMax || x < -kMax || y > kMax || y < -kMax) return nullptr;
  for (std::size_t i = 0; i < at.size(); ++i)
    if (at[i] == std::pair{x, y}) return syms[i];
  __extension__ using W = __int128;  // the fits' products of two 2^40 values
  auto times = [&](std::int64_t num, std::int64_t den, const Expr* term) -> const Expr* {
    const std::int64_t g = std::gcd(num, den);
    num /= g;
    den /= g;
    if (den < 0) num = -num, den = -den;
    const Expr* e = num == 1 ? term : pool.mul(pool.constant(num), term);
    return den == 1 ? e : pool.floordiv(e, pool.constant(den));
  };
  for (std::size_t i = 0; i < at.size(); ++i) {
    const auto [a, b] = at[i];
    if (x - a == y - b) return x == a ? syms[i] : pool.add(syms[i], pool.constant(x - a));
    if (W(x) * b == W(y) * a) return times(x, a, syms[i]);
    for (std::size_t j = i; j < at.size(); ++j) {
      const auto [e, g] = at[j];
      if (W(x) * b * g == W(y) * a * e && W(a) * e <= kMax) return times(x, a * e, pool.mul(syms[i], syms[j]));
    }
  }
  return nullptr;
}
}  // namespace

Result<Ir001> symbolize_sizes(const Ir001& a, const Ir001& b, ExprPool& pool, std::vector<SizeSymbol>* symbols) {
  if (a.pool != &pool || b.pool != &pool)
    return invalid_input("symbolize_sizes: both IRs must come from this pool", "build them with the same ExprPool");
  if (Status st = same_program(a, b, "symbolize_sizes", "the program's ops must not depend on its sizes"); !st.ok())
    return st;
  auto cst = [](const Expr* e) { return e->kind == Expr::Kind::Const ? e->value : -1; };
  // The symbols: the dims of the batch inputs that differ, one per distinct pair of values.
  std::vector<std::pair<std::int64_t, std::int64_t>> at;
  std::vector<const Expr*> syms;
  std::vector<SizeSymbol> found;
  const char* const letters[] = {"S", "T", "U", "V"};
  for (std::size_t v = 0; v < a.values.size(); ++v) {
    const Value& x = a.values[v];
    const Value& y = b.values[v];
    if (x.producer != kNoNode || x.external != static_cast<std::uint8_t>(record::ExternalKind::Input)) continue;
    if (x.shape.size() != y.shape.size())
      return invalid_input("symbolize_sizes: input value " + std::to_string(v) + " has rank " +
                               std::to_string(x.shape.size()) + " vs " + std::to_string(y.shape.size()),
                           "record one program at two sizes of the same ranks");
    for (std::size_t d = 0; d < x.shape.size(); ++d) {
      const std::int64_t p = cst(x.shape[d]), q = cst(y.shape[d]);
      if (p == q) continue;
      if (p < 2 || q < 2)
        return invalid_input("symbolize_sizes: dim " + std::to_string(d) + " of input value " + std::to_string(v) +
                                 " is " + std::to_string(p) + " and " + std::to_string(q) +
                                 " (sizes 0 and 1 change broadcasting: they are never symbols)",
                             "record at sizes of at least 2");
      if (p > (std::int64_t{1} << 40) || q > (std::int64_t{1} << 40))
        return invalid_input("symbolize_sizes: dim " + std::to_string(d) + " of input value " + std::to_string(v) +
                                 " is " + std::to_string(p) + " and " + std::to_string(q) + ": past 2^40",
                             "record at sizes below 2^40");
      if (std::find(at.begin(), at.end(), std::pair{p, q}) != at.end()) continue;
      std::string name = p == a.batch_size && q == b.batch_size && a.batch_size != b.batch_size && d == 0 ? "B" : "";
      for (std::size_t k = 0; name.empty() || std::any_of(found.begin(), found.end(),
                                                           [&](const SizeSymbol& f) { return f.name == name; });
           ++k)
        name = k < 4 ? letters[k] : "S" + std::to_string(k);
      at.emplace_back(p, q);
      syms.push_back(pool.symbol(name));
      found.push_back({name, p, q, static_cast<std::uint32_t>(v), static_cast<std::uint32_t>(d)});
    }
  }
  if (at.empty())
    return invalid_input("symbolize_sizes: no dim of a batch input differs between the recordings",
                         "record the program at two sizes (a batch, a sequence length)");
  Symbolizer sz;
  sz.who = "symbolize_sizes";
  sz.fit = [&](std::int64_t x, std::int64_t y) { return size_fit(x, y, at, syms, pool); };
  sz.values_text = [](std::int64_t x, std::int64_t y) {
    return " is " + std::to_string(x) + " and " + std::to_string(y) +
           ": no function of the input sizes that differ (S + d, c*S, c*S*T)";
  };
  sz.scalar_fix = sz.dim_fix = "plan this program per size";
  sz.rank_fix = "the program's ranks must not depend on its sizes";
  auto out = symbolize_with(a, b, sz);
  if (!out.ok()) return out;
  if (symbols != nullptr) *symbols = std::move(found);
  return out;
}

Result<Ir001> instantiate(const Ir001& ir, const std::map<std::string, std::int64_t, std::less<>>& bindings) {
  Ir001 out = ir;
  out.symbolic = false;
  std::int64_t batch = 0;
  for (const auto& [name, v] : bindings) batch = v;  // the batch symbol (one symbol today)
  for (std::size_t v = 0; v < out.values.size(); ++v) {
    Value& val = out.values[v];
    std::vector<std::int64_t> dims;
    for (const Expr*& d : val.shape) {
      auto x = ir.pool->evaluate(d, bindings);
      if (!x.ok()) return x.status();
      if (*x < 0) return invalid_input("instantiate: value " + std::to_string(v) + " gets a negative dim", "bind the batch to a positive size");
      d = ir.pool->constant(*x);
      dims.push_back(*x);
    }
    auto bytes = tensor_bytes(dims, val.dtype, "instantiate: value " + std::to_string(v),
                              "bind the batch to a size the program can have");
    if (!bytes.ok()) return bytes.status();
    val.nbytes = *bytes;
  }
  for (Node& n : out.nodes) {
    for (std::size_t k = 0; k < n.scalar_exprs.size(); ++k) {
      if (n.scalar_exprs[k] == nullptr) continue;
      auto x = ir.pool->evaluate(n.scalar_exprs[k], bindings);
      if (!x.ok()) return x.status();
      n.scalars[k].bits = static_cast<std::uint64_t>(*x);
    }
    n.scalar_exprs.clear();
  }
  if (batch > 0) out.batch_size = batch;
  detail::compute_costs(out);
  return out;
}

}  // namespace crucible::forge
