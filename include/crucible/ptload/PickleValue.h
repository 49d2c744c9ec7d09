// PickleValue.h — the object tree a restricted .pt unpickle produces (immutable, shared).
//
// Only what torch.save's protocol-2 pickles can hold after the allowlist: None, bool, int
// (int64, or BigInt for wider LONG1 values, kept as little-endian two's-complement bytes),
// float, str, tuple, list, set, dict (plain or OrderedDict, with BUILD attributes such as a
// state_dict's `_metadata`), tensor, dtype. torch.Size becomes a tuple. Values are handles to
// shared immutable nodes: an object the pickle references twice (memo) is one node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "crucible/ptload/TensorView.h"

namespace crucible::ptload {

namespace detail {
struct PickleRep;  // kind and scalars; heavier kinds extend it (Note [PickleValue nodes])
}  // namespace detail

class PickleValue {
 public:
  enum class Kind : std::uint8_t {
    None,
    Bool,
    Int,
    BigInt,
    Float,
    String,
    Tuple,
    List,
    Set,
    Dict,
    Tensor,
    Dtype,
  };
  using Entry = std::pair<PickleValue, PickleValue>;

  PickleValue();  // None
  static PickleValue boolean(bool v);
  static PickleValue integer(std::int64_t v);
  static PickleValue big_integer(std::string le_twos_complement);
  static PickleValue floating(double v);
  static PickleValue string(std::string v);
  static PickleValue sequence(Kind kind, std::vector<PickleValue> items);  // Tuple, List, Set
  static PickleValue dict(std::vector<Entry> entries, bool ordered, PickleValue attributes);
  static PickleValue tensor(TensorView t);
  static PickleValue dtype(std::int8_t c10_ordinal);

  Kind kind() const;
  bool is(Kind k) const { return kind() == k; }
  static std::string_view kind_name(Kind k);

  bool as_bool() const;
  std::int64_t as_int() const;
  double as_float() const;
  const std::string& as_string() const;        // String, or BigInt's bytes
  std::span<const PickleValue> items() const;  // Tuple, List, Set
  std::span<const Entry> entries() const;      // Dict, in insertion order
  bool is_ordered_dict() const;
  const PickleValue& attributes() const;               // Dict: BUILD state, None when absent
  const PickleValue* get(std::string_view key) const;  // Dict entry with a str key, or nullptr
  const TensorView& as_tensor() const;
  std::int8_t as_dtype() const;

  // Python-like text for names and messages: 'a', 3, True, (1, 2), ... At most kMaxReprBytes
  // (then "..."): a DAG of shared lists would otherwise print 2^depth items.
  std::string repr() const;
  static constexpr std::size_t kMaxReprBytes = std::size_t{1} << 20;

  // Heap bytes one value of kind `k` takes for its node (control block included), not counting
  // what the node owns (string bytes, items, a tensor's sizes): what memory budgets charge.
  static std::size_t node_bytes(Kind k);

 private:
  using Rep = detail::PickleRep;
  explicit PickleValue(std::shared_ptr<const Rep> rep) : rep_(std::move(rep)) {}
  std::shared_ptr<const Rep> rep_;  // nullptr is None
};

}  // namespace crucible::ptload
