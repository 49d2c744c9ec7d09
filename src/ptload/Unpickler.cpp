// Unpickler.cpp — the restricted pickle VM (see Unpickler.h for what it accepts).
//
// Note [Why an arena]
// Pickle objects are shared and mutable: a dict is memoized (BINPUT) before SETITEMS fills it,
// and BINGET hands out the same object again. The VM keeps every object in one arena (a vector
// of Nodes addressed by index), so sharing and later mutation behave as in Python, a crafted
// cycle (a list appended to itself) cannot leak or recurse while the VM runs, and a failed run
// frees everything at once. Only after STOP is the root turned into PickleValues, memoized per
// node (so a DAG that repeats one object 2^k times costs k nodes, not 2^k), refusing cycles and
// nesting deeper than UnpickleLimits::max_depth.
#include "crucible/ptload/Unpickler.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "crucible/core/Contract.h"
#include "crucible/core/ScalarType.h"

namespace crucible::ptload {
namespace {

enum class NodeKind : std::uint8_t {
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
  Global,
  Storage,
};

// What a GLOBAL from the allowlist may be used for.
enum class Callable : std::uint8_t {
  None,                       // a value only (storage classes as persistent-id tags, dtypes)
  OrderedDict,                // REDUCE or NEWOBJ with () -> empty ordered dict; BUILD target
  RebuildTensorV2,            // (storage, offset, size, stride, requires_grad, hooks[, metadata])
  RebuildParameter,           // (tensor, requires_grad, hooks)
  RebuildParameterWithState,  // (tensor, requires_grad, hooks, state)
  Size,                       // ((ints...),) -> tuple
};

struct Allowed {
  std::string_view module, name;
  Callable call;
  std::int8_t storage_dtype;  // -1 unless a storage class
};

// The allowlist: exact (module, name) pairs. Nothing is ever imported; anything else is refused.
constexpr Allowed kAllowed[] = {
    {"collections", "OrderedDict", Callable::OrderedDict, -1},
    {"torch._utils", "_rebuild_tensor_v2", Callable::RebuildTensorV2, -1},
    {"torch._utils", "_rebuild_parameter", Callable::RebuildParameter, -1},
    {"torch._utils", "_rebuild_parameter_with_state", Callable::RebuildParameterWithState, -1},
    {"torch", "Size", Callable::Size, -1},
    {"torch", "FloatStorage", Callable::None, dtype::kFloat32},
    {"torch", "DoubleStorage", Callable::None, dtype::kFloat64},
    {"torch", "HalfStorage", Callable::None, dtype::kFloat16},
    {"torch", "BFloat16Storage", Callable::None, dtype::kBFloat16},
    {"torch", "LongStorage", Callable::None, dtype::kInt64},
    {"torch", "IntStorage", Callable::None, dtype::kInt32},
    {"torch", "ShortStorage", Callable::None, dtype::kInt16},
    {"torch", "CharStorage", Callable::None, dtype::kInt8},
    {"torch", "ByteStorage", Callable::None, dtype::kUInt8},
    {"torch", "BoolStorage", Callable::None, dtype::kBool},
};
static_assert(std::size(kAllowed) == 15,
              "5 callables + 10 storage classes; dtypes come from ScalarType");

constexpr std::uint32_t kNoNode = 0xFFFFFFFFu;
// A dict key's canonical text (what makes 1 and True the same key, as in Python) is capped: a
// tuple key nesting one tuple twice per level would otherwise grow 2^depth.
constexpr std::size_t kMaxKeyBytes = 1u << 16;
// Storage keys are record names under data/: torch writes decimal numbers.
constexpr std::size_t kMaxStorageKey = 64;

struct Node {
  NodeKind kind = NodeKind::None;
  bool flag = false;       // Bool value; Dict: is an OrderedDict
  std::int8_t dtype = -1;  // Dtype; Global: storage class dtype
  Callable call = Callable::None;
  std::int64_t i = 0;
  double f = 0.0;
  std::string s;                                      // String, BigInt bytes, Global "module.name"
  std::vector<std::uint32_t> items;                   // Tuple/List/Set; Dict: k0 v0 k1 v1 ...
  std::unordered_map<std::string, std::size_t> keys;  // Dict: canonical key -> pair index
  std::uint32_t attrs = kNoNode;                      // Dict: BUILD state
  std::shared_ptr<const TensorStorage> storage;
  std::optional<TensorView> tensor;
};

const char* opcode_name(std::uint8_t op) {
  switch (op) {
    case '(':
      return "MARK";
    case '.':
      return "STOP";
    case '0':
      return "POP";
    case '1':
      return "POP_MARK";
    case '2':
      return "DUP";
    case 'F':
      return "FLOAT";
    case 'I':
      return "INT";
    case 'J':
      return "BININT";
    case 'K':
      return "BININT1";
    case 'L':
      return "LONG";
    case 'M':
      return "BININT2";
    case 'N':
      return "NONE";
    case 'P':
      return "PERSID";
    case 'Q':
      return "BINPERSID";
    case 'R':
      return "REDUCE";
    case 'S':
      return "STRING";
    case 'T':
      return "BINSTRING";
    case 'U':
      return "SHORT_BINSTRING";
    case 'V':
      return "UNICODE";
    case 'X':
      return "BINUNICODE";
    case 'a':
      return "APPEND";
    case 'b':
      return "BUILD";
    case 'c':
      return "GLOBAL";
    case 'd':
      return "DICT";
    case '}':
      return "EMPTY_DICT";
    case 'e':
      return "APPENDS";
    case 'g':
      return "GET";
    case 'h':
      return "BINGET";
    case 'i':
      return "INST";
    case 'j':
      return "LONG_BINGET";
    case 'l':
      return "LIST";
    case ']':
      return "EMPTY_LIST";
    case 'o':
      return "OBJ";
    case 'p':
      return "PUT";
    case 'q':
      return "BINPUT";
    case 'r':
      return "LONG_BINPUT";
    case 's':
      return "SETITEM";
    case 't':
      return "TUPLE";
    case ')':
      return "EMPTY_TUPLE";
    case 'u':
      return "SETITEMS";
    case 'G':
      return "BINFLOAT";
    case 'B':
      return "BINBYTES";
    case 'C':
      return "SHORT_BINBYTES";
    case 0x80:
      return "PROTO";
    case 0x81:
      return "NEWOBJ";
    case 0x82:
      return "EXT1";
    case 0x83:
      return "EXT2";
    case 0x84:
      return "EXT4";
    case 0x85:
      return "TUPLE1";
    case 0x86:
      return "TUPLE2";
    case 0x87:
      return "TUPLE3";
    case 0x88:
      return "NEWTRUE";
    case 0x89:
      return "NEWFALSE";
    case 0x8a:
      return "LONG1";
    case 0x8b:
      return "LONG4";
    case 0x8c:
      return "SHORT_BINUNICODE";
    case 0x8d:
      return "BINUNICODE8";
    case 0x8e:
      return "BINBYTES8";
    case 0x8f:
      return "EMPTY_SET";
    case 0x90:
      return "ADDITEMS";
    case 0x91:
      return "FROZENSET";
    case 0x92:
      return "NEWOBJ_EX";
    case 0x93:
      return "STACK_GLOBAL";
    case 0x94:
      return "MEMOIZE";
    case 0x95:
      return "FRAME";
    case 0x96:
      return "BYTEARRAY8";
    case 0x97:
      return "NEXT_BUFFER";
    case 0x98:
      return "READONLY_BUFFER";
    default:
      return nullptr;
  }
}

// Attacker-controlled text in a message: printable ASCII kept, the rest \xNN, at most 80 bytes.
std::string printable(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < 80; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 80) out += "...";
  return out;
}

// UTF-8 as Python's pickle decodes it ('utf-8', 'surrogatepass': lone surrogates are allowed).
bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n;
    std::uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else
      return false;
    if (s.size() - i - 1 < n) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const std::uint32_t min_cp = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF) return false;  // overlong or out of range
    i += n + 1;
  }
  return true;
}

class Vm {
 public:
  Vm(std::span<const std::byte> in, const StorageResolver& resolver, const UnpickleLimits& limits)
      : in_(in), resolver_(resolver), limits_(limits) {}

  Result<PickleValue> run();

 private:
  // --- errors: what is wrong, where, what to do ---
  std::string where() const {
    const char* n = opcode_name(op_);
    char buf[96];
    std::snprintf(buf, sizeof buf, " (opcode %s 0x%02x at data.pkl offset %zu)", n ? n : "unknown",
                  op_, op_pos_);
    return buf;
  }
  Status corrupt(const std::string& what) const {
    return invalid_input("pt pickle: " + what + where(),
                         "the file is corrupt or truncated; re-save it with torch.save");
  }
  Status refuse(const std::string& what) const {
    return invalid_input("pt pickle: refused: " + what + where(),
                         "only tensors, parameters, containers, numbers and strings load without "
                         "torch; re-save with torch.save(model.state_dict(), path) in a current "
                         "PyTorch (do not load an untrusted file with torch.load)");
  }

  // --- input ---
  Result<const std::byte*> take(std::size_t n) {
    if (in_.size() - pos_ < n)
      return corrupt("needs " + std::to_string(n) + " bytes but only " +
                     std::to_string(in_.size() - pos_) + " are left");
    const std::byte* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  template <class T>
  Result<T> take_le() {
    auto p = take(sizeof(T));
    if (!p.ok()) return p.status();
    T v;
    std::memcpy(&v, *p, sizeof v);  // pickle integers are little-endian, as is the host
    return v;
  }
  Result<std::string_view> take_line() {
    const auto* begin = reinterpret_cast<const char*>(in_.data() + pos_);
    const std::string_view rest(begin, in_.size() - pos_);
    const auto nl = rest.find('\n');
    if (nl == std::string_view::npos) return corrupt("GLOBAL line has no terminating newline");
    pos_ += nl + 1;
    return rest.substr(0, nl);
  }

  // --- the arena and the stack ---
  std::uint32_t add(Node n) {
    CRUCIBLE_ASSERT(nodes_.size() < kNoNode, "one node per opcode byte at most");
    nodes_.push_back(std::move(n));
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }
  std::uint32_t add_kind(NodeKind k) {
    Node n;
    n.kind = k;
    return add(std::move(n));
  }
  std::size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  Result<std::uint32_t> pop() {
    if (stack_.size() <= fence())
      return corrupt(marks_.empty() ? "stack underflow"
                                    : "stack underflow (would pop past a MARK)");
    const std::uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Result<std::uint32_t> top() {
    if (stack_.size() <= fence())
      return corrupt(marks_.empty() ? "stack underflow"
                                    : "stack underflow (would read past a MARK)");
    return stack_.back();
  }
  Result<std::vector<std::uint32_t>> pop_mark() {
    if (marks_.empty()) return corrupt("no MARK to pop to");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<std::uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  std::string describe(std::uint32_t id) const {
    const Node& n = nodes_[id];
    switch (n.kind) {
      case NodeKind::Global:
        return "global " + printable(n.s);
      case NodeKind::Storage:
        return "a storage";
      case NodeKind::Dict:
        return n.flag ? "an OrderedDict" : "a dict";
      default:
        return std::string("a ") +
               std::string(PickleValue::kind_name(static_cast<PickleValue::Kind>(n.kind)));
    }
  }

  Status step();
  Status op_global();
  Status op_reduce();
  Status op_persid();
  Status set_item(std::uint32_t dict, std::uint32_t key, std::uint32_t value);
  Status key_text(std::uint32_t id, std::string& out, std::size_t depth) const;
  Result<std::uint32_t> call(const Node& fn, const Node& args);
  Result<std::uint32_t> rebuild_tensor(const Node& args);
  Result<std::int64_t> int_arg(std::uint32_t id, const char* what) const;
  Result<std::vector<std::int64_t>> ints_arg(std::uint32_t id, const char* what) const;
  bool empty_dict(std::uint32_t id) const {
    return nodes_[id].kind == NodeKind::Dict && nodes_[id].items.empty();
  }
  Result<PickleValue> to_value(std::uint32_t id, std::size_t depth);

  std::span<const std::byte> in_;
  const StorageResolver& resolver_;
  const UnpickleLimits& limits_;
  std::size_t pos_ = 0, op_pos_ = 0;
  std::uint8_t op_ = 0;
  bool stopped_ = false;
  std::vector<Node> nodes_;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint32_t, std::uint32_t> memo_;
  std::unordered_map<std::string, std::shared_ptr<const TensorStorage>> storages_;
  std::vector<std::optional<PickleValue>> converted_;
  std::vector<bool> on_path_;
  // Levels of nesting inside each converted node (0 for a leaf): a node met again through the
  // memo adds its whole height at the depth where it is met, so sharing cannot stack deep
  // values past max_depth.
  std::vector<std::uint32_t> height_;
};

Result<PickleValue> Vm::run() {
  if (in_.empty()) return corrupt("data.pkl is empty");
  while (!stopped_) {
    if (pos_ >= in_.size()) return corrupt("pickle ends without STOP");
    CRUCIBLE_RETURN_IF_ERROR(step());
  }
  const std::uint32_t root = stack_.back();
  converted_.resize(nodes_.size());
  on_path_.assign(nodes_.size(), false);
  height_.assign(nodes_.size(), 0);
  return to_value(root, 0);
}

Status Vm::step() {
  op_pos_ = pos_;
  op_ = std::to_integer<std::uint8_t>(in_[pos_++]);
  auto push_int = [&](std::int64_t v) {
    Node n;
    n.kind = NodeKind::Int;
    n.i = v;
    stack_.push_back(add(std::move(n)));
    return ok_status();
  };
  auto push_string = [&](std::size_t len) -> Status {
    auto p = take(len);
    if (!p.ok()) return p.status();
    Node n;
    n.kind = NodeKind::String;
    n.s.assign(reinterpret_cast<const char*>(*p), len);
    if (!valid_utf8(n.s)) return corrupt("string is not valid UTF-8");
    stack_.push_back(add(std::move(n)));
    return ok_status();
  };
  auto make_tuple = [&](std::vector<std::uint32_t> items) {
    Node n;
    n.kind = NodeKind::Tuple;
    n.items = std::move(items);
    stack_.push_back(add(std::move(n)));
    return ok_status();
  };
  switch (op_) {
    case 0x80: {  // PROTO
      auto v = take_le<std::uint8_t>();
      if (!v.ok()) return v.status();
      if (op_pos_ != 0) return corrupt("PROTO after the first byte");
      if (*v != 2)
        return refuse(
            "pickle protocol " + std::to_string(*v) +
            "; only protocol 2, torch.save's default, is read (do not pass pickle_protocol)");
      return ok_status();
    }
    case '.': {  // STOP
      if (!marks_.empty())
        return corrupt(std::to_string(marks_.size()) + " MARK(s) still open at STOP");
      if (stack_.size() != 1)
        return corrupt("STOP with " + std::to_string(stack_.size()) +
                       " objects on the stack (want 1)");
      if (pos_ != in_.size())
        return corrupt(std::to_string(in_.size() - pos_) + " bytes after STOP");
      stopped_ = true;
      return ok_status();
    }
    case 'c':
      return op_global();
    case 'R':
      return op_reduce();
    case 0x81: {  // NEWOBJ: cls.__new__(cls, *args); only OrderedDict() here
      auto args = pop();
      if (!args.ok()) return args.status();
      auto cls = pop();
      if (!cls.ok()) return cls.status();
      const Node& c = nodes_[*cls];
      if (c.kind != NodeKind::Global || c.call != Callable::OrderedDict)
        return refuse("NEWOBJ on " + describe(*cls) + " (only collections.OrderedDict)");
      if (nodes_[*args].kind != NodeKind::Tuple || !nodes_[*args].items.empty())
        return refuse("NEWOBJ collections.OrderedDict with arguments");
      Node d;
      d.kind = NodeKind::Dict;
      d.flag = true;
      stack_.push_back(add(std::move(d)));
      return ok_status();
    }
    case 'b': {  // BUILD: obj.__setstate__(state); only an OrderedDict's attribute dict
      auto state = pop();
      if (!state.ok()) return state.status();
      auto obj = top();
      if (!obj.ok()) return obj.status();
      Node& o = nodes_[*obj];
      if (o.kind != NodeKind::Dict || !o.flag)
        return refuse("BUILD on " + describe(*obj) + " (only an OrderedDict's attributes)");
      if (nodes_[*state].kind == NodeKind::None) return ok_status();
      if (nodes_[*state].kind != NodeKind::Dict)
        return refuse("BUILD state " + describe(*state) + " (only a dict of attributes)");
      if (o.attrs != kNoNode) return refuse("a second BUILD on one OrderedDict");
      o.attrs = *state;
      return ok_status();
    }
    case '(':
      marks_.push_back(stack_.size());
      return ok_status();
    case 't': {
      auto items = pop_mark();
      if (!items.ok()) return items.status();
      return make_tuple(std::move(*items));
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      const std::size_t n = op_ - 0x84u;
      std::vector<std::uint32_t> items(n);
      for (std::size_t k = n; k-- > 0;) {
        auto v = pop();
        if (!v.ok()) return v.status();
        items[k] = *v;
      }
      return make_tuple(std::move(items));
    }
    case ')':
      return make_tuple({});
    case ']':
      stack_.push_back(add_kind(NodeKind::List));
      return ok_status();
    case '}':
      stack_.push_back(add_kind(NodeKind::Dict));
      return ok_status();
    case 0x8f:
      stack_.push_back(add_kind(NodeKind::Set));
      return ok_status();
    case 'a': {  // APPEND
      auto v = pop();
      if (!v.ok()) return v.status();
      auto l = top();
      if (!l.ok()) return l.status();
      if (nodes_[*l].kind != NodeKind::List)
        return refuse("APPEND to " + describe(*l) + " (only a list)");
      nodes_[*l].items.push_back(*v);
      return ok_status();
    }
    case 'e': {  // APPENDS
      auto items = pop_mark();
      if (!items.ok()) return items.status();
      auto l = top();
      if (!l.ok()) return l.status();
      if (nodes_[*l].kind != NodeKind::List)
        return refuse("APPENDS to " + describe(*l) + " (only a list)");
      auto& dst = nodes_[*l].items;
      dst.insert(dst.end(), items->begin(), items->end());
      return ok_status();
    }
    case 's': {  // SETITEM
      auto v = pop();
      if (!v.ok()) return v.status();
      auto k = pop();
      if (!k.ok()) return k.status();
      auto d = top();
      if (!d.ok()) return d.status();
      return set_item(*d, *k, *v);
    }
    case 'u': {  // SETITEMS
      auto items = pop_mark();
      if (!items.ok()) return items.status();
      if (items->size() % 2 != 0) return corrupt("SETITEMS with an odd number of items");
      auto d = top();
      if (!d.ok()) return d.status();
      for (std::size_t k = 0; k < items->size(); k += 2)
        CRUCIBLE_RETURN_IF_ERROR(set_item(*d, (*items)[k], (*items)[k + 1]));
      return ok_status();
    }
    case 'N':
      stack_.push_back(add_kind(NodeKind::None));
      return ok_status();
    case 0x88:
    case 0x89: {
      Node n;
      n.kind = NodeKind::Bool;
      n.flag = op_ == 0x88;
      stack_.push_back(add(std::move(n)));
      return ok_status();
    }
    case 'J': {
      auto v = take_le<std::int32_t>();
      if (!v.ok()) return v.status();
      return push_int(*v);
    }
    case 'K': {
      auto v = take_le<std::uint8_t>();
      if (!v.ok()) return v.status();
      return push_int(*v);
    }
    case 'M': {
      auto v = take_le<std::uint16_t>();
      if (!v.ok()) return v.status();
      return push_int(*v);
    }
    case 0x8a: {  // LONG1: n bytes of little-endian two's complement
      auto n = take_le<std::uint8_t>();
      if (!n.ok()) return n.status();
      auto p = take(*n);
      if (!p.ok()) return p.status();
      const auto* b = reinterpret_cast<const std::uint8_t*>(*p);
      // It fits int64 when every byte past the 8th is the sign extension of byte 7.
      bool fits = true;
      const std::uint8_t ext =
          (*n > 0 && (b[std::min<std::size_t>(*n, 8) - 1] & 0x80)) ? 0xFF : 0x00;
      for (std::size_t k = 8; k < *n; ++k) fits &= b[k] == ext;
      if (!fits) {
        Node big;
        big.kind = NodeKind::BigInt;
        big.s.assign(reinterpret_cast<const char*>(b), *n);
        stack_.push_back(add(std::move(big)));
        return ok_status();
      }
      std::uint64_t u = ext ? ~std::uint64_t{0} : 0;
      for (std::size_t k = 0; k < std::min<std::size_t>(*n, 8); ++k) {
        u &= ~(std::uint64_t{0xFF} << (8 * k));
        u |= std::uint64_t{b[k]} << (8 * k);
      }
      return push_int(static_cast<std::int64_t>(u));
    }
    case 'G': {  // BINFLOAT: big-endian IEEE double
      auto v = take_le<std::uint64_t>();
      if (!v.ok()) return v.status();
      Node n;
      n.kind = NodeKind::Float;
      n.f = std::bit_cast<double>(__builtin_bswap64(*v));
      stack_.push_back(add(std::move(n)));
      return ok_status();
    }
    case 'X': {
      auto len = take_le<std::uint32_t>();
      if (!len.ok()) return len.status();
      return push_string(*len);
    }
    case 'U': {
      auto len = take_le<std::uint8_t>();
      if (!len.ok()) return len.status();
      return push_string(*len);
    }
    case 'Q':
      return op_persid();
    case 'h':
    case 'j': {  // BINGET, LONG_BINGET
      std::uint32_t idx;
      if (op_ == 'h') {
        auto v = take_le<std::uint8_t>();
        if (!v.ok()) return v.status();
        idx = *v;
      } else {
        auto v = take_le<std::uint32_t>();
        if (!v.ok()) return v.status();
        idx = *v;
      }
      auto it = memo_.find(idx);
      if (it == memo_.end())
        return corrupt("memo index " + std::to_string(idx) +
                       " was never stored (BINPUT) before this get");
      stack_.push_back(it->second);
      return ok_status();
    }
    case 'q':
    case 'r': {  // BINPUT, LONG_BINPUT
      std::uint32_t idx;
      if (op_ == 'q') {
        auto v = take_le<std::uint8_t>();
        if (!v.ok()) return v.status();
        idx = *v;
      } else {
        auto v = take_le<std::uint32_t>();
        if (!v.ok()) return v.status();
        idx = *v;
      }
      auto t = top();
      if (!t.ok()) return t.status();
      memo_[idx] = *t;
      return ok_status();
    }
    default: {
      const char* n = opcode_name(op_);
      return refuse(n ? std::string("opcode ") + n + " is not allowed"
                      : "unknown opcode byte " + std::to_string(op_));
    }
  }
}

Status Vm::op_global() {
  auto module = take_line();
  if (!module.ok()) return module.status();
  auto name = take_line();
  if (!name.ok()) return name.status();
  Node n;
  n.kind = NodeKind::Global;
  for (const Allowed& a : kAllowed) {
    if (a.module == *module && a.name == *name) {
      n.call = a.call;
      n.dtype = a.storage_dtype;
      n.s = std::string(a.module) + "." + std::string(a.name);
      stack_.push_back(add(std::move(n)));
      return ok_status();
    }
  }
  // torch.<dtype>: the exact canonical names of the dtype table ("float32", not "float").
  if (*module == "torch") {
    auto ord = scalar_type_from_name(*name);
    if (ord.ok() && scalar_type_info(*ord).name == *name) {
      Node d;
      d.kind = NodeKind::Dtype;
      d.dtype = *ord;
      stack_.push_back(add(std::move(d)));
      return ok_status();
    }
  }
  return refuse("GLOBAL " + printable(*module) + "." + printable(*name) +
                " is not on the allowlist");
}

Status Vm::op_reduce() {
  auto args = pop();
  if (!args.ok()) return args.status();
  auto fn = pop();
  if (!fn.ok()) return fn.status();
  const Node& f = nodes_[*fn];
  if (f.kind != NodeKind::Global || f.call == Callable::None)
    return refuse("REDUCE on " + describe(*fn) + " (not a callable on the allowlist)");
  if (nodes_[*args].kind != NodeKind::Tuple)
    return corrupt("REDUCE arguments are " + describe(*args) + ", not a tuple");
  // call() may grow nodes_: pass copies of what it reads by reference.
  const Node fn_copy = f;
  const Node args_copy = nodes_[*args];
  auto r = call(fn_copy, args_copy);
  if (!r.ok()) return r.status();
  stack_.push_back(*r);
  return ok_status();
}

Result<std::int64_t> Vm::int_arg(std::uint32_t id, const char* what) const {
  if (nodes_[id].kind != NodeKind::Int)
    return refuse(std::string(what) + " is " + describe(id) + ", not an int");
  return nodes_[id].i;
}

Result<std::vector<std::int64_t>> Vm::ints_arg(std::uint32_t id, const char* what) const {
  if (nodes_[id].kind != NodeKind::Tuple)
    return refuse(std::string(what) + " is " + describe(id) + ", not a tuple of ints");
  std::vector<std::int64_t> out;
  out.reserve(nodes_[id].items.size());
  for (std::uint32_t item : nodes_[id].items) {
    auto v = int_arg(item, what);
    if (!v.ok()) return v.status();
    out.push_back(*v);
  }
  return out;
}

Result<std::uint32_t> Vm::call(const Node& fn, const Node& args) {
  const auto& a = args.items;
  switch (fn.call) {
    case Callable::OrderedDict: {
      if (!a.empty())
        return refuse("collections.OrderedDict called with arguments (torch.save passes none)");
      Node d;
      d.kind = NodeKind::Dict;
      d.flag = true;
      return add(std::move(d));
    }
    case Callable::Size: {
      if (a.size() != 1) return refuse("torch.Size takes one tuple of ints");
      auto dims = ints_arg(a[0], "torch.Size argument");
      if (!dims.ok()) return dims.status();
      Node t;
      t.kind = NodeKind::Tuple;
      t.items = nodes_[a[0]].items;
      return add(std::move(t));
    }
    case Callable::RebuildTensorV2:
      return rebuild_tensor(args);
    case Callable::RebuildParameter:
    case Callable::RebuildParameterWithState: {
      const std::size_t want = fn.call == Callable::RebuildParameter ? 3 : 4;
      if (a.size() != want)
        return refuse(fn.s + " takes " + std::to_string(want) + " arguments, got " +
                      std::to_string(a.size()));
      if (nodes_[a[0]].kind != NodeKind::Tensor)
        return refuse(fn.s + " data is " + describe(a[0]) + ", not a tensor");
      if (nodes_[a[1]].kind != NodeKind::Bool)
        return refuse(fn.s + " requires_grad is " + describe(a[1]) + ", not a bool");
      if (!empty_dict(a[2])) return refuse(fn.s + " with backward hooks (hooks are code)");
      if (want == 4 && nodes_[a[3]].kind != NodeKind::None && !empty_dict(a[3]))
        return refuse(fn.s + " with Python state on the parameter (not loaded without torch)");
      Node t;
      t.kind = NodeKind::Tensor;
      t.tensor.emplace(nodes_[a[0]].tensor->as_parameter(nodes_[a[1]].flag));
      return add(std::move(t));
    }
    case Callable::None:
      break;
  }
  CRUCIBLE_ASSERT(false, "op_reduce() refuses non-callables");
  return refuse("call of a non-callable");
}

Result<std::uint32_t> Vm::rebuild_tensor(const Node& args) {
  const auto& a = args.items;
  if (a.size() != 6 && a.size() != 7)
    return refuse("torch._utils._rebuild_tensor_v2 takes 6 or 7 arguments, got " +
                  std::to_string(a.size()));
  if (nodes_[a[0]].kind != NodeKind::Storage)
    return refuse("_rebuild_tensor_v2 storage is " + describe(a[0]) + ", not a persistent storage");
  auto offset = int_arg(a[1], "_rebuild_tensor_v2 storage_offset");
  if (!offset.ok()) return offset.status();
  auto sizes = ints_arg(a[2], "_rebuild_tensor_v2 size");
  if (!sizes.ok()) return sizes.status();
  auto strides = ints_arg(a[3], "_rebuild_tensor_v2 stride");
  if (!strides.ok()) return strides.status();
  if (nodes_[a[4]].kind != NodeKind::Bool)
    return refuse("_rebuild_tensor_v2 requires_grad is " + describe(a[4]) + ", not a bool");
  if (!empty_dict(a[5])) return refuse("_rebuild_tensor_v2 with backward hooks (hooks are code)");
  if (a.size() == 7 && !empty_dict(a[6]) && nodes_[a[6]].kind != NodeKind::None)
    return refuse(
        "_rebuild_tensor_v2 with tensor metadata (Python attributes on a tensor are not loaded)");
  auto view = TensorView::make(nodes_[a[0]].storage, *offset, std::move(*sizes),
                               std::move(*strides), nodes_[a[4]].flag);
  if (!view.ok()) return corrupt(std::string(view.status().message()));
  Node t;
  t.kind = NodeKind::Tensor;
  t.tensor.emplace(std::move(*view));
  return add(std::move(t));
}

Status Vm::op_persid() {
  auto pid = pop();
  if (!pid.ok()) return pid.status();
  const Node& t = nodes_[*pid];
  const std::string want = "is not ('storage', torch.<T>Storage, key, location, numel)";
  if (t.kind != NodeKind::Tuple || t.items.size() != 5)
    return refuse(
        "persistent id " + describe(*pid) +
        (t.kind == NodeKind::Tuple ? " of " + std::to_string(t.items.size()) + " items " : " ") +
        want);
  const auto& it = t.items;
  if (nodes_[it[0]].kind != NodeKind::String || nodes_[it[0]].s != "storage")
    return refuse("persistent id tag is " + describe(it[0]) + ", not 'storage'");
  const Node& cls = nodes_[it[1]];
  if (cls.kind != NodeKind::Global || cls.dtype < 0)
    return refuse("persistent id storage type is " + describe(it[1]) +
                  ", not a torch.<T>Storage class");
  if (nodes_[it[2]].kind != NodeKind::String)
    return refuse("persistent id key is " + describe(it[2]) + ", not a str");
  const std::string& key = nodes_[it[2]].s;
  if (key.empty() || key.size() > kMaxStorageKey ||
      key.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_") !=
          std::string::npos)
    return refuse("persistent id key '" + printable(key) +
                  "' is not a plain record name (letters, digits, _)");
  if (nodes_[it[3]].kind != NodeKind::String)
    return refuse("persistent id location is " + describe(it[3]) + ", not a str");
  if (nodes_[it[4]].kind != NodeKind::Int || nodes_[it[4]].i < 0)
    return refuse("persistent id numel is " + describe(it[4]) + ", not a non-negative int");
  const auto numel = static_cast<std::uint64_t>(nodes_[it[4]].i);
  std::shared_ptr<const TensorStorage> s;
  if (auto found = storages_.find(key); found != storages_.end()) {
    s = found->second;
    if (s->dtype != cls.dtype || s->numel != numel)
      return refuse("storage '" + key + "' is referenced twice with different types or sizes");
  } else {
    auto r = resolver_(StorageRequest{key, nodes_[it[3]].s, cls.dtype, numel});
    if (!r.ok()) return corrupt(std::string(r.status().message()));
    s = *r;
    CRUCIBLE_ASSERT(s && s->numel == numel && s->dtype == cls.dtype,
                    "resolver honours the request");
    storages_.emplace(key, s);
  }
  Node n;
  n.kind = NodeKind::Storage;
  n.storage = std::move(s);
  stack_.push_back(add(std::move(n)));
  return ok_status();
}

// Canonical text of a hashable key; Python's equal keys (1, 1.0, True) give equal text.
Status Vm::key_text(std::uint32_t id, std::string& out, std::size_t depth) const {
  if (depth > limits_.max_depth)
    return refuse("dict key nests deeper than " + std::to_string(limits_.max_depth));
  if (out.size() > kMaxKeyBytes) return refuse("dict key longer than 64 KiB");
  const Node& n = nodes_[id];
  switch (n.kind) {
    case NodeKind::None:
      out += 'n';
      return ok_status();
    case NodeKind::Bool:
      out += 'i';
      out += n.flag ? '1' : '0';
      out += ';';
      return ok_status();
    case NodeKind::Int:
      out += 'i' + std::to_string(n.i) + ';';
      return ok_status();
    case NodeKind::Float: {
      // Range first: casting a double outside int64 (or NaN) to an integer is undefined.
      if (n.f > -9.2e18 && n.f < 9.2e18 &&
          n.f == static_cast<double>(static_cast<std::int64_t>(n.f))) {
        out += 'i' + std::to_string(static_cast<std::int64_t>(n.f)) + ';';
      } else {
        out += 'f' + std::to_string(std::bit_cast<std::uint64_t>(n.f)) + ';';
      }
      return ok_status();
    }
    case NodeKind::BigInt:
    case NodeKind::String:
      out += n.kind == NodeKind::String ? 's' : 'b';
      out += std::to_string(n.s.size()) + ':' + n.s;
      return ok_status();
    case NodeKind::Dtype:
      out += 'd' + std::to_string(n.dtype) + ';';
      return ok_status();
    case NodeKind::Tuple:
      out += "t(";
      for (std::uint32_t item : n.items) CRUCIBLE_RETURN_IF_ERROR(key_text(item, out, depth + 1));
      out += ')';
      return ok_status();
    default:
      return refuse("dict key of type " + describe(id) + " (unhashable or not supported)");
  }
}

Status Vm::set_item(std::uint32_t dict, std::uint32_t key, std::uint32_t value) {
  if (nodes_[dict].kind != NodeKind::Dict)
    return refuse("SETITEM(S) on " + describe(dict) + " (only a dict)");
  std::string k;
  CRUCIBLE_RETURN_IF_ERROR(key_text(key, k, 0));
  Node& d = nodes_[dict];
  auto [it, inserted] = d.keys.emplace(std::move(k), d.items.size() / 2);
  if (inserted) {
    d.items.push_back(key);
    d.items.push_back(value);
  } else {
    d.items[2 * it->second + 1] = value;  // Python keeps the first key object, takes the new value
  }
  return ok_status();
}

Result<PickleValue> Vm::to_value(std::uint32_t id, std::size_t depth) {
  // A node met again through the memo reaches as deep as its height below `depth`.
  if (depth + (converted_[id] ? height_[id] : 0) > limits_.max_depth)
    return exhausted(
        "pt pickle: containers nest deeper than " + std::to_string(limits_.max_depth) + where(),
        "flatten the saved object; real checkpoints nest a few levels");
  if (converted_[id]) return *converted_[id];
  if (on_path_[id]) return refuse("an object that contains itself (a reference cycle)");
  on_path_[id] = true;
  const Node& n = nodes_[id];
  PickleValue v;
  std::uint32_t height = 0;
  switch (n.kind) {
    case NodeKind::None:
      break;
    case NodeKind::Bool:
      v = PickleValue::boolean(n.flag);
      break;
    case NodeKind::Int:
      v = PickleValue::integer(n.i);
      break;
    case NodeKind::BigInt:
      v = PickleValue::big_integer(n.s);
      break;
    case NodeKind::Float:
      v = PickleValue::floating(n.f);
      break;
    case NodeKind::String:
      v = PickleValue::string(n.s);
      break;
    case NodeKind::Dtype:
      v = PickleValue::dtype(n.dtype);
      break;
    case NodeKind::Tensor:
      v = PickleValue::tensor(*n.tensor);
      break;
    case NodeKind::Tuple:
    case NodeKind::List:
    case NodeKind::Set: {
      std::vector<PickleValue> items;
      items.reserve(n.items.size());
      for (std::uint32_t item : n.items) {  // nodes_ does not grow here: n stays valid
        auto c = to_value(item, depth + 1);
        if (!c.ok()) return c.status();
        height = std::max(height, height_[item] + 1);
        items.push_back(std::move(*c));
      }
      v = PickleValue::sequence(static_cast<PickleValue::Kind>(n.kind), std::move(items));
      break;
    }
    case NodeKind::Dict: {
      std::vector<PickleValue::Entry> entries;
      entries.reserve(n.items.size() / 2);
      for (std::size_t k = 0; k < n.items.size(); k += 2) {
        auto key = to_value(n.items[k], depth + 1);
        if (!key.ok()) return key.status();
        auto val = to_value(n.items[k + 1], depth + 1);
        if (!val.ok()) return val.status();
        height = std::max({height, height_[n.items[k]] + 1, height_[n.items[k + 1]] + 1});
        entries.emplace_back(std::move(*key), std::move(*val));
      }
      PickleValue attrs;
      if (n.attrs != kNoNode) {
        auto a = to_value(n.attrs, depth + 1);
        if (!a.ok()) return a.status();
        height = std::max(height, height_[n.attrs] + 1);
        attrs = std::move(*a);
      }
      v = PickleValue::dict(std::move(entries), n.flag, std::move(attrs));
      break;
    }
    case NodeKind::Global:
    case NodeKind::Storage:
      return refuse("the result holds " + describe(id) +
                    " outside a tensor (only tensors carry storages)");
  }
  on_path_[id] = false;
  converted_[id] = v;
  height_[id] = height;
  return v;
}

}  // namespace

static_assert(static_cast<int>(NodeKind::Dtype) == static_cast<int>(PickleValue::Kind::Dtype),
              "NodeKind mirrors PickleValue::Kind for the shared kinds");

Result<PickleValue> unpickle(std::span<const std::byte> pickle, const StorageResolver& storages,
                             const UnpickleLimits& limits) {
  Vm vm(pickle, storages, limits);
  return vm.run();
}

}  // namespace crucible::ptload
