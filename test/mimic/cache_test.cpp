// cache_test — the CPU backend's kernel cache: a second Runner in the process compiles nothing
// (memory); a fresh process loads the object from disk and compiles nothing; an entry with a
// flipped byte, a truncated entry and an entry claiming CPU features this host lacks are each
// removed and rebuilt, never run; processes started together leave one good entry; the key
// names everything that changes the machine code.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cache_chain.h"
#include "crucible/mimic/CpuCodegen.h"
#include "crucible/mimic/CpuJit.h"
#include "crucible/mimic/CpuTarget.h"
#include "crucible/mimic/ObjectCache.h"

namespace crucible::mimic {
namespace {

namespace fs = std::filesystem;

struct Child {
  int exit_code = -1;
  std::string out;
  bool has(const std::string& s) const { return out.find(s) != std::string::npos; }
};

// mimic_cache_child on `dir`, its exit code and its output.
Child run_child(const std::string& dir) {
  Child c;
  const std::string cmd = std::string(CRUCIBLE_MIMIC_CACHE_CHILD) + " '" + dir + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return c;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) c.out += buf;
  const int st = ::pclose(p);
  c.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return c;
}

std::string fresh_dir(const std::string& name) {
  const std::string d =
      ::testing::TempDir() + "crucible_mimic_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}

std::vector<fs::path> entries(const std::string& dir) {
  std::vector<fs::path> r;
  for (const auto& e : fs::directory_iterator(dir + "/mimic-cpu"))
    if (e.path().extension() == ".cko") r.push_back(e.path());
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

TEST(KernelCache, SecondRunnerAndFreshProcessCompileNothing) {
  const std::string dir = fresh_dir("reuse");
  bool correct = false;
  auto first = test::run_cache_chain(dir, &correct);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(correct);
  EXPECT_EQ(first->compiled, 1u);
  EXPECT_EQ(first->disk_hits, 0u);
  ASSERT_EQ(entries(dir).size(), 1u);

  auto second = test::run_cache_chain(dir, &correct);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(correct);
  EXPECT_EQ(second->compiled, 0u);
  EXPECT_EQ(second->disk_hits, 0u);
  EXPECT_EQ(second->memory_hits, 1u);

  const Child c = run_child(dir);
  EXPECT_EQ(c.exit_code, 0) << c.out;
  EXPECT_TRUE(c.has("compiled=0 disk_hits=1 memory_hits=0 rejected=0 correct=1")) << c.out;
  std::printf("in process: cold compile %.3f ms; fresh process: %s", first->compile_seconds * 1e3,
              c.out.c_str());
  fs::remove_all(dir);
}

TEST(KernelCache, CorruptTruncatedAndForeignEntriesAreRebuilt) {
  const std::string dir = fresh_dir("corrupt");
  Child c = run_child(dir);
  ASSERT_EQ(c.exit_code, 0) << c.out;
  ASSERT_TRUE(c.has("compiled=1 disk_hits=0")) << c.out;
  const fs::path entry = entries(dir).at(0);
  const std::string good = slurp(entry);

  std::string flipped = good;
  flipped[flipped.size() - 100] ^= 0x10;  // inside the object file
  spit(entry, flipped);
  c = run_child(dir);
  EXPECT_EQ(c.exit_code, 0) << c.out;
  EXPECT_TRUE(c.has("compiled=1 disk_hits=0 memory_hits=0 rejected=1 correct=1")) << c.out;
  EXPECT_TRUE(c.has("checksum")) << c.out;
  EXPECT_EQ(slurp(entry), good) << "the rebuilt entry is the same object";

  spit(entry, good.substr(0, good.size() / 2));
  c = run_child(dir);
  EXPECT_EQ(c.exit_code, 0) << c.out;
  EXPECT_TRUE(c.has("compiled=1 disk_hits=0 memory_hits=0 rejected=1 correct=1")) << c.out;

  // The same entry, its key claiming one more CPU feature: the object is intact, but it may
  // use instructions this CPU lacks.
  const std::size_t key_at = 8 + 8 + 8;
  std::uint64_t key_len = 0;
  for (int i = 0; i < 8; ++i)
    key_len |= std::uint64_t{static_cast<unsigned char>(good[16 + i])} << (8 * i);
  const std::string key = good.substr(key_at, key_len) + ",+crucible-no-such-feature";
  std::string foreign = good.substr(0, 16);
  for (int i = 0; i < 8; ++i) foreign.push_back(static_cast<char>(key.size() >> (8 * i)));
  foreign += key + good.substr(key_at + key_len);
  spit(entry, foreign);
  c = run_child(dir);
  EXPECT_EQ(c.exit_code, 0) << c.out;
  EXPECT_TRUE(c.has("compiled=1 disk_hits=0 memory_hits=0 rejected=1 correct=1")) << c.out;
  EXPECT_TRUE(c.has("features this CPU lacks")) << c.out;

  c = run_child(dir);
  EXPECT_TRUE(c.has("compiled=0 disk_hits=1 memory_hits=0 rejected=0 correct=1")) << c.out;
  fs::remove_all(dir);
}

// A whole entry (its checksum right) holding another kernel's object: it links, but has none
// of the entry points of the kernel it is filed under. Rejected and rebuilt; and the foreign
// object's symbols are removed from the JIT again, so the kernel they belong to can still be
// added (they stayed defined before: "Duplicate definition").
TEST(KernelCache, AnEntryHoldingAnotherKernelsObjectIsRebuiltAndLeavesNothingInTheJit) {
  const std::string dir = fresh_dir("foreign_object");
  auto disk = ObjectCache::open(dir);
  ASSERT_TRUE(disk.ok()) << disk.status();
  PointwiseProgram x, y;  // programs no other test here compiles: float64 row and column means
  x.reduce = ReduceKind::SumInner;
  y.reduce = ReduceKind::SumOuter;
  for (PointwiseProgram* p : {&x, &y}) {
    p->mean = true;
    p->operands = {PwOperand{test::kF64, false, true, false}, PwOperand{test::kF64, false, false, true}};
  }
  const std::string recipe = "BITEXACT_STRICT";
  const CpuTarget& host = host_target();
  const CpuKernelKey kx = cpu_kernel_key(x.hash(), recipe, host, kCpuOptLevel);
  const CpuKernelKey ky = cpu_kernel_key(y.hash(), recipe, host, kCpuOptLevel);
  auto y_object = compile_pointwise(y, "crucible_pw_" + ky.hash.hex(), host);
  ASSERT_TRUE(y_object.ok()) << y_object.status();
  ASSERT_TRUE(disk->store(kx, *y_object).ok());

  CacheStats sx;
  auto fx = get_pointwise(x, recipe, &*disk, &sx);
  ASSERT_TRUE(fx.ok()) << fx.status();
  EXPECT_NE((*fx)->contig, nullptr);
  EXPECT_EQ(sx.disk_rejected, 1u);
  EXPECT_EQ(sx.compiled, 1u);
  EXPECT_EQ(sx.disk_hits, 0u);
  EXPECT_NE(sx.last_disk_problem.find("did not link"), std::string::npos) << sx.last_disk_problem;
  ObjectCache::Loaded again = disk->load(kx, host);
  ASSERT_EQ(again.outcome, ObjectCache::Outcome::Hit);
  EXPECT_NE(again.object, *y_object) << "the entry holds x's own object now";

  CacheStats sy;
  auto fy = get_pointwise(y, recipe, nullptr, &sy);  // y's symbols, linked once under x's name
  ASSERT_TRUE(fy.ok()) << fy.status();
  EXPECT_NE((*fy)->contig, nullptr);
  EXPECT_NE((*fy)->contig, (*fx)->contig);
  EXPECT_EQ(sy.compiled, 1u);
  fs::remove_all(dir);
}

TEST(KernelCache, ProcessesStartedTogetherShareOneDirectory) {
  const std::string dir = fresh_dir("together");
  constexpr int kProcesses = 4;
  FILE* pipes[kProcesses];
  const std::string cmd = std::string(CRUCIBLE_MIMIC_CACHE_CHILD) + " '" + dir + "' 2>&1";
  for (FILE*& p : pipes) {  // all started before any is read: they race for the entry
    p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
  }
  int compiled = 0;
  for (FILE* p : pipes) {
    Child c;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p) != nullptr) c.out += buf;
    const int st = ::pclose(p);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << c.out;
    EXPECT_TRUE(c.has("rejected=0 correct=1")) << c.out;
    compiled += c.has("compiled=1") ? 1 : 0;
  }
  EXPECT_GE(compiled, 1);
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir + "/mimic-cpu")) ++files;
  EXPECT_EQ(files, 1u) << "one entry, no temporary file left";
  const Child last = run_child(dir);
  EXPECT_TRUE(last.has("compiled=0 disk_hits=1 memory_hits=0 rejected=0 correct=1")) << last.out;
  fs::remove_all(dir);
}

TEST(KernelCache, ADirectoryThatCannotBeMadeIsAnErrorThatSaysWhatToSet) {
  const std::string file = fresh_dir("not_a_dir");
  spit(file, "a file where the cache directory should go");
  auto cpu = CpuBackend::make(CpuBackendOptions::with_cache_dir(file));
  ASSERT_FALSE(cpu.ok());
  EXPECT_NE(cpu.status().message().find(file), std::string_view::npos) << cpu.status();
  EXPECT_NE(cpu.status().message().find("CRUCIBLE_CACHE_DIR"), std::string_view::npos)
      << cpu.status();
  CpuBackendOptions no_disk = CpuBackendOptions::with_cache_dir(file);
  no_disk.disk_cache = false;
  auto without_disk = CpuBackend::make(no_disk);
  EXPECT_TRUE(without_disk.ok()) << without_disk.status();
  fs::remove(file);
}

TEST(KernelCache, KeyNamesWhatChangesTheCode) {
  const CpuTarget& host = host_target();
  EXPECT_FALSE(host.triple.empty());
  EXPECT_FALSE(host.cpu.empty());
  EXPECT_TRUE(runs_on(host.features, host));
  EXPECT_FALSE(runs_on(host.features + ",+crucible-no-such-feature", host));
  EXPECT_TRUE(runs_on("-avx512f,-crucible-no-such-feature", host));
  const ContentHash a = content_hash(std::string_view("a")),
                    b = content_hash(std::string_view("b"));
  const CpuKernelKey k = cpu_kernel_key(a, "strict", host, 3);
  EXPECT_EQ(key_features(k.text), host.features);
  EXPECT_NE(k.hash, cpu_kernel_key(b, "strict", host, 3).hash);
  EXPECT_NE(k.hash, cpu_kernel_key(a, "ordered", host, 3).hash);
  EXPECT_NE(k.hash, cpu_kernel_key(a, "strict", host, 2).hash);
  CpuTarget other = host;
  other.cpu += "-x";
  EXPECT_NE(k.hash, cpu_kernel_key(a, "strict", other, 3).hash);
  other = host;
  other.llvm_version = "0.0";
  EXPECT_NE(k.hash, cpu_kernel_key(a, "strict", other, 3).hash);
}

}  // namespace
}  // namespace crucible::mimic
