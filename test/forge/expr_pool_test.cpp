// expr_pool_test.cpp — symbolic shape expressions: interning, folding, evaluation, canonical text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "crucible/forge/ExprPool.h"

namespace crucible::forge {
namespace {

using Bindings = std::map<std::string, std::int64_t, std::less<>>;

class ExprPoolTest : public ::testing::Test {
 protected:
  ExprPool p;
  const Expr* c(std::int64_t v) { return p.constant(v); }
  const Expr* B() { return p.symbol("B"); }
  const Expr* C() { return p.symbol("C"); }
  std::string str(const Expr* e) { return ExprPool::to_string(e); }
  std::int64_t eval(const Expr* e, const Bindings& b) {
    auto r = p.evaluate(e, b);
    EXPECT_TRUE(r.ok()) << str(e) << ": " << r.status();
    return r.ok() ? *r : INT64_MIN;
  }
};

TEST_F(ExprPoolTest, EqualExpressionsAreOnePointer) {
  EXPECT_EQ(c(5), c(5));
  EXPECT_EQ(B(), p.symbol("B"));
  EXPECT_NE(B(), C());
  EXPECT_EQ(p.add(B(), C()), p.add(C(), B()));
  EXPECT_EQ(p.mul(B(), C()), p.mul(C(), B()));
  // Flattening: association does not matter.
  EXPECT_EQ(p.add(p.add(B(), c(1)), C()), p.add(B(), p.add(C(), c(1))));
  EXPECT_EQ(p.add(p.add(C(), B()), c(1)), p.add(c(1), p.add(B(), C())));
  EXPECT_EQ(p.mul(p.mul(B(), c(2)), C()), p.mul(B(), p.mul(C(), c(2))));
  EXPECT_EQ(p.floordiv(p.add(B(), c(1)), c(2)), p.floordiv(p.add(c(1), B()), c(2)));
  // Re-creating existing expressions adds no node.
  const std::size_t n = p.size();
  (void)p.add(C(), B());
  (void)p.mul(p.mul(C(), c(2)), B());
  EXPECT_EQ(p.size(), n);
}

TEST_F(ExprPoolTest, OperandsAreSortedConstantsFirst) {
  const Expr* s = p.add(B(), c(5));
  ASSERT_EQ(s->kind, Expr::Kind::Add);
  ASSERT_EQ(s->args.size(), 2u);
  EXPECT_EQ(s->args[0], c(5));
  EXPECT_EQ(s->args[1], B());
  const Expr* m = p.mul(C(), p.mul(B(), c(64)));
  ASSERT_EQ(m->kind, Expr::Kind::Mul);
  ASSERT_EQ(m->args.size(), 3u);
  EXPECT_EQ(m->args[0], c(64));
  EXPECT_EQ(m->args[1], B());
  EXPECT_EQ(m->args[2], C());
}

TEST_F(ExprPoolTest, ConstantsFoldAndIdentitiesVanish) {
  EXPECT_EQ(p.add(c(2), c(3)), c(5));
  EXPECT_EQ(p.mul(c(4), c(-3)), c(-12));
  EXPECT_EQ(p.mul(B(), c(1)), B());
  EXPECT_EQ(p.mul(c(1), B()), B());
  EXPECT_EQ(p.add(B(), c(0)), B());
  EXPECT_EQ(p.mul(B(), c(0)), c(0));
  EXPECT_EQ(p.mul(p.add(B(), C()), c(0)), c(0));
  EXPECT_EQ(p.add(p.add(B(), c(2)), c(-2)), B());
  // Like terms combine and cancel.
  EXPECT_EQ(p.add(B(), B()), p.mul(B(), c(2)));
  EXPECT_EQ(p.add(p.mul(B(), c(2)), p.mul(c(3), B())), p.mul(B(), c(5)));
  EXPECT_EQ(p.add(B(), p.mul(B(), c(-1))), c(0));
  // Constants distribute over sums: one form for a linear expression.
  EXPECT_EQ(p.mul(c(2), p.add(B(), c(1))), p.add(p.mul(B(), c(2)), c(2)));
  EXPECT_EQ(p.mul(p.add(B(), c(1)), p.add(B(), c(-1))), p.add(p.mul(B(), B()), c(-1)));
}

TEST_F(ExprPoolTest, FloorDivisionFolds) {
  EXPECT_EQ(p.floordiv(B(), c(1)), B());
  EXPECT_EQ(p.floordiv(c(7), c(2)), c(3));
  EXPECT_EQ(p.floordiv(c(-7), c(2)), c(-4));  // floor, not truncation
  EXPECT_EQ(p.floordiv(c(7), c(-2)), c(-4));
  EXPECT_EQ(p.floordiv(c(0), c(5)), c(0));
  // (k*B)//k = B, and exact divisions in general.
  EXPECT_EQ(p.floordiv(p.mul(B(), c(64)), c(64)), B());
  EXPECT_EQ(p.floordiv(p.mul(c(6), B()), c(3)), p.mul(B(), c(2)));
  EXPECT_EQ(p.floordiv(p.add(p.mul(B(), c(4)), c(8)), c(4)), p.add(B(), c(2)));
  // Whole parts come out; nested divisions by constants merge.
  EXPECT_EQ(p.floordiv(p.add(p.mul(B(), c(3)), c(5)), c(2)),
            p.add(p.add(B(), c(2)), p.floordiv(p.add(B(), c(1)), c(2))));
  EXPECT_EQ(p.floordiv(p.floordiv(B(), c(2)), c(3)), p.floordiv(B(), c(6)));
  // A negative divisor is the negated numerator over a positive one.
  EXPECT_EQ(p.floordiv(B(), c(-2)), p.floordiv(p.mul(B(), c(-1)), c(2)));
  // Not exact: kept.
  const Expr* half = p.floordiv(p.add(B(), c(1)), c(2));
  EXPECT_EQ(half->kind, Expr::Kind::FloorDiv);
  EXPECT_EQ(p.floordiv(B(), C())->kind, Expr::Kind::FloorDiv);
}

TEST_F(ExprPoolTest, EvaluateUnderBindings) {
  EXPECT_EQ(eval(c(512), {}), 512);
  EXPECT_EQ(eval(p.mul(B(), c(64)), {{"B", 3}}), 192);
  EXPECT_EQ(eval(p.floordiv(p.add(B(), c(1)), c(2)), {{"B", 4}}), 2);
  EXPECT_EQ(eval(p.floordiv(p.add(B(), c(1)), c(2)), {{"B", 5}}), 3);
  EXPECT_EQ(eval(p.floordiv(B(), c(2)), {{"B", -3}}), -2);
  EXPECT_EQ(eval(p.floordiv(B(), c(-2)), {{"B", 3}}), -2);
  EXPECT_EQ(eval(p.floordiv(B(), C()), {{"B", 7}, {"C", -2}}), -4);
  const Expr* e = p.floordiv(p.add(p.mul(B(), c(3)), c(5)), c(2));
  for (std::int64_t b = -9; b <= 9; ++b) {
    const std::int64_t n = 3 * b + 5;
    const std::int64_t want = n / 2 - ((n % 2 != 0) && (n < 0) ? 1 : 0);
    EXPECT_EQ(eval(e, {{"B", b}}), want) << "B=" << b;
  }
}

TEST_F(ExprPoolTest, EvaluateErrorsSayWhatIsWrong) {
  auto unbound = p.evaluate(p.add(B(), C()), {{"B", 1}});
  ASSERT_FALSE(unbound.ok());
  EXPECT_EQ(unbound.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(unbound.status().message()).find("'C'"), std::string::npos)
      << unbound.status();

  auto div0 = p.evaluate(p.floordiv(B(), C()), {{"B", 4}, {"C", 0}});
  ASSERT_FALSE(div0.ok());
  EXPECT_NE(std::string(div0.status().message()).find("divides by zero"), std::string::npos)
      << div0.status();

  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  auto big = p.evaluate(p.mul(B(), c(kMax / 2)), {{"B", 3}});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(std::string(big.status().message()).find("overflows"), std::string::npos)
      << big.status();

  // Constant folding that would overflow keeps the operands apart; evaluate reports it.
  const Expr* kept = p.add(c(kMax), c(1));
  EXPECT_EQ(kept->kind, Expr::Kind::Add);
  EXPECT_FALSE(p.evaluate(kept, {}).ok());
  EXPECT_FALSE(p.evaluate(p.mul(c(kMax), c(2)), {}).ok());
  auto min_div = p.evaluate(p.floordiv(B(), C()),
                            {{"B", std::numeric_limits<std::int64_t>::min()}, {"C", -1}});
  EXPECT_FALSE(min_div.ok());
}

TEST_F(ExprPoolTest, CanonicalText) {
  EXPECT_EQ(str(c(512)), "512");
  EXPECT_EQ(str(c(-3)), "-3");
  EXPECT_EQ(str(B()), "B");
  EXPECT_EQ(str(p.mul(c(64), B())), "B*64");
  EXPECT_EQ(str(p.floordiv(p.add(c(1), B()), c(2))), "(B+1)//2");
  EXPECT_EQ(str(p.add(p.mul(C(), c(2)), p.add(c(3), B()))), "B+C*2+3");
  EXPECT_EQ(str(p.add(B(), c(-1))), "B-1");
  EXPECT_EQ(str(p.mul(B(), c(-2))), "-B*2");
  EXPECT_EQ(str(p.add(C(), p.mul(B(), c(-1)))), "-B+C");
  EXPECT_EQ(str(p.floordiv(B(), C())), "B//C");
  EXPECT_EQ(str(p.floordiv(B(), p.add(C(), c(1)))), "B//(C+1)");
  EXPECT_EQ(str(p.mul(p.floordiv(B(), c(2)), C())), "C*(B//2)");
  EXPECT_EQ(str(p.mul(p.add(B(), c(1)), p.add(C(), c(1)))), "B+C+B*C+1");
  EXPECT_EQ(str(p.floordiv(p.add(p.mul(B(), c(3)), c(5)), c(2))), "B+(B+1)//2+2");
}

TEST(ExprPool, TextDoesNotDependOnCreationOrder) {
  ExprPool a, b;
  (void)b.symbol("C");  // b meets C before B
  (void)b.symbol("D");
  const auto build = [](ExprPool& p) {
    const Expr* B = p.symbol("B");
    const Expr* C = p.symbol("C");
    const Expr* D = p.symbol("D");
    return p.floordiv(p.add(p.mul(D, p.add(B, C)), p.mul(C, p.constant(3))), p.constant(2));
  };
  EXPECT_EQ(ExprPool::to_string(build(a)), ExprPool::to_string(build(b)));
  EXPECT_EQ(ExprPool::to_string(build(a)), "C+(C+B*D+C*D)//2");  // (3C + BD + CD) // 2
}

// Random expression trees: the pool's value under bindings equals plain integer arithmetic on
// the same tree, and the same tree built in another order is the same pointer.
TEST(ExprPool, RandomTreesEvaluateLikeIntegers) {
  std::mt19937_64 rng(12345);
  const char* names[] = {"B", "C", "D"};
  for (int round = 0; round < 200; ++round) {
    ExprPool p;
    Bindings bind;
    for (const char* n : names) bind[n] = static_cast<std::int64_t>(rng() % 9) + 1;  // 1..9
    struct Node {
      const Expr* e;
      std::int64_t v;
    };
    const auto floor_div = [](std::int64_t a, std::int64_t b) {
      return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0);
    };
    std::function<Node(int)> gen = [&](int depth) -> Node {
      const int pick = depth == 0 ? static_cast<int>(rng() % 2) : static_cast<int>(rng() % 5);
      if (pick == 0) {
        const std::int64_t v = static_cast<std::int64_t>(rng() % 11) - 5;
        return {p.constant(v), v};
      }
      if (pick == 1) {
        const char* n = names[rng() % 3];
        return {p.symbol(n), bind[n]};
      }
      const Node x = gen(depth - 1);
      if (pick == 2) {
        const Node y = gen(depth - 1);
        return {p.add(x.e, y.e), x.v + y.v};
      }
      if (pick == 3) {
        const Node y = gen(depth - 1);
        return {p.mul(x.e, y.e), x.v * y.v};
      }
      std::int64_t k = static_cast<std::int64_t>(rng() % 9) - 4;
      if (k == 0) k = 3;
      return {p.floordiv(x.e, p.constant(k)), floor_div(x.v, k)};
    };
    const Node n = gen(4);
    auto v = p.evaluate(n.e, bind);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, n.v) << ExprPool::to_string(n.e) << " round " << round;
  }
}

TEST(ExprPool, SumsAndProductsCommuteToOnePointer) {
  std::mt19937_64 rng(7);
  ExprPool p;
  std::vector<const Expr*> terms = {p.symbol("B"), p.symbol("C"), p.constant(3),
                                    p.mul(p.symbol("B"), p.constant(2)),
                                    p.floordiv(p.symbol("C"), p.constant(4))};
  const auto fold = [&](std::vector<const Expr*> v, bool sum) {
    std::shuffle(v.begin(), v.end(), rng);
    const Expr* acc = v[0];
    for (std::size_t i = 1; i < v.size(); ++i) acc = sum ? p.add(acc, v[i]) : p.mul(v[i], acc);
    return acc;
  };
  const Expr* s = fold(terms, true);
  const Expr* m = fold(terms, false);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(fold(terms, true), s);
    EXPECT_EQ(fold(terms, false), m);
  }
  EXPECT_EQ(ExprPool::to_string(s), "B*3+C+C//4+3");
}

}  // namespace
}  // namespace crucible::forge
