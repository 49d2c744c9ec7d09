// dump_test — CRUCIBLE_DUMP=DIR (Note [CRUCIBLE_DUMP], CpuCodegen.cpp): each kernel the CPU
// backend compiles leaves its program, its optimized LLVM IR and its assembly in DIR; the
// kernel it runs is the same (bit for bit against the reference); a DIR that cannot be made is
// an error that names CRUCIBLE_DUMP.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cache_chain.h"

namespace crucible::mimic {
namespace {

namespace fs = std::filesystem;

// A chain no other test compiles (the memory cache would hand this process's backend the
// kernel without compiling it, and nothing would be dumped): each test its own last op.
test::ChainSpec dump_chain(const std::string& name, const std::string& last_op,
                           std::vector<int> last_in = {-3}) {
  using test::kF64;
  test::TensorSpec t{kF64, {2, 37}, {}, 0, false, 0};
  auto st = [](std::string op, std::vector<int> in) {
    using test::kF64;
    test::StepSpec x;
    x.op = std::move(op);
    x.in = std::move(in);
    x.out_dtype = kF64;
    return x;
  };
  return test::ChainSpec{name, {2, 37}, {t, t},
                         {st("aten::mul.Tensor", {0, 1}), st("aten::neg", {-1}), st("aten::abs", {-2}),
                          st(last_op, std::move(last_in))}};
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct DumpEnv {  // CRUCIBLE_DUMP for the test's duration
  explicit DumpEnv(const std::string& dir) { ::setenv("CRUCIBLE_DUMP", dir.c_str(), 1); }
  ~DumpEnv() { ::unsetenv("CRUCIBLE_DUMP"); }
};

TEST(Dump, EachCompiledKernelLeavesItsProgramIrAndAssembly) {
  const std::string dir = ::testing::TempDir() + "crucible_dump_" + std::to_string(::getpid());
  fs::remove_all(dir);
  bool correct = false;
  {
    DumpEnv env(dir + "/nested");
    auto st = test::run_chain_on_cpu(dump_chain("dump_chain_a", "aten::div.Tensor", {-3, 0}), CpuBackendOptions::memory_only(), &correct);
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->compiled, 1u);
  }
  EXPECT_TRUE(correct);
  std::vector<fs::path> ll, s, txt;
  for (const auto& e : fs::directory_iterator(dir + "/nested")) {
    if (e.path().extension() == ".ll") ll.push_back(e.path());
    if (e.path().extension() == ".s") s.push_back(e.path());
    if (e.path().string().ends_with(".program.txt")) txt.push_back(e.path());
  }
  ASSERT_EQ(ll.size(), 1u);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_EQ(txt.size(), 1u);
  const std::string prefix = ll[0].stem().string();
  const std::string ir = slurp(ll[0]), as = slurp(s[0]), prog = slurp(txt[0]);
  EXPECT_NE(ir.find("define"), std::string::npos);
  EXPECT_NE(ir.find(prefix + "_contig"), std::string::npos) << ir.substr(0, 400);
  EXPECT_NE(ir.find(prefix + "_strided"), std::string::npos);
  EXPECT_NE(ir.find("fdiv"), std::string::npos);       // the program's ops, in the IR
  EXPECT_NE(as.find(prefix + "_contig:"), std::string::npos) << as.substr(0, 400);
  EXPECT_NE(as.find("divpd"), std::string::npos);      // vdivpd / divpd
  EXPECT_FALSE(prog.empty());
  fs::remove_all(dir);
}

TEST(Dump, ADirectoryThatCannotBeMadeIsAnErrorNamingTheVariable) {
  const std::string file = ::testing::TempDir() + "crucible_dump_file_" + std::to_string(::getpid());
  { std::ofstream(file) << "a file where the dump directory should go"; }
  bool correct = false;
  {
    DumpEnv env(file + "/sub");
    auto st = test::run_chain_on_cpu(dump_chain("dump_chain_b", "aten::relu"), CpuBackendOptions::memory_only(), &correct);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.status().message().find("CRUCIBLE_DUMP="), std::string_view::npos) << st.status();
    EXPECT_NE(st.status().message().find("unset CRUCIBLE_DUMP"), std::string_view::npos) << st.status();
  }
  fs::remove(file);
}

}  // namespace
}  // namespace crucible::mimic
