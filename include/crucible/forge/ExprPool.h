// ExprPool.h — interned symbolic integer expressions for tensor shapes.
//
// Every expression is created through an ExprPool and is canonical: constants folded, sums and
// products flattened with their operands sorted (constants first, then structurally), so that
// two equal expressions are the same pointer and comparing shapes is comparing pointers. A plan
// built with a symbol "B" for the batch size can be instantiated for any batch by evaluate().
//
// Not thread-safe: one pool per compilation. Expressions live as long as their pool.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "crucible/core/Status.h"

namespace crucible::forge {

struct Expr {
  enum class Kind : std::uint8_t { Const, Sym, Add, Mul, FloorDiv };
  Kind kind;
  std::int64_t value = 0;           // Const
  std::string name;                 // Sym
  std::vector<const Expr*> args;    // Add/Mul: >= 2 sorted; FloorDiv: {numerator, denominator}
  std::uint64_t id = 0;             // creation order in the pool (operand order is structural)
};

class ExprPool {
 public:
  const Expr* constant(std::int64_t v);
  const Expr* symbol(std::string_view name);
  const Expr* add(const Expr* a, const Expr* b);
  const Expr* mul(const Expr* a, const Expr* b);
  const Expr* floordiv(const Expr* a, const Expr* b);  // b must not be the constant 0

  // Value under the given symbol bindings; an unbound symbol or a division by zero is an error.
  Result<std::int64_t> evaluate(const Expr* e, const std::map<std::string, std::int64_t, std::less<>>& bindings) const;
  // "B*64", "(B+1)//2", "512": the canonical text (also what plan texts and digests print).
  static std::string to_string(const Expr* e);
  std::size_t size() const { return nodes_.size(); }

 private:
  const Expr* intern(Expr e);
  std::deque<Expr> nodes_;
  std::unordered_map<std::string, const Expr*> index_;  // canonical key -> node
};

}  // namespace crucible::forge
