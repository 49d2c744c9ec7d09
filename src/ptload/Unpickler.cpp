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
#include <span>
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
// Node indices, stack slots and string offsets are 32-bit: one node per pickle byte at most.
constexpr std::uint64_t kMaxPickleBytes = 0xFFFFFFF0u;

// Note [Unpickler memory budget]
// A pickle is a program, and one byte of it can push an object (NONE, EMPTY_LIST), open a MARK,
// or push a memoized object again (BINGET, 2 bytes). A VM with a 256-byte node per object in
// vectors that double needs 4.3 GB of RSS for a 16 MiB data.pkl of NONE opcodes (refused only at
// STOP) and 9 GB to load a 16 MiB list of empty lists: max_pickle_bytes bounds the input, not
// what it builds. Two things bound that here.
//  - Size. A VM node is 16 bytes (Node): strings are views of data.pkl, and items, tensors and
//    storages live in side tables only the kinds that need them use (an empty list has no item
//    vector). None, True, False and () are one shared node each, as in Python, so NONE costs a
//    4-byte stack slot. The result's nodes are 16 bytes plus what their kind needs
//    (Note [PickleValue nodes]).
//  - A budget, UnpickleLimits::max_memory_bytes (LoadOptions::max_pickle_memory). Every heap
//    allocation that grows with the input is charged before it is made: a vector's new capacity
//    when it must grow (nodes, stack, marks, item lists, side tables), a memo or dict-key entry
//    with its share of the hash table, a storage's record and names; at STOP the conversion's
//    per-node tables, then each PickleValue node with its items, string bytes and tensor dims;
//    StateDict charges its tensor list and names to what is left. Past the budget the load is
//    refused, naming what was in use and the option that raises it. The charge is what those
//    structures hold on the heap under libstdc++ (a 16-byte malloc header per block, 16-byte
//    control blocks), so peak RSS follows it: a growing vector holds its old buffer beside the
//    new one while it copies, which can pass the budget by half the largest vector; a dict key's
//    text (at most 64 KiB) is built before it is charged. Not charged: data.pkl itself (bounded
//    by max_pickle_bytes) and record bytes inflated or byte-swapped for storages (bounded by
//    the inflation limits; stored records are mapped, not copied).
//  torch.save's pickles take 2-3 KB a tensor here, VM and result together (resnet18: 122
//  tensors, 14.5 KB of pickle, 302 KiB charged; the training checkpoint fixture 2.9 KB a
//  tensor), so the 256 MiB default holds about 100,000 tensors, while a crafted pickle is
//  refused at 256 MiB whatever it does.
constexpr std::size_t kMinCapacity = 4;        // first capacity of a growing vector
// An unordered_map<uint32_t, uint32_t> entry: next pointer and pair (16 bytes) in a 32-byte
// block, plus up to two 8-byte buckets (the table rehashes at load factor 1, doubling).
constexpr std::uint64_t kMemoEntryBytes = 48;
// An unordered_map<std::string, uint32_t> entry: next, string, value, cached hash (56 bytes) in
// a 64-byte block, plus buckets; a key text past std::string's 15 inline bytes is its own block.
constexpr std::uint64_t kDictKeyEntryBytes = 80;
// A new storage: the TensorStorage with its control block (128 bytes), its entry in storages_
// (string key, index) and storage_list_; plus its key and location text, charged as they are.
constexpr std::uint64_t kStorageBytes = 256;

// Shared immutable nodes made before the first opcode, at these indices.
constexpr std::uint32_t kNoneNode = 0, kFalseNode = 1, kTrueNode = 2, kEmptyTupleNode = 3;

// One object of the VM, 16 bytes (Note [Unpickler memory budget]): what a kind needs beyond
// kind, flag and dtype sits in `ref` and `i`.
struct Node {
  NodeKind kind = NodeKind::None;
  bool flag = false;               // Bool value; Dict: is an OrderedDict
  std::int8_t dtype = -1;          // Dtype; Global: storage class dtype
  Callable call = Callable::None;  // Global
  // String/BigInt: byte length; Tuple/List/Set/Dict: index in items_ (kNoNode while empty);
  // Tensor: index in tensors_; Storage: index in storage_list_; Global: index in kAllowed.
  std::uint32_t ref = kNoNode;
  // Int: value; Float: bits; String/BigInt: data.pkl offset of the bytes; Dict: BUILD state
  // node (kNoNode when none).
  std::int64_t i = 0;
};
static_assert(sizeof(Node) == 16, "one node per pickle byte is possible: keep it small");

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
      : in_(in),
        resolver_(resolver),
        limits_(limits),
        work_left_(kWorkPerPickleByte * in.size() + kMinWork) {}

  Result<PickleValue> run();
  UnpickleStats stats() const { return {used_, result_bytes_}; }

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
  Status over_budget() const {
    return exhausted(
        "pt pickle: unpickling memory would reach " + std::to_string(used_) +
            " bytes, over the limit of " + std::to_string(limits_.max_memory_bytes) + " bytes (" +
            std::to_string(nodes_.size()) + " objects, " + std::to_string(stack_.size()) +
            " on the stack, " + std::to_string(marks_.size()) + " open MARKs, " +
            std::to_string(memo_.size()) + " memo entries, " + std::to_string(dict_keys_.size()) +
            " dict keys" + (converting_ ? "; building the result" : "") + ")" + where(),
        "torch.save's pickles take 2-3 KB a tensor, so this one builds far more than tensors "
        "need (a memory bomb?); if you trust the file, raise " +
            std::string(limits_.max_memory_option));
  }

  // --- Note [Repeated work]: the text of a dict key is made again at each SETITEM of it; a
  // large key (a tuple of shared tuples: 59 KB of text from a few hundred bytes) set again and
  // again costs 4 bytes of pickle each time. Such work is counted against 16 units (bytes of
  // key text) per pickle byte: torch.save sets each key once, so real pickles use about 1. ---
  static constexpr std::uint64_t kWorkPerPickleByte = 16, kMinWork = 1u << 20;
  Status work(std::uint64_t units) {
    if (units <= work_left_) {
      work_left_ -= units;
      return ok_status();
    }
    return exhausted("pt pickle: dict keys set again and again ask for more than " +
                         std::to_string(kWorkPerPickleByte) +
                         " bytes of key text per pickle byte (a crafted pickle?)" + where(),
                     "re-save the file with torch.save(model.state_dict(), path)");
  }

  // --- the budget (Note [Unpickler memory budget]) ---
  Status charge(std::uint64_t bytes) {
    used_ += bytes;
    return used_ <= limits_.max_memory_bytes ? ok_status() : over_budget();
  }
  Status charge_result(std::uint64_t bytes) {
    result_bytes_ += bytes;
    return charge(bytes);
  }
  // Makes room for `extra` more elements, charging the new capacity before allocating it.
  template <class T>
  Status grow(std::vector<T>& v, std::size_t extra) {
    if (v.capacity() - v.size() >= extra) return ok_status();
    const std::size_t cap = std::max({v.size() + extra, 2 * v.capacity(), kMinCapacity});
    CRUCIBLE_RETURN_IF_ERROR(charge((cap - v.capacity()) * sizeof(T) +
                                    (v.capacity() == 0 ? kHeapBlockBytes : 0)));
    v.reserve(cap);
    return ok_status();
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

  // --- what a node holds ---
  std::string_view text(const Node& n) const {  // String, BigInt
    return {reinterpret_cast<const char*>(in_.data()) + n.i, n.ref};
  }
  static double real(const Node& n) { return std::bit_cast<double>(n.i); }
  // Tuple/List/Set items; a Dict's keys and values, interleaved; empty for other kinds.
  std::span<const std::uint32_t> items(const Node& n) const {
    const bool container = n.kind == NodeKind::Tuple || n.kind == NodeKind::List ||
                           n.kind == NodeKind::Set || n.kind == NodeKind::Dict;
    if (!container || n.ref == kNoNode) return {};
    return items_[n.ref];
  }
  static std::string global_name(const Node& n) {
    const Allowed& a = kAllowed[n.ref];
    return std::string(a.module) + "." + std::string(a.name);
  }
  // The item vector of container `id`, made on first use, with room for `extra` more.
  Result<std::vector<std::uint32_t>*> items_for(std::uint32_t id, std::size_t extra) {
    if (nodes_[id].ref == kNoNode) {
      CRUCIBLE_RETURN_IF_ERROR(grow(items_, 1));
      items_.emplace_back();
      nodes_[id].ref = static_cast<std::uint32_t>(items_.size() - 1);
    }
    std::vector<std::uint32_t>& v = items_[nodes_[id].ref];
    CRUCIBLE_RETURN_IF_ERROR(grow(v, extra));
    return &v;
  }

  // --- the arena and the stack ---
  Result<std::uint32_t> add(const Node& n) {
    CRUCIBLE_ASSERT(nodes_.size() < kNoNode, "one node per pickle byte at most");
    CRUCIBLE_RETURN_IF_ERROR(grow(nodes_, 1));
    nodes_.push_back(n);
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }
  Status push(std::uint32_t id) {
    CRUCIBLE_RETURN_IF_ERROR(grow(stack_, 1));
    stack_.push_back(id);
    return ok_status();
  }
  Status push_new(const Node& n) {
    auto id = add(n);
    if (!id.ok()) return id.status();
    return push(*id);
  }
  Status push_tuple(std::span<const std::uint32_t> items) {
    if (items.empty()) return push(kEmptyTupleNode);
    CRUCIBLE_RETURN_IF_ERROR(grow(items_, 1));
    CRUCIBLE_RETURN_IF_ERROR(charge(items.size_bytes() + kHeapBlockBytes));
    items_.emplace_back(items.begin(), items.end());
    Node t;
    t.kind = NodeKind::Tuple;
    t.ref = static_cast<std::uint32_t>(items_.size() - 1);
    return push_new(t);
  }
  Result<std::uint32_t> add_tensor(TensorView v) {
    CRUCIBLE_RETURN_IF_ERROR(grow(tensors_, 1));
    if (v.ndim() > 0)  // sizes and strides: two blocks
      CRUCIBLE_RETURN_IF_ERROR(charge(2 * (v.ndim() * sizeof(std::int64_t) + kHeapBlockBytes)));
    tensors_.push_back(std::move(v));
    Node t;
    t.kind = NodeKind::Tensor;
    t.ref = static_cast<std::uint32_t>(tensors_.size() - 1);
    return add(t);
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
  // The object below stack slot `at` (the top when `at` is the stack size), within the MARK.
  Result<std::uint32_t> below(std::size_t at) {
    if (at <= fence())
      return corrupt(marks_.empty() ? "stack underflow"
                                    : "stack underflow (would read past a MARK)");
    return stack_[at - 1];
  }
  Result<std::uint32_t> top() { return below(stack_.size()); }
  // Closes the innermost MARK: its items are stack_[mark, size), left there for the caller.
  Result<std::size_t> pop_mark() {
    if (marks_.empty()) return corrupt("no MARK to pop to");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  std::string describe(std::uint32_t id) const {
    const Node& n = nodes_[id];
    switch (n.kind) {
      case NodeKind::Global:
        return "global " + global_name(n);
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
  Result<std::uint32_t> call(const Node& fn, std::span<const std::uint32_t> args);
  Result<std::uint32_t> rebuild_tensor(std::span<const std::uint32_t> args);
  Result<std::int64_t> int_arg(std::uint32_t id, const char* what) const;
  Result<std::vector<std::int64_t>> ints_arg(std::uint32_t id, const char* what) const;
  bool empty_dict(std::uint32_t id) const {
    return nodes_[id].kind == NodeKind::Dict && items(nodes_[id]).empty();
  }
  Result<PickleValue> to_value(std::uint32_t id, std::size_t depth);

  std::span<const std::byte> in_;
  const StorageResolver& resolver_;
  const UnpickleLimits& limits_;
  std::uint64_t work_left_;  // Note [Repeated work]
  std::size_t pos_ = 0, op_pos_ = 0;
  std::uint8_t op_ = 0;
  bool stopped_ = false, converting_ = false;
  std::uint64_t used_ = 0, result_bytes_ = 0;
  std::vector<Node> nodes_;
  std::vector<std::uint32_t> stack_;
  std::vector<std::uint32_t> marks_;  // stack sizes at each open MARK
  std::unordered_map<std::uint32_t, std::uint32_t> memo_;
  std::vector<std::vector<std::uint32_t>> items_;
  // Every dict's keys: the dict's node index (4 bytes) + the key's canonical text -> pair index.
  std::unordered_map<std::string, std::uint32_t> dict_keys_;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, std::uint32_t> storages_;  // key -> index in storage_list_
  std::vector<std::shared_ptr<const TensorStorage>> storage_list_;
  // Conversion, per node: its value once converted; 0 unvisited, 1 on the path, 2 converted.
  std::vector<PickleValue> converted_;
  std::vector<std::uint8_t> state_;
  // Levels of nesting inside each converted node (0 for a leaf): a node met again through the
  // memo adds its whole height at the depth where it is met, so sharing cannot stack deep
  // values past max_depth.
  std::vector<std::uint32_t> height_;
};

Result<PickleValue> Vm::run() {
  if (in_.empty()) return corrupt("data.pkl is empty");
  if (in_.size() > kMaxPickleBytes)
    return unsupported("pt pickle: data.pkl is " + std::to_string(in_.size()) +
                           " bytes, more than the unpickler's 32-bit indices address (" +
                           std::to_string(kMaxPickleBytes) + ")",
                       "save the tensors in more than one file");
  CRUCIBLE_RETURN_IF_ERROR(grow(nodes_, 4));
  for (NodeKind k : {NodeKind::None, NodeKind::Bool, NodeKind::Bool, NodeKind::Tuple}) {
    Node n;
    n.kind = k;
    n.flag = nodes_.size() == kTrueNode;
    nodes_.push_back(n);
  }
  while (!stopped_) {
    if (pos_ >= in_.size()) return corrupt("pickle ends without STOP");
    CRUCIBLE_RETURN_IF_ERROR(step());
  }
  const std::uint32_t root = stack_.back();
  converting_ = true;
  const std::size_t n = nodes_.size();
  CRUCIBLE_RETURN_IF_ERROR(
      charge(n * (sizeof(PickleValue) + sizeof(std::uint8_t) + sizeof(std::uint32_t)) +
             3 * kHeapBlockBytes));
  converted_.resize(n);
  state_.assign(n, 0);
  height_.assign(n, 0);
  return to_value(root, 0);
}

Status Vm::step() {
  op_pos_ = pos_;
  op_ = std::to_integer<std::uint8_t>(in_[pos_++]);
  auto push_int = [&](std::int64_t v) {
    Node n;
    n.kind = NodeKind::Int;
    n.i = v;
    return push_new(n);
  };
  // A String or BigInt node viewing the next `len` bytes of data.pkl.
  auto push_text = [&](NodeKind kind, std::size_t len) -> Status {
    auto p = take(len);
    if (!p.ok()) return p.status();
    Node n;
    n.kind = kind;
    n.i = static_cast<std::int64_t>(*p - in_.data());
    n.ref = static_cast<std::uint32_t>(len);
    if (kind == NodeKind::String && !valid_utf8(text(n)))
      return corrupt("string is not valid UTF-8");
    return push_new(n);
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
      if (nodes_[*args].kind != NodeKind::Tuple || !items(nodes_[*args]).empty())
        return refuse("NEWOBJ collections.OrderedDict with arguments");
      Node d;
      d.kind = NodeKind::Dict;
      d.flag = true;
      d.i = kNoNode;
      return push_new(d);
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
      if (o.i != kNoNode) return refuse("a second BUILD on one OrderedDict");
      o.i = *state;
      return ok_status();
    }
    case '(':
      CRUCIBLE_RETURN_IF_ERROR(grow(marks_, 1));
      marks_.push_back(static_cast<std::uint32_t>(stack_.size()));
      return ok_status();
    case 't': {
      auto m = pop_mark();
      if (!m.ok()) return m.status();
      CRUCIBLE_RETURN_IF_ERROR(push_tuple(std::span(stack_).subspan(*m)));
      // push_tuple pushed the tuple on top of its items: move it down to where the MARK was.
      stack_[*m] = stack_.back();
      stack_.resize(*m + 1);
      return ok_status();
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      const std::size_t n = op_ - 0x84u;
      std::uint32_t items[3];
      for (std::size_t k = n; k-- > 0;) {
        auto v = pop();
        if (!v.ok()) return v.status();
        items[k] = *v;
      }
      return push_tuple(std::span(items, n));
    }
    case ')':
      return push(kEmptyTupleNode);
    case ']': {
      Node n;
      n.kind = NodeKind::List;
      return push_new(n);
    }
    case '}': {
      Node n;
      n.kind = NodeKind::Dict;
      n.i = kNoNode;
      return push_new(n);
    }
    case 0x8f: {
      Node n;
      n.kind = NodeKind::Set;
      return push_new(n);
    }
    case 'a': {  // APPEND
      auto v = pop();
      if (!v.ok()) return v.status();
      auto l = top();
      if (!l.ok()) return l.status();
      if (nodes_[*l].kind != NodeKind::List)
        return refuse("APPEND to " + describe(*l) + " (only a list)");
      auto dst = items_for(*l, 1);
      if (!dst.ok()) return dst.status();
      (*dst)->push_back(*v);
      return ok_status();
    }
    case 'e': {  // APPENDS
      auto m = pop_mark();
      if (!m.ok()) return m.status();
      auto l = below(*m);
      if (!l.ok()) return l.status();
      if (nodes_[*l].kind != NodeKind::List)
        return refuse("APPENDS to " + describe(*l) + " (only a list)");
      auto dst = items_for(*l, stack_.size() - *m);
      if (!dst.ok()) return dst.status();
      (*dst)->insert((*dst)->end(), stack_.begin() + static_cast<std::ptrdiff_t>(*m), stack_.end());
      stack_.resize(*m);
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
      auto m = pop_mark();
      if (!m.ok()) return m.status();
      if ((stack_.size() - *m) % 2 != 0) return corrupt("SETITEMS with an odd number of items");
      auto d = below(*m);
      if (!d.ok()) return d.status();
      for (std::size_t k = *m; k < stack_.size(); k += 2)
        CRUCIBLE_RETURN_IF_ERROR(set_item(*d, stack_[k], stack_[k + 1]));
      stack_.resize(*m);
      return ok_status();
    }
    case 'N':
      return push(kNoneNode);
    case 0x88:
      return push(kTrueNode);
    case 0x89:
      return push(kFalseNode);
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
      if (in_.size() - pos_ < *n) return take(*n).status();
      const auto* b = reinterpret_cast<const std::uint8_t*>(in_.data() + pos_);
      // It fits int64 when every byte past the 8th is the sign extension of byte 7.
      bool fits = true;
      const std::uint8_t ext =
          (*n > 0 && (b[std::min<std::size_t>(*n, 8) - 1] & 0x80)) ? 0xFF : 0x00;
      for (std::size_t k = 8; k < *n; ++k) fits &= b[k] == ext;
      if (!fits) return push_text(NodeKind::BigInt, *n);
      pos_ += *n;
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
      n.i = static_cast<std::int64_t>(__builtin_bswap64(*v));
      return push_new(n);
    }
    case 'X': {
      auto len = take_le<std::uint32_t>();
      if (!len.ok()) return len.status();
      return push_text(NodeKind::String, *len);
    }
    case 'U': {
      auto len = take_le<std::uint8_t>();
      if (!len.ok()) return len.status();
      return push_text(NodeKind::String, *len);
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
      return push(it->second);
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
      if (auto it = memo_.find(idx); it != memo_.end()) {
        it->second = *t;
        return ok_status();
      }
      CRUCIBLE_RETURN_IF_ERROR(charge(kMemoEntryBytes));
      memo_.emplace(idx, *t);
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
  for (std::size_t k = 0; k < std::size(kAllowed); ++k) {
    const Allowed& a = kAllowed[k];
    if (a.module == *module && a.name == *name) {
      Node n;
      n.kind = NodeKind::Global;
      n.call = a.call;
      n.dtype = a.storage_dtype;
      n.ref = static_cast<std::uint32_t>(k);
      return push_new(n);
    }
  }
  // torch.<dtype>: the exact canonical names of the dtype table ("float32", not "float").
  if (*module == "torch") {
    auto ord = scalar_type_from_name(*name);
    if (ord.ok() && scalar_type_info(*ord).name == *name) {
      Node d;
      d.kind = NodeKind::Dtype;
      d.dtype = *ord;
      return push_new(d);
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
  const Node f = nodes_[*fn];  // 16 bytes: a copy stays valid while call() adds nodes
  if (f.kind != NodeKind::Global || f.call == Callable::None)
    return refuse("REDUCE on " + describe(*fn) + " (not a callable on the allowlist)");
  if (nodes_[*args].kind != NodeKind::Tuple)
    return corrupt("REDUCE arguments are " + describe(*args) + ", not a tuple");
  // call() adds nodes and tensors but no item vectors: the span stays valid.
  auto r = call(f, items(nodes_[*args]));
  if (!r.ok()) return r.status();
  return push(*r);
}

Result<std::int64_t> Vm::int_arg(std::uint32_t id, const char* what) const {
  if (nodes_[id].kind != NodeKind::Int)
    return refuse(std::string(what) + " is " + describe(id) + ", not an int");
  return nodes_[id].i;
}

Result<std::vector<std::int64_t>> Vm::ints_arg(std::uint32_t id, const char* what) const {
  if (nodes_[id].kind != NodeKind::Tuple)
    return refuse(std::string(what) + " is " + describe(id) + ", not a tuple of ints");
  const auto it = items(nodes_[id]);
  // Sizes and strides: a tensor has at most TensorView::kMaxDims dims. Checked before the
  // copy, which each call of a memoized tuple would otherwise repeat (5 bytes of pickle a call).
  if (it.size() > TensorView::kMaxDims)
    return refuse(std::string(what) + " has " + std::to_string(it.size()) +
                  " items, more than the " + std::to_string(TensorView::kMaxDims) +
                  " dimensions a tensor may have here");
  std::vector<std::int64_t> out;
  out.reserve(it.size());
  for (std::uint32_t item : it) {
    auto v = int_arg(item, what);
    if (!v.ok()) return v.status();
    out.push_back(*v);
  }
  return out;
}

Result<std::uint32_t> Vm::call(const Node& fn, std::span<const std::uint32_t> a) {
  switch (fn.call) {
    case Callable::OrderedDict: {
      if (!a.empty())
        return refuse("collections.OrderedDict called with arguments (torch.save passes none)");
      Node d;
      d.kind = NodeKind::Dict;
      d.flag = true;
      d.i = kNoNode;
      return add(d);
    }
    case Callable::Size: {
      if (a.size() != 1) return refuse("torch.Size takes one tuple of ints");
      auto dims = ints_arg(a[0], "torch.Size argument");
      if (!dims.ok()) return dims.status();
      return a[0];  // a tuple is immutable: the argument is the result
    }
    case Callable::RebuildTensorV2:
      return rebuild_tensor(a);
    case Callable::RebuildParameter:
    case Callable::RebuildParameterWithState: {
      const std::string name = global_name(fn);
      const std::size_t want = fn.call == Callable::RebuildParameter ? 3 : 4;
      if (a.size() != want)
        return refuse(name + " takes " + std::to_string(want) + " arguments, got " +
                      std::to_string(a.size()));
      if (nodes_[a[0]].kind != NodeKind::Tensor)
        return refuse(name + " data is " + describe(a[0]) + ", not a tensor");
      if (nodes_[a[1]].kind != NodeKind::Bool)
        return refuse(name + " requires_grad is " + describe(a[1]) + ", not a bool");
      if (!empty_dict(a[2])) return refuse(name + " with backward hooks (hooks are code)");
      if (want == 4 && nodes_[a[3]].kind != NodeKind::None && !empty_dict(a[3]))
        return refuse(name + " with Python state on the parameter (not loaded without torch)");
      return add_tensor(tensors_[nodes_[a[0]].ref].as_parameter(nodes_[a[1]].flag));
    }
    case Callable::None:
      break;
  }
  CRUCIBLE_ASSERT(false, "op_reduce() refuses non-callables");
  return refuse("call of a non-callable");
}

Result<std::uint32_t> Vm::rebuild_tensor(std::span<const std::uint32_t> a) {
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
  auto view = TensorView::make(storage_list_[nodes_[a[0]].ref], *offset, std::move(*sizes),
                               std::move(*strides), nodes_[a[4]].flag);
  if (!view.ok()) return corrupt(message_of(view.status()));
  return add_tensor(std::move(*view));
}

Status Vm::op_persid() {
  auto pid = pop();
  if (!pid.ok()) return pid.status();
  const Node& t = nodes_[*pid];
  const auto it = items(t);
  const std::string want = "is not ('storage', torch.<T>Storage, key, location, numel)";
  if (t.kind != NodeKind::Tuple || it.size() != 5)
    return refuse(
        "persistent id " + describe(*pid) +
        (t.kind == NodeKind::Tuple ? " of " + std::to_string(it.size()) + " items " : " ") + want);
  if (nodes_[it[0]].kind != NodeKind::String || text(nodes_[it[0]]) != "storage")
    return refuse("persistent id tag is " + describe(it[0]) + ", not 'storage'");
  const Node cls = nodes_[it[1]];
  if (cls.kind != NodeKind::Global || cls.dtype < 0)
    return refuse("persistent id storage type is " + describe(it[1]) +
                  ", not a torch.<T>Storage class");
  if (nodes_[it[2]].kind != NodeKind::String)
    return refuse("persistent id key is " + describe(it[2]) + ", not a str");
  const std::string_view key = text(nodes_[it[2]]);
  if (key.empty() || key.size() > kMaxStorageKey ||
      key.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_") !=
          std::string::npos)
    return refuse("persistent id key '" + printable(key) +
                  "' is not a plain record name (letters, digits, _)");
  if (nodes_[it[3]].kind != NodeKind::String)
    return refuse("persistent id location is " + describe(it[3]) + ", not a str");
  const std::string_view location = text(nodes_[it[3]]);
  if (nodes_[it[4]].kind != NodeKind::Int || nodes_[it[4]].i < 0)
    return refuse("persistent id numel is " + describe(it[4]) + ", not a non-negative int");
  const auto numel = static_cast<std::uint64_t>(nodes_[it[4]].i);
  std::uint32_t index;
  if (auto found = storages_.find(std::string(key)); found != storages_.end()) {
    index = found->second;
    const TensorStorage& s = *storage_list_[index];
    if (s.dtype != cls.dtype || s.numel != numel)
      return refuse("storage '" + std::string(key) +
                    "' is referenced twice with different types or sizes");
  } else {
    // The resolver copies key and location into the TensorStorage; the map keeps the key too.
    CRUCIBLE_RETURN_IF_ERROR(charge(kStorageBytes + 2 * key.size() + location.size()));
    CRUCIBLE_RETURN_IF_ERROR(grow(storage_list_, 1));
    auto r = resolver_(StorageRequest{key, location, cls.dtype, numel});
    if (!r.ok()) return corrupt(message_of(r.status()));
    CRUCIBLE_ASSERT(*r && (*r)->numel == numel && (*r)->dtype == cls.dtype,
                    "resolver honours the request");
    index = static_cast<std::uint32_t>(storage_list_.size());
    storage_list_.push_back(std::move(*r));
    storages_.emplace(std::string(key), index);
  }
  Node n;
  n.kind = NodeKind::Storage;
  n.ref = index;
  return push_new(n);
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
      const double f = real(n);
      if (f > -9.2e18 && f < 9.2e18 && f == static_cast<double>(static_cast<std::int64_t>(f))) {
        out += 'i' + std::to_string(static_cast<std::int64_t>(f)) + ';';
      } else {
        out += 'f' + std::to_string(std::bit_cast<std::uint64_t>(f)) + ';';
      }
      return ok_status();
    }
    case NodeKind::BigInt:
    case NodeKind::String:
      out += n.kind == NodeKind::String ? 's' : 'b';
      out += std::to_string(n.ref) + ':';
      out += text(n);
      return ok_status();
    case NodeKind::Dtype:
      out += 'd' + std::to_string(n.dtype) + ';';
      return ok_status();
    case NodeKind::Tuple:
      out += "t(";
      for (std::uint32_t item : items(n)) CRUCIBLE_RETURN_IF_ERROR(key_text(item, out, depth + 1));
      out += ')';
      return ok_status();
    default:
      return refuse("dict key of type " + describe(id) + " (unhashable or not supported)");
  }
}

Status Vm::set_item(std::uint32_t dict, std::uint32_t key, std::uint32_t value) {
  if (nodes_[dict].kind != NodeKind::Dict)
    return refuse("SETITEM(S) on " + describe(dict) + " (only a dict)");
  std::string k(reinterpret_cast<const char*>(&dict), sizeof dict);
  CRUCIBLE_RETURN_IF_ERROR(key_text(key, k, 0));
  CRUCIBLE_RETURN_IF_ERROR(work(k.size()));  // Note [Repeated work]
  if (auto it = dict_keys_.find(k); it != dict_keys_.end()) {
    // Python keeps the first key object and takes the new value.
    items_[nodes_[dict].ref][2 * std::size_t{it->second} + 1] = value;
    return ok_status();
  }
  CRUCIBLE_RETURN_IF_ERROR(
      charge(kDictKeyEntryBytes + (k.size() > 15 ? k.size() + 1 + kHeapBlockBytes : 0)));
  auto dst = items_for(dict, 2);
  if (!dst.ok()) return dst.status();
  dict_keys_.emplace(std::move(k), static_cast<std::uint32_t>((*dst)->size() / 2));
  (*dst)->push_back(key);
  (*dst)->push_back(value);
  return ok_status();
}

Result<PickleValue> Vm::to_value(std::uint32_t id, std::size_t depth) {
  // A node met again through the memo reaches as deep as its height below `depth`.
  if (depth + (state_[id] == 2 ? height_[id] : 0) > limits_.max_depth)
    return exhausted(
        "pt pickle: containers nest deeper than " + std::to_string(limits_.max_depth) + where(),
        "flatten the saved object; real checkpoints nest a few levels");
  if (state_[id] == 2) return converted_[id];
  if (state_[id] == 1) return refuse("an object that contains itself (a reference cycle)");
  state_[id] = 1;
  const Node n = nodes_[id];  // a copy: 16 bytes
  const auto kind = static_cast<PickleValue::Kind>(n.kind);
  if (n.kind != NodeKind::Global && n.kind != NodeKind::Storage)
    CRUCIBLE_RETURN_IF_ERROR(charge_result(
        PickleValue::node_bytes(kind) + (PickleValue::node_bytes(kind) ? kHeapBlockBytes : 0)));
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
    case NodeKind::String:
      if (n.ref > 15) CRUCIBLE_RETURN_IF_ERROR(charge_result(n.ref + 1 + kHeapBlockBytes));
      v = n.kind == NodeKind::String ? PickleValue::string(std::string(text(n)))
                                     : PickleValue::big_integer(std::string(text(n)));
      break;
    case NodeKind::Float:
      v = PickleValue::floating(real(n));
      break;
    case NodeKind::Dtype:
      v = PickleValue::dtype(n.dtype);
      break;
    case NodeKind::Tensor: {
      const TensorView& t = tensors_[n.ref];
      if (t.ndim() > 0)
        CRUCIBLE_RETURN_IF_ERROR(
            charge_result(2 * (t.ndim() * sizeof(std::int64_t) + kHeapBlockBytes)));
      v = PickleValue::tensor(t);
      break;
    }
    case NodeKind::Tuple:
    case NodeKind::List:
    case NodeKind::Set: {
      const auto it = items(n);  // items_ does not grow here: the span stays valid
      if (!it.empty())
        CRUCIBLE_RETURN_IF_ERROR(
            charge_result(it.size() * sizeof(PickleValue) + kHeapBlockBytes));
      std::vector<PickleValue> out;
      out.reserve(it.size());
      for (std::uint32_t item : it) {
        auto c = to_value(item, depth + 1);
        if (!c.ok()) return c.status();
        height = std::max(height, height_[item] + 1);
        out.push_back(std::move(*c));
      }
      v = PickleValue::sequence(kind, std::move(out));
      break;
    }
    case NodeKind::Dict: {
      const auto it = items(n);
      if (!it.empty())
        CRUCIBLE_RETURN_IF_ERROR(
            charge_result(it.size() / 2 * sizeof(PickleValue::Entry) + kHeapBlockBytes));
      std::vector<PickleValue::Entry> entries;
      entries.reserve(it.size() / 2);
      for (std::size_t k = 0; k < it.size(); k += 2) {
        auto key = to_value(it[k], depth + 1);
        if (!key.ok()) return key.status();
        auto val = to_value(it[k + 1], depth + 1);
        if (!val.ok()) return val.status();
        height = std::max({height, height_[it[k]] + 1, height_[it[k + 1]] + 1});
        entries.emplace_back(std::move(*key), std::move(*val));
      }
      PickleValue attrs;
      if (n.i != kNoNode) {
        const auto a_id = static_cast<std::uint32_t>(n.i);
        auto a = to_value(a_id, depth + 1);
        if (!a.ok()) return a.status();
        height = std::max(height, height_[a_id] + 1);
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
  state_[id] = 2;
  converted_[id] = v;
  height_[id] = height;
  return v;
}

}  // namespace

static_assert(static_cast<int>(NodeKind::Dtype) == static_cast<int>(PickleValue::Kind::Dtype),
              "NodeKind mirrors PickleValue::Kind for the shared kinds");

Result<PickleValue> unpickle(std::span<const std::byte> pickle, const StorageResolver& storages,
                             const UnpickleLimits& limits, UnpickleStats* stats) {
  Vm vm(pickle, storages, limits);
  auto r = vm.run();
  if (stats != nullptr) *stats = vm.stats();
  return r;
}

}  // namespace crucible::ptload
