// PickleValue.cpp — the immutable shared nodes behind PickleValue.
#include "crucible/ptload/PickleValue.h"

#include <cstdio>
#include <optional>

#include "crucible/core/Contract.h"
#include "crucible/core/ScalarType.h"

namespace crucible::ptload {

struct PickleValue::Rep {
  Kind kind = Kind::None;
  bool b = false;
  bool ordered = false;
  std::int8_t dtype = 0;
  std::int64_t i = 0;
  double f = 0.0;
  std::string s;                   // String; BigInt bytes
  std::vector<PickleValue> items;  // Tuple, List, Set
  std::vector<Entry> entries;      // Dict
  PickleValue attributes;          // Dict BUILD state
  std::optional<TensorView> tensor;
};

std::shared_ptr<PickleValue::Rep> PickleValue::make_rep(Kind k) {
  auto r = std::make_shared<Rep>();
  r->kind = k;
  return r;
}

namespace {
const std::string kEmpty;
const PickleValue kNone;
}  // namespace

PickleValue::PickleValue() = default;

PickleValue PickleValue::boolean(bool v) {
  auto r = make_rep(Kind::Bool);
  r->b = v;
  return PickleValue(r);
}
PickleValue PickleValue::integer(std::int64_t v) {
  auto r = make_rep(Kind::Int);
  r->i = v;
  return PickleValue(r);
}
PickleValue PickleValue::big_integer(std::string b) {
  auto r = make_rep(Kind::BigInt);
  r->s = std::move(b);
  return PickleValue(r);
}
PickleValue PickleValue::floating(double v) {
  auto r = make_rep(Kind::Float);
  r->f = v;
  return PickleValue(r);
}
PickleValue PickleValue::string(std::string v) {
  auto r = make_rep(Kind::String);
  r->s = std::move(v);
  return PickleValue(r);
}
PickleValue PickleValue::sequence(Kind kind, std::vector<PickleValue> items) {
  CRUCIBLE_PRE(kind == Kind::Tuple || kind == Kind::List || kind == Kind::Set,
               "not a sequence kind");
  auto r = make_rep(kind);
  r->items = std::move(items);
  return PickleValue(r);
}
PickleValue PickleValue::dict(std::vector<Entry> entries, bool ordered, PickleValue attributes) {
  auto r = make_rep(Kind::Dict);
  r->entries = std::move(entries);
  r->ordered = ordered;
  r->attributes = std::move(attributes);
  return PickleValue(r);
}
PickleValue PickleValue::tensor(TensorView t) {
  auto r = make_rep(Kind::Tensor);
  r->tensor.emplace(std::move(t));
  return PickleValue(r);
}
PickleValue PickleValue::dtype(std::int8_t c10_ordinal) {
  auto r = make_rep(Kind::Dtype);
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
  return rep_->b;
}
std::int64_t PickleValue::as_int() const {
  CRUCIBLE_PRE(is(Kind::Int), "as_int() on a non-int");
  return rep_->i;
}
double PickleValue::as_float() const {
  CRUCIBLE_PRE(is(Kind::Float), "as_float() on a non-float");
  return rep_->f;
}
const std::string& PickleValue::as_string() const {
  CRUCIBLE_PRE(is(Kind::String) || is(Kind::BigInt), "as_string() on a non-str");
  return rep_ ? rep_->s : kEmpty;
}
std::span<const PickleValue> PickleValue::items() const {
  CRUCIBLE_PRE(is(Kind::Tuple) || is(Kind::List) || is(Kind::Set), "items() on a non-sequence");
  return rep_->items;
}
std::span<const PickleValue::Entry> PickleValue::entries() const {
  CRUCIBLE_PRE(is(Kind::Dict), "entries() on a non-dict");
  return rep_->entries;
}
bool PickleValue::is_ordered_dict() const { return is(Kind::Dict) && rep_->ordered; }
const PickleValue& PickleValue::attributes() const {
  CRUCIBLE_PRE(is(Kind::Dict), "attributes() on a non-dict");
  return rep_->attributes;
}
const PickleValue* PickleValue::get(std::string_view key) const {
  if (!is(Kind::Dict)) return nullptr;
  for (const auto& [k, v] : rep_->entries)
    if (k.is(Kind::String) && k.as_string() == key) return &v;
  return nullptr;
}
const TensorView& PickleValue::as_tensor() const {
  CRUCIBLE_PRE(is(Kind::Tensor), "as_tensor() on a non-tensor");
  return *rep_->tensor;
}
std::int8_t PickleValue::as_dtype() const {
  CRUCIBLE_PRE(is(Kind::Dtype), "as_dtype() on a non-dtype");
  return rep_->dtype;
}

std::string PickleValue::repr() const {
  switch (kind()) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return rep_->b ? "True" : "False";
    case Kind::Int:
      return std::to_string(rep_->i);
    case Kind::BigInt:
      return "<int of " + std::to_string(rep_->s.size()) + " bytes>";
    case Kind::Float: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", rep_->f);
      return buf;
    }
    case Kind::String:
      return rep_->s;
    case Kind::Tuple:
    case Kind::List:
    case Kind::Set: {
      const char* open = is(Kind::Tuple) ? "(" : is(Kind::List) ? "[" : "{";
      const char* close = is(Kind::Tuple) ? ")" : is(Kind::List) ? "]" : "}";
      std::string out = open;
      for (std::size_t i = 0; i < rep_->items.size(); ++i) {
        if (i) out += ", ";
        out += rep_->items[i].repr();
      }
      if (is(Kind::Tuple) && rep_->items.size() == 1) out += ",";
      return out + close;
    }
    case Kind::Dict:
      return "{dict of " + std::to_string(rep_->entries.size()) + "}";
    case Kind::Tensor:
      return "<tensor " + std::string(rep_->tensor->dtype_name()) + ">";
    case Kind::Dtype:
      return "torch." + std::string(scalar_type_info(rep_->dtype).name);
  }
  return "?";
}

}  // namespace crucible::ptload
