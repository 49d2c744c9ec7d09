// unpickler_test.cpp — the restricted pickle VM on hand-assembled protocol-2 bytes.
#include "crucible/ptload/Unpickler.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "peak_rss.h"
#include "zip_writer.h"

namespace {
using namespace crucible::ptload;
using crucible::Result;
using test::global;
using test::peak_rss;
using test::uni;
using K = PickleValue::Kind;

// Float32 storages of numel elements 0, 1, 2, ... (the VM checks views against numel).
Result<std::shared_ptr<const TensorStorage>> resolve(const StorageRequest& r) {
  auto data = std::make_shared<std::vector<float>>(r.numel);
  for (std::size_t i = 0; i < data->size(); ++i) (*data)[i] = static_cast<float>(i);
  auto s = std::make_shared<TensorStorage>();
  s->key = std::string(r.key);
  s->dtype = r.dtype;
  s->numel = r.numel;
  s->bytes = std::as_bytes(std::span<const float>(*data));
  s->owner = data;
  return std::shared_ptr<const TensorStorage>(s);
}

Result<PickleValue> run(const std::string& body, const UnpickleLimits& limits = {}) {
  const std::string p = "\x80\x02" + body + ".";
  return unpickle(std::as_bytes(std::span<const char>(p.data(), p.size())), resolve, limits);
}

std::string error_of(const std::string& body) {
  auto r = run(body);
  EXPECT_FALSE(r.ok()) << "accepted: " << r->repr();
  return r.ok() ? "" : std::string(r.status().message());
}

TEST(Unpickler, Scalars) {
  EXPECT_TRUE(run("N")->is(K::None));
  EXPECT_EQ(run("K\xff")->as_int(), 255);
  EXPECT_EQ(run(std::string("M\x01\x02", 3))->as_int(), 0x0201);
  EXPECT_EQ(run("J\xfe\xff\xff\xff")->as_int(), -2);
  EXPECT_TRUE(run("\x88")->as_bool());
  EXPECT_FALSE(run("\x89")->as_bool());
  EXPECT_EQ(run(std::string("G\x40\x04\x00\x00\x00\x00\x00\x00", 9))->as_float(), 2.5);
  EXPECT_EQ(run(uni("h\xc3\xa9"))->as_string(), "h\xc3\xa9");
  EXPECT_EQ(run("U\x02hi")->as_string(), "hi");
}

TEST(Unpickler, Long1FitsInt64OrStaysBig) {
  EXPECT_EQ(run(std::string("\x8a\x00", 2))->as_int(), 0);
  EXPECT_EQ(run("\x8a\x01\xff")->as_int(), -1);
  EXPECT_EQ(run(std::string("\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80", 10))->as_int(), INT64_MIN);
  // Nine bytes whose ninth is only sign extension still fit.
  EXPECT_EQ(run("\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff")->as_int(), -1);
  auto big = run(std::string("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01", 11));  // 2^64
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_TRUE(big->is(K::BigInt));
  EXPECT_EQ(big->as_string().size(), 9u);
}

TEST(Unpickler, MemoSharesAndSeesLaterMutation) {
  // MARK, L, L (BINGET), APPEND 5 to the top L, TUPLE -> (L, L) with L == [5].
  auto r =
      run(std::string("(]q\x00h\x00K\x05"
                      "at",
                      10));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->items().size(), 2u);
  EXPECT_EQ(r->items()[0].items().size(), 1u);
  EXPECT_EQ(r->items()[0].items().data(), r->items()[1].items().data()) << "one node, shared";
}

TEST(Unpickler, DictKeysFollowPythonEquality) {
  // {1: 2, True: 3, 1.0: 4} is {1: 4} in Python.
  auto r = run(std::string("}(K\x01K\x02\x88K\x03G\x3f\xf0\x00\x00\x00\x00\x00\x00K\x04u", 21));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->entries().size(), 1u);
  EXPECT_EQ(r->entries()[0].first.as_int(), 1);
  EXPECT_EQ(r->entries()[0].second.as_int(), 4);
  EXPECT_NE(error_of("}]K\x01s").find("unhashable"), std::string::npos);
  // Huge and NaN float keys stay floats (found by fuzz_pt_pickle: no int cast out of range).
  auto f = run(
      std::string("}(G\x7f\xef\xff\xff\xff\xff\xff\xffNG\x7f\xf8\x00\x00\x00\x00\x00\x00Nu", 23));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->entries().size(), 2u);
}

TEST(Unpickler, OrderedDictWithMetadataAttributes) {
  const std::string p = global("collections", "OrderedDict") + ")R" + uni("w") +
                        test::tensor_f32("0", 6, 2, 3) + "s}" + uni("_metadata") + "K\x07sb";
  auto r = run(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->is_ordered_dict());
  const PickleValue* w = r->get("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->as_tensor().storage_offset(), 2);
  EXPECT_EQ(w->as_tensor().materialize_f32(), (std::vector<float>{2, 3, 4}));
  ASSERT_NE(r->attributes().get("_metadata"), nullptr);
  EXPECT_EQ(r->attributes().get("_metadata")->as_int(), 7);
}

TEST(Unpickler, TorchSizeAndDtypeGlobals) {
  auto r =
      run(global("torch", "Size") + "(K\x02K\x03t\x85R" + global("torch", "bfloat16") + "\x86");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->items()[0].repr(), "(2, 3)");
  EXPECT_EQ(r->items()[1].as_dtype(), 15);
  // Aliases are not the canonical names torch pickles: refused like any other unknown global.
  EXPECT_NE(error_of(global("torch", "float")).find("torch.float is not on the allowlist"),
            std::string::npos);
}

TEST(Unpickler, ErrorsNameOpcodeAndOffset) {
  const std::string e = error_of("N\x93");
  EXPECT_NE(e.find("STACK_GLOBAL"), std::string::npos) << e;
  EXPECT_NE(e.find("offset 3"), std::string::npos) << e;
  EXPECT_NE(error_of("\xfe").find("unknown opcode byte 254"), std::string::npos);
  EXPECT_NE(error_of(global("os", "system")).find("os.system is not on the allowlist"),
            std::string::npos);
  EXPECT_NE(error_of(global("builtins\x01", "eval")).find("builtins\\x01.eval"), std::string::npos)
      << "attacker text is escaped in messages";
}

TEST(Unpickler, StructuralErrors) {
  EXPECT_NE(error_of("h\x03").find("memo index 3 was never stored"), std::string::npos);
  EXPECT_NE(error_of("R").find("stack underflow"), std::string::npos);
  EXPECT_NE(error_of("K\x01(\x85").find("past a MARK"), std::string::npos);
  EXPECT_NE(error_of("NN").find("2 objects on the stack"), std::string::npos);
  EXPECT_NE(error_of("\x80\x02N").find("PROTO after the first byte"), std::string::npos);
  EXPECT_NE(error_of("U\x02\xff\xfe").find("not valid UTF-8"), std::string::npos);
  EXPECT_NE(error_of("}(K\x01K\x02K\x03u").find("SETITEMS with an odd number"), std::string::npos);
  EXPECT_NE(
      error_of(std::string("X\x10\x00\x00\x00", 5)).find("needs 16 bytes but only 1 are left"),
      std::string::npos);
  EXPECT_NE(error_of(std::string("]q\x00h\x00"
                                 "a",
                                 6))
                .find("contains itself"),
            std::string::npos);
  const std::string trailing = "\x80\x02N.junk";
  auto t =
      unpickle(std::as_bytes(std::span<const char>(trailing.data(), trailing.size())), resolve);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("4 bytes after STOP"), std::string::npos);
  const std::string p4 = "\x80\x04N.";
  auto r4 = unpickle(std::as_bytes(std::span<const char>(p4.data(), p4.size())), resolve);
  ASSERT_FALSE(r4.ok());
  EXPECT_NE(r4.status().message().find("pickle protocol 4"), std::string::npos);
}

TEST(Unpickler, NestingDeeperThanTheLimitIsReportedNotCrashed) {
  const std::string deep = std::string(300, ']') + std::string(299, 'a');
  auto r = run(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("deeper than 256"), std::string::npos);
  UnpickleLimits roomy;
  roomy.max_depth = 400;
  EXPECT_TRUE(run(deep, roomy).ok());
}

TEST(Unpickler, SharingCannotStackNestingPastTheLimit) {
  // [X, Y]: X is 200 nested lists (memoized); Y is 200 nested lists with X inside the innermost.
  // X alone is under the limit, Y holding X is 400 deep (a fuzzer find: the memo handed X back
  // without counting its height).
  const std::string x = std::string(200, ']') + std::string(199, 'a') + std::string("q\x01", 2);
  const std::string y = std::string(200, ']') + std::string("h\x01", 2) + std::string(200, 'a');
  const std::string both = "]" + x + "a" + y + "a";
  auto r = run(both);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status().message();
  EXPECT_NE(r.status().message().find("deeper than 256"), std::string::npos);
  UnpickleLimits roomy;
  roomy.max_depth = 450;
  EXPECT_TRUE(run(both, roomy).ok());
}

TEST(Unpickler, SharedDagConvertsInLinearTime) {
  // 60 levels, each a tuple of the previous twice: 2^60 paths, 61 nodes.
  std::string p(
      "]Nq\x00"
      "a",
      5);
  for (int i = 0; i < 60; ++i)
    p += std::string(
        "h\x00h\x00\x86q\x00"
        "a",
        8);
  auto r = run(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->items().size(), 61u);
  // Its text would be 2^60 items: repr() stops at kMaxReprBytes.
  const std::string text = r->repr();
  EXPECT_GE(text.size(), PickleValue::kMaxReprBytes);
  EXPECT_LT(text.size(), PickleValue::kMaxReprBytes + 64);
  EXPECT_TRUE(text.ends_with("...")) << text.substr(text.size() - 16);
  EXPECT_EQ(r->items()[2].repr(), "((None, None), (None, None))");
}

TEST(Unpickler, RepeatedWorkIsBoundedByThePickleSize) {
  // Note [Repeated work]: one 60 KB key set 20000 times (4 bytes each) would make 1.2 GB of key
  // text; it is refused once the text passes 16 bytes per pickle byte.
  auto keyed = [](int n) {  // {key: None} with the key memoized, then n more SETITEMs of it
    std::string p = "}" + uni(std::string(60000, 'k')) + std::string("q\x00Ns", 4);
    for (int i = 0; i < n; ++i) p += std::string("h\x00Ns", 4);
    return p;
  };
  EXPECT_NE(error_of(keyed(20000)).find("dict keys set again and again"), std::string::npos);
  auto r = run(keyed(5));  // set a few times, it loads: Python keeps one entry
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entries().size(), 1u);
  // torch.Size of a 65-int tuple: refused before its items are copied (each call of a memoized
  // tuple would copy them again).
  std::string size = global("torch", "Size") + "(";
  for (int i = 0; i < 65; ++i) size += "K\x01";
  EXPECT_NE(error_of(size + "t\x85R").find("more than the 64 dimensions"), std::string::npos);
}

TEST(Unpickler, ParameterKeepsRequiresGrad) {
  const std::string p = global("torch._utils", "_rebuild_parameter") + "(" +
                        test::tensor_f32("0", 4, 0, 4) + "\x88" +
                        global("collections", "OrderedDict") + ")RtR";
  auto r = run(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->as_tensor().is_parameter());
  EXPECT_TRUE(r->as_tensor().requires_grad());
}

// `op` n times.
std::string times(std::string_view op, std::size_t n) {
  std::string out;
  out.reserve(op.size() * n);
  for (std::size_t i = 0; i < n; ++i) out += op;
  return out;
}

std::string le32(std::uint32_t v) {
  std::string o;
  test::put32(o, v);
  return o;
}

// Millions of one-byte objects, MARKs, memo entries and dict keys: each pickle is refused by the
// memory budget as it grows (256-byte nodes would take 4.3 GB for 16 Mi NONEs), and RSS grows by
// about the budget, not by what the pickle asks for. One test per pickle, so that ctest measures
// each in its own process.
struct Bomb {
  const char* name;
  const char* found;  // what fills the budget, as the message counts it
};
constexpr std::size_t kBombOpcodes = 4u << 20;

std::string bomb_body(std::string_view name) {
  constexpr std::size_t n = kBombOpcodes;
  if (name == "NONE") return "](" + std::string(n, 'N') + "e";
  if (name == "EMPTY_LIST") return "](" + std::string(n, ']') + "e";
  if (name == "MARK") return std::string(n, '(') + "N";
  if (name == "BINGET") return std::string("]q\x00", 3) + times(std::string("h\x00", 2), n / 2);
  std::string out = name == "LONG_BINPUT" ? "N" : "}";
  for (std::uint32_t i = 0; i < n / 6; ++i)
    out += name == "LONG_BINPUT" ? "r" + le32(i) : "J" + le32(i) + "Ns";  // memo i / d[i] = None
  return out;
}

class UnpicklerMemoryBomb : public ::testing::TestWithParam<Bomb> {};

TEST_P(UnpicklerMemoryBomb, IsRefusedAtTheBudget) {
  const Bomb& b = GetParam();
  const std::string p = "\x80\x02" + bomb_body(b.name) + ".";
  UnpickleLimits tight;
  tight.max_memory_bytes = 8u << 20;
  UnpickleStats stats;
  const std::uint64_t before = peak_rss();
  auto r = unpickle(std::as_bytes(std::span<const char>(p.data(), p.size())), resolve, tight,
                    &stats);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("pt pickle: unpickling memory would reach "), std::string::npos) << msg;
  EXPECT_NE(msg.find(" bytes, over the limit of 8388608 bytes ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("at data.pkl offset "), std::string::npos) << msg;
  EXPECT_NE(msg.find("if you trust the file, raise UnpickleLimits::max_memory_bytes"),
            std::string::npos)
      << msg;
  // The message counts what filled the budget: "<count><found>".
  const std::size_t at = msg.find(b.found);
  ASSERT_NE(at, std::string::npos) << msg;
  const std::size_t digits = msg.find_last_not_of("0123456789", at - 1) + 1;
  EXPECT_GT(std::stoull(msg.substr(digits, at - digits)), 50000u) << msg;
  EXPECT_GT(stats.memory_bytes, tight.max_memory_bytes) << "the charge that was refused";
  EXPECT_LT(stats.memory_bytes, tight.max_memory_bytes + (tight.max_memory_bytes >> 1))
      << "refused at the first growth past the limit";
  // The 8 MiB budget, a growing vector's old buffer beside its new one, and ASan's redzones and
  // quarantine; 256-byte nodes in doubling vectors would take over 1 GiB for 4 Mi NONEs.
  EXPECT_LT(peak_rss() - before, std::uint64_t{32} << 20);
}

INSTANTIATE_TEST_SUITE_P(Opcodes, UnpicklerMemoryBomb,
                         ::testing::Values(Bomb{"NONE", " on the stack"},
                                           Bomb{"EMPTY_LIST", " objects, "},
                                           Bomb{"MARK", " open MARKs"},
                                           Bomb{"BINGET", " on the stack"},
                                           Bomb{"LONG_BINPUT", " memo entries"},
                                           Bomb{"SETITEM", " dict keys"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(UnpicklerMemory, TheBudgetIsCheckedAsItGrows) {
  const std::string p = "\x80\x02" + global("torch._utils", "_rebuild_parameter") + "(" +
                        test::tensor_f32("0", 4, 0, 4) + "\x88" +
                        global("collections", "OrderedDict") + ")RtR.";
  const auto bytes = std::as_bytes(std::span<const char>(p.data(), p.size()));
  UnpickleStats stats;
  ASSERT_TRUE(unpickle(bytes, resolve, {}, &stats).ok());
  EXPECT_GT(stats.result_bytes, 0u);
  EXPECT_LT(stats.result_bytes, stats.memory_bytes);
  EXPECT_LT(stats.memory_bytes, 8u << 10) << "one tensor takes a few KB";
  UnpickleLimits exact;
  exact.max_memory_bytes = stats.memory_bytes;
  EXPECT_TRUE(unpickle(bytes, resolve, exact).ok()) << "what a run charged is enough";
  exact.max_memory_bytes = stats.memory_bytes - 1;
  auto r = unpickle(bytes, resolve, exact);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("building the result"), std::string::npos)
      << "the last charge is the result's: " << r.status();
}

// Nesting is built by the VM's loop (no recursion) and refused when the result is built, whose
// recursion stops at max_depth: a million levels overflow nothing. One test per shape.
class UnpicklerDeepNesting : public ::testing::TestWithParam<const char*> {};

TEST_P(UnpicklerDeepNesting, IsRefusedWithoutOverflowingTheStack) {
  constexpr std::size_t kN = 1'000'000;
  const std::string_view shape = GetParam();
  std::string body;
  if (shape == "EMPTY_LIST_APPEND") body = std::string(kN, ']') + std::string(kN - 1, 'a');
  if (shape == "MARK_TUPLE") body = std::string(kN, '(') + std::string(kN, 't');
  if (shape == "MARK_APPENDS") body = "]" + times("(]", kN) + std::string(kN, 'e');
  if (shape == "DICT_KEY") body = "}" + std::string(kN, '(') + std::string(kN, 't') + "Ns";
  auto r = run(body);
  ASSERT_FALSE(r.ok());
  if (shape == "DICT_KEY") {  // a key is hashed (its canonical text) recursively too, capped
    EXPECT_NE(r.status().message().find("dict key nests deeper than 256"), std::string::npos)
        << r.status();
    return;
  }
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("containers nest deeper than 256"), std::string::npos)
      << r.status();
}

INSTANTIATE_TEST_SUITE_P(Shapes, UnpicklerDeepNesting,
                         ::testing::Values("EMPTY_LIST_APPEND", "MARK_TUPLE", "MARK_APPENDS",
                                           "DICT_KEY"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
