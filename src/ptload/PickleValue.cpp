// PickleValue.cpp — the immutable shared nodes behind PickleValue.
#include "crucible/ptload/PickleValue.h"

#include <bit>
#include <cstdio>

#include "crucible/core/Contract.h"
#include "crucible/core/ScalarType.h"

namespace crucible::ptload {

// Note [PickleValue nodes]
// A value is a shared_ptr to an immutable node. Every node starts with the 16-byte PickleRep
// (kind, flag, dtype and the int or float bits); strings, sequences, dicts and tensors are
// nodes that extend it, so an int costs 16 bytes plus the 16-byte control block, where one
// struct holding every kind's fields would take 216. A crafted pickle can ask for a node per
// pickle byte (a list of a million empty lists is 1 MB): node size is what that costs, and the
// unpickler charges it to its memory budget through node_bytes(). True and False are two shared
// nodes. Accessors check the kind before the static_cast.
struct detail::PickleRep {
  using Kind = PickleValue::Kind;
  Kind kind = Kind::None;
  bool flag = false;  // Bool value; Dict: is an OrderedDict
  std::int8_t dtype = 0;
  std::int64_t i = 0;  // Int; Float's bits
};
static_assert(sizeof(detail::PickleRep) == 16);

namespace {

struct StringRep : detail::PickleRep {
  std::string s;  // String; BigInt's little-endian two's-complement bytes
};
struct SequenceRep : detail::PickleRep {
  std::vector<PickleValue> items;  // Tuple, List, Set
};
struct DictRep : detail::PickleRep {
  std::vector<PickleValue::Entry> entries;
  PickleValue attributes;  // BUILD state
};
struct TensorRep : detail::PickleRep {
  explicit TensorRep(TensorView t) : tensor(std::move(t)) {}
  TensorView tensor;
};

// make_shared's control block: vtable pointer and the two counts.
constexpr std::size_t kControlBlockBytes = 16;

template <class R, class... A>
std::shared_ptr<R> make_node(PickleValue::Kind k, A&&... a) {
  auto r = std::make_shared<R>(std::forward<A>(a)...);
  r->kind = k;
  return r;
}

const std::string kEmpty;

}  // namespace

std::size_t PickleValue::node_bytes(Kind k) {
  switch (k) {
    case Kind::None:
      return 0;
    case Kind::String:
    case Kind::BigInt:
      return kControlBlockBytes + sizeof(StringRep);
    case Kind::Tuple:
    case Kind::List:
    case Kind::Set:
      return kControlBlockBytes + sizeof(SequenceRep);
    case Kind::Dict:
      return kControlBlockBytes + sizeof(DictRep);
    case Kind::Tensor:
      return kControlBlockBytes + sizeof(TensorRep);
    case Kind::Bool:  // two shared nodes
      return 0;
    case Kind::Int:
    case Kind::Float:
    case Kind::Dtype:
      return kControlBlockBytes + sizeof(detail::PickleRep);
  }
  return 0;
}

PickleValue::PickleValue() = default;

PickleValue PickleValue::boolean(bool v) {
  static const auto kFalse = make_node<detail::PickleRep>(Kind::Bool);
  static const auto kTrue = [] {
    auto r = make_node<detail::PickleRep>(Kind::Bool);
    r->flag = true;
    return r;
  }();
  return PickleValue(v ? kTrue : kFalse);
}
PickleValue PickleValue::integer(std::int64_t v) {
  auto r = make_node<detail::PickleRep>(Kind::Int);
  r->i = v;
  return PickleValue(r);
}
PickleValue PickleValue::big_integer(std::string b) {
  auto r = make_node<StringRep>(Kind::BigInt);
  r->s = std::move(b);
  return PickleValue(r);
}
PickleValue PickleValue::floating(double v) {
  auto r = make_node<detail::PickleRep>(Kind::Float);
  r->i = std::bit_cast<std::int64_t>(v);
  return PickleValue(r);
}
PickleValue PickleValue::string(std::string v) {
  auto r = make_node<StringRep>(Kind::String);
  r->s = std::move(v);
  return PickleValue(r);
}
PickleValue PickleValue::sequence(Kind kind, std::vector<PickleValue> items) {
  CRUCIBLE_PRE(kind == Kind::Tuple || kind == Kind::List || kind == Kind::Set,
               "not a sequence kind");
  auto r = make_node<SequenceRep>(kind);
  r->items = std::move(items);
  return PickleValue(r);
}
PickleValue PickleValue::dict(std::vector<Entry> entries, bool ordered, PickleValue attributes) {
  auto r = make_node<DictRep>(Kind::Dict);
  r->entries = std::move(entries);
  r->flag = ordered;
  r->attributes = std::move(attributes);
  return PickleValue(r);
}
PickleValue PickleValue::tensor(TensorView t) {
  return PickleValue(make_node<TensorRep>(Kind::Tensor, std::move(t)));
}
PickleValue PickleValue::dtype(std::int8_t c10_ordinal) {
  auto r = make_node<detail::PickleRep>(Kind::Dtype);
  r->dtype = c10_ordinal;
  return PickleValue(r);
}

PickleValue::Kind PickleValue::kind() const { return rep_ ? rep_->kind : Kind::None; }

std::string_view PickleValue::kind_name(Kind k) {
  switch (k) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::BigInt:
      return "int (wider than 64 bits)";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::Tuple:
      return "tuple";
    case Kind::List:
      return "list";
    case Kind::Set:
      return "set";
    case Kind::Dict:
      return "dict";
    case Kind::Tensor:
      return "tensor";
    case Kind::Dtype:
      return "dtype";
  }
  return "?";
}

bool PickleValue::as_bool() const {
  CRUCIBLE_PRE(is(Kind::Bool), "as_bool() on a non-bool");
  return rep_->flag;
}
std::int64_t PickleValue::as_int() const {
  CRUCIBLE_PRE(is(Kind::Int), "as_int() on a non-int");
  return rep_->i;
}
double PickleValue::as_float() const {
  CRUCIBLE_PRE(is(Kind::Float), "as_float() on a non-float");
  return std::bit_cast<double>(rep_->i);
}
const std::string& PickleValue::as_string() const {
  CRUCIBLE_PRE(is(Kind::String) || is(Kind::BigInt), "as_string() on a non-str");
  return rep_ ? static_cast<const StringRep&>(*rep_).s : kEmpty;
}
std::span<const PickleValue> PickleValue::items() const {
  CRUCIBLE_PRE(is(Kind::Tuple) || is(Kind::List) || is(Kind::Set), "items() on a non-sequence");
  return static_cast<const SequenceRep&>(*rep_).items;
}
std::span<const PickleValue::Entry> PickleValue::entries() const {
  CRUCIBLE_PRE(is(Kind::Dict), "entries() on a non-dict");
  return static_cast<const DictRep&>(*rep_).entries;
}
bool PickleValue::is_ordered_dict() const { return is(Kind::Dict) && rep_->flag; }
const PickleValue& PickleValue::attributes() const {
  CRUCIBLE_PRE(is(Kind::Dict), "attributes() on a non-dict");
  return static_cast<const DictRep&>(*rep_).attributes;
}
const PickleValue* PickleValue::get(std::string_view key) const {
  if (!is(Kind::Dict)) return nullptr;
  for (const auto& [k, v] : entries())
    if (k.is(Kind::String) && k.as_string() == key) return &v;
  return nullptr;
}
const TensorView& PickleValue::as_tensor() const {
  CRUCIBLE_PRE(is(Kind::Tensor), "as_tensor() on a non-tensor");
  return static_cast<const TensorRep&>(*rep_).tensor;
}
std::int8_t PickleValue::as_dtype() const {
  CRUCIBLE_PRE(is(Kind::Dtype), "as_dtype() on a non-dtype");
  return rep_->dtype;
}

namespace {

// PickleValue::repr into `out`, stopping with "..." once it holds `limit` bytes.
void repr_into(const PickleValue& v, std::string& out, std::size_t limit) {
  using Kind = PickleValue::Kind;
  if (out.size() >= limit) return;
  switch (v.kind()) {
    case Kind::Tuple:
    case Kind::List:
    case Kind::Set: {
      const bool tuple = v.is(Kind::Tuple);
      out += tuple ? "(" : v.is(Kind::List) ? "[" : "{";
      const auto it = v.items();
      for (std::size_t i = 0; i < it.size(); ++i) {
        if (out.size() >= limit) return;
        if (i) out += ", ";
        repr_into(it[i], out, limit);
      }
      if (tuple && it.size() == 1) out += ",";
      out += tuple ? ")" : v.is(Kind::List) ? "]" : "}";
      return;
    }
    case Kind::None:
      out += "None";
      return;
    case Kind::Bool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Kind::BigInt:
      out += "<int of " + std::to_string(v.as_string().size()) + " bytes>";
      return;
    case Kind::Float: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", v.as_float());
      out += buf;
      return;
    }
    case Kind::String:
      out += v.as_string();
      return;
    case Kind::Dict:
      out += "{dict of " + std::to_string(v.entries().size()) + "}";
      return;
    case Kind::Tensor:
      out += "<tensor " + std::string(v.as_tensor().dtype_name()) + ">";
      return;
    case Kind::Dtype:
      out += "torch." + std::string(scalar_type_info(v.as_dtype()).name);
      return;
  }
  out += "?";
}

}  // namespace

std::string PickleValue::repr() const {
  std::string out;
  repr_into(*this, out, kMaxReprBytes);
  if (out.size() >= kMaxReprBytes) out += "...";
  return out;
}

}  // namespace crucible::ptload
