// ExprPool.cpp — hash-consed symbolic integer expressions in a polynomial normal form.
//
// Note [Expression normal form]: sums and products are kept as polynomials over atoms (symbols
// and floor divisions): an Add is an optional constant followed by terms with distinct
// monomials, each term an atom or a Mul of an optional coefficient and atoms; a Mul of two sums
// is expanded. So B*2+B, 3*B and B*3 are one node, and (B+1)*2 is B*2+2. Operands are ordered
// structurally (kind, then value / name / operands), never by address or creation order, so the
// canonical text — and with it plan digests — is the same in every pool and process. Two
// exceptions keep a node unexpanded instead of folding it: a product whose expansion would pass
// kMaxExpandTerms terms (a sum is then a factor of a Mul), and constant arithmetic that would
// overflow int64 (the operands stay apart and evaluate() reports the overflow). Shapes never
// come near either: a batch dim is k*B with k < 2^20.
//
// A floor division by a constant k is normalised to k > 0 with the numerator's coefficients
// reduced into [0, k): (3*B+5)//2 = B+2+(B+1)//2, (k*B)//k = B, (a//2)//3 = a//6. Division by a
// symbol is left as it is (the symbol may be bound to 0, which evaluate() reports).
#include "crucible/forge/ExprPool.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "crucible/core/Contract.h"

namespace crucible::forge {
namespace {

using Kind = Expr::Kind;

// A product of more terms is kept as a Mul of sums (Note [Expression normal form]).
constexpr std::size_t kMaxExpandTerms = 64;

// Structural total order, the same in every pool (Note [Expression normal form]).
int compare(const Expr* a, const Expr* b) {
  if (a == b) return 0;
  if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
  switch (a->kind) {
    case Kind::Const:
      return a->value < b->value ? -1 : (a->value > b->value ? 1 : 0);
    case Kind::Sym: {
      const int c = a->name.compare(b->name);
      return c < 0 ? -1 : (c > 0 ? 1 : 0);
    }
    default:
      break;
  }
  const std::size_t n = std::min(a->args.size(), b->args.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (const int c = compare(a->args[i], b->args[i]); c != 0) return c;
  }
  if (a->args.size() != b->args.size()) return a->args.size() < b->args.size() ? -1 : 1;
  return 0;
}

bool less(const Expr* a, const Expr* b) { return compare(a, b) < 0; }

// A monomial: sorted atoms (with repetition), empty for the constant term.
using Monomial = std::vector<const Expr*>;

int compare_monomial(const Monomial& a, const Monomial& b) {
  if (a.size() != b.size()) {
    // Lower degree first: the constant term (degree 0) leads a sum.
    return a.size() < b.size() ? -1 : 1;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (const int c = compare(a[i], b[i]); c != 0) return c;
  }
  return 0;
}

struct Term {
  Monomial mono;
  std::int64_t coeff = 0;
};
// Sorted by monomial, monomials distinct, no zero coefficient.
using Poly = std::vector<Term>;

// The term a non-sum expression stands for.
std::optional<Term> term_of(const Expr* e) {
  if (e->kind == Kind::Const) return Term{{}, e->value};
  if (e->kind != Kind::Mul) return Term{{e}, 1};
  Term t{{}, 1};
  for (const Expr* f : e->args) {
    if (f->kind == Kind::Const) {
      if (__builtin_mul_overflow(t.coeff, f->value, &t.coeff)) return std::nullopt;
    } else {
      t.mono.push_back(f);
    }
  }
  std::sort(t.mono.begin(), t.mono.end(), less);
  return t;
}

// Adds term t into the sorted poly p; false on overflow.
bool add_term(Poly& p, Term t) {
  if (t.coeff == 0) return true;
  auto it = std::lower_bound(p.begin(), p.end(), t, [](const Term& x, const Term& y) {
    return compare_monomial(x.mono, y.mono) < 0;
  });
  if (it != p.end() && compare_monomial(it->mono, t.mono) == 0) {
    if (__builtin_add_overflow(it->coeff, t.coeff, &it->coeff)) return false;
    if (it->coeff == 0) p.erase(it);
    return true;
  }
  p.insert(it, std::move(t));
  return true;
}

std::optional<Poly> poly_of(const Expr* e) {
  Poly p;
  if (e->kind == Kind::Add) {
    for (const Expr* a : e->args) {
      auto t = term_of(a);
      if (!t || !add_term(p, std::move(*t))) return std::nullopt;
    }
    return p;
  }
  auto t = term_of(e);
  if (!t || !add_term(p, std::move(*t))) return std::nullopt;
  return p;
}

std::optional<Poly> poly_mul(const Poly& a, const Poly& b) {
  Poly p;
  for (const Term& x : a) {
    for (const Term& y : b) {
      Term t;
      if (__builtin_mul_overflow(x.coeff, y.coeff, &t.coeff)) return std::nullopt;
      t.mono.reserve(x.mono.size() + y.mono.size());
      std::merge(x.mono.begin(), x.mono.end(), y.mono.begin(), y.mono.end(),
                 std::back_inserter(t.mono), less);
      if (!add_term(p, std::move(t))) return std::nullopt;
    }
  }
  return p;
}

// Python's floor division (rounds toward -infinity); the caller excludes b == 0 and MIN / -1.
std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Expr node(Kind kind) {
  Expr e{};
  e.kind = kind;
  return e;
}

std::string key_of(const Expr& e) {
  std::string k;
  switch (e.kind) {
    case Kind::Const:
      return "c" + std::to_string(e.value);
    case Kind::Sym:
      return "s" + e.name;
    case Kind::Add:
      k = "+";
      break;
    case Kind::Mul:
      k = "*";
      break;
    case Kind::FloorDiv:
      k = "/";
      break;
  }
  // Operands are interned, so their ids name them exactly.
  for (const Expr* a : e.args) {
    k += std::to_string(a->id);
    k += ',';
  }
  return k;
}

}  // namespace

const Expr* ExprPool::intern(Expr e) {
  std::string key = key_of(e);
  if (auto it = index_.find(key); it != index_.end()) return it->second;
  e.id = nodes_.size();
  nodes_.push_back(std::move(e));
  const Expr* p = &nodes_.back();
  index_.emplace(std::move(key), p);
  return p;
}

const Expr* ExprPool::constant(std::int64_t v) {
  Expr e = node(Kind::Const);
  e.value = v;
  return intern(std::move(e));
}

const Expr* ExprPool::symbol(std::string_view name) {
  CRUCIBLE_PRE(!name.empty(), "a symbol has a name");
  Expr e = node(Kind::Sym);
  e.name = std::string(name);
  return intern(std::move(e));
}

namespace {

// Node for one term of a polynomial; `intern` is the pool's.
template <class Intern>
const Expr* build_term(ExprPool& pool, const Term& t, Intern&& intern) {
  if (t.mono.empty()) return pool.constant(t.coeff);
  if (t.coeff == 1 && t.mono.size() == 1) return t.mono[0];
  Expr m = node(Kind::Mul);
  if (t.coeff != 1) m.args.push_back(pool.constant(t.coeff));
  m.args.insert(m.args.end(), t.mono.begin(), t.mono.end());
  return intern(std::move(m));
}

// One node from a polynomial: 0, a term, or an Add with the constant first.
template <class Intern>
const Expr* build_poly(ExprPool& pool, const Poly& p, Intern&& intern) {
  if (p.empty()) return pool.constant(0);
  if (p.size() == 1) return build_term(pool, p[0], intern);
  Expr s = node(Kind::Add);
  for (const Term& t : p) s.args.push_back(build_term(pool, t, intern));
  return intern(std::move(s));
}

}  // namespace

const Expr* ExprPool::add(const Expr* a, const Expr* b) {
  CRUCIBLE_PRE(a != nullptr && b != nullptr, "operands come from this pool");
  const auto intern_fn = [this](Expr e) { return intern(std::move(e)); };
  auto pa = poly_of(a);
  auto pb = poly_of(b);
  if (pa && pb) {
    bool ok = true;
    for (const Term& t : *pb) ok = ok && add_term(*pa, t);
    if (ok) return build_poly(*this, *pa, intern_fn);
  }
  // int64 overflow while folding: kept apart, evaluate() reports it.
  Expr s = node(Kind::Add);
  s.args = {a, b};
  std::sort(s.args.begin(), s.args.end(), less);
  return intern(std::move(s));
}

const Expr* ExprPool::mul(const Expr* a, const Expr* b) {
  CRUCIBLE_PRE(a != nullptr && b != nullptr, "operands come from this pool");
  const auto intern_fn = [this](Expr e) { return intern(std::move(e)); };
  auto pa = poly_of(a);
  auto pb = poly_of(b);
  if (pa && pb) {
    if (pa->size() * pb->size() <= kMaxExpandTerms) {
      if (auto p = poly_mul(*pa, *pb)) return build_poly(*this, *p, intern_fn);
    } else {
      // Too many terms to expand: a Mul whose factors include the sums themselves.
      Term t{{}, 1};
      bool ok = true;
      for (const Poly* q : {&*pa, &*pb}) {
        if (q->size() == 1) {
          ok = ok && !__builtin_mul_overflow(t.coeff, (*q)[0].coeff, &t.coeff);
          t.mono.insert(t.mono.end(), (*q)[0].mono.begin(), (*q)[0].mono.end());
        } else {
          t.mono.push_back(q == &*pa ? a : b);
        }
      }
      if (ok) {
        std::sort(t.mono.begin(), t.mono.end(), less);
        return build_term(*this, t, intern_fn);
      }
    }
  }
  // int64 overflow while folding: kept apart, evaluate() reports it.
  Expr m = node(Kind::Mul);
  m.args = {a, b};
  std::sort(m.args.begin(), m.args.end(), less);
  return intern(std::move(m));
}

const Expr* ExprPool::floordiv(const Expr* a, const Expr* b) {
  CRUCIBLE_PRE(a != nullptr && b != nullptr, "operands come from this pool");
  CRUCIBLE_PRE(!(b->kind == Kind::Const && b->value == 0),
               "floordiv by the constant 0; check the divisor before building the expression");
  const auto raw = [this](const Expr* n, const Expr* d) {
    Expr e = node(Kind::FloorDiv);
    e.args = {n, d};
    return intern(std::move(e));
  };
  if (b->kind != Kind::Const || b->value == 0) return raw(a, b);
  std::int64_t k = b->value;
  if (k == 1) return a;
  const auto intern_fn = [this](Expr e) { return intern(std::move(e)); };
  auto p = poly_of(a);
  if (!p) return raw(a, b);
  // a // k with k < 0 is (-a) // (-k).
  if (k < 0) {
    if (k == INT64_MIN) return raw(a, b);
    for (Term& t : *p) {
      if (t.coeff == INT64_MIN) return raw(a, b);
      t.coeff = -t.coeff;
    }
    return floordiv(build_poly(*this, *p, intern_fn), constant(-k));
  }
  // (x // k1) // k2 = x // (k1*k2) for k1, k2 > 0.
  if (a->kind == Kind::FloorDiv && a->args[1]->kind == Kind::Const && a->args[1]->value > 0) {
    std::int64_t kk;
    if (!__builtin_mul_overflow(a->args[1]->value, k, &kk))
      return floordiv(a->args[0], constant(kk));
  }
  // Split every coefficient c = k*q + r with 0 <= r < k: a // k = sum(q*m) + (sum(r*m)) // k.
  Poly whole, rest;
  for (const Term& t : *p) {
    const std::int64_t q = floor_div(t.coeff, k);
    const std::int64_t r = t.coeff - q * k;
    if (q != 0) whole.push_back(Term{t.mono, q});
    if (r != 0) rest.push_back(Term{t.mono, r});
  }
  if (rest.empty()) return build_poly(*this, whole, intern_fn);
  const Expr* rem = build_poly(*this, rest, intern_fn);
  const Expr* div = rem->kind == Kind::Const ? constant(floor_div(rem->value, k)) : raw(rem, b);
  if (whole.empty()) return div;
  return add(build_poly(*this, whole, intern_fn), div);
}

Result<std::int64_t> ExprPool::evaluate(
    const Expr* e, const std::map<std::string, std::int64_t, std::less<>>& bindings) const {
  CRUCIBLE_PRE(e != nullptr, "an expression of this pool");
  switch (e->kind) {
    case Kind::Const:
      return e->value;
    case Kind::Sym: {
      auto it = bindings.find(e->name);
      if (it == bindings.end()) {
        return invalid_input(
            "symbol '" + e->name + "' in '" + to_string(e) + "' is not bound",
            "bind it (e.g. --batch or {\"" + e->name + "\": N}) before instantiating");
      }
      return it->second;
    }
    case Kind::Add:
    case Kind::Mul: {
      const bool is_add = e->kind == Kind::Add;
      std::int64_t acc = is_add ? 0 : 1;
      for (const Expr* a : e->args) {
        auto v = evaluate(a, bindings);
        if (!v.ok()) return v.status();
        const bool overflow =
            is_add ? __builtin_add_overflow(acc, *v, &acc) : __builtin_mul_overflow(acc, *v, &acc);
        if (overflow) {
          return invalid_input("'" + to_string(e) + "' overflows int64 under these bindings",
                               "use smaller symbol values");
        }
      }
      return acc;
    }
    case Kind::FloorDiv: {
      auto n = evaluate(e->args[0], bindings);
      if (!n.ok()) return n.status();
      auto d = evaluate(e->args[1], bindings);
      if (!d.ok()) return d.status();
      if (*d == 0) {
        return invalid_input("'" + to_string(e) + "' divides by zero under these bindings",
                             "bind the divisor's symbols to non-zero values");
      }
      if (*n == INT64_MIN && *d == -1) {
        return invalid_input("'" + to_string(e) + "' overflows int64 under these bindings",
                             "use smaller symbol values");
      }
      return floor_div(*n, *d);
    }
  }
  return invalid_input("unknown expression kind", "build expressions through ExprPool");
}

namespace {

void print(const Expr* e, std::string& out);

// A Mul's factors without its constant, then "*c" (c printed only when not 1).
void print_product(const Expr* e, std::int64_t coeff, std::string& out) {
  bool first = true;
  for (const Expr* f : e->args) {
    if (f->kind == Kind::Const) continue;
    if (!first) out += '*';
    first = false;
    const bool paren = f->kind == Kind::Add || f->kind == Kind::FloorDiv;
    if (paren) out += '(';
    print(f, out);
    if (paren) out += ')';
  }
  if (coeff != 1) {
    out += '*';
    out += std::to_string(coeff);
  }
}

std::int64_t coeff_of(const Expr* e) {
  for (const Expr* f : e->args) {
    if (f->kind == Kind::Const) return f->value;
  }
  return 1;
}

// Prints e as a term; returns with a leading '-' when its coefficient is negative.
void print_term(const Expr* e, bool leading, std::string& out) {
  if (e->kind == Kind::Const) {
    if (e->value < 0) {
      out += std::to_string(e->value);
    } else {
      if (!leading) out += '+';
      out += std::to_string(e->value);
    }
    return;
  }
  if (e->kind == Kind::Mul) {
    const std::int64_t c = coeff_of(e);
    const bool plain = std::count_if(e->args.begin(), e->args.end(),
                                     [](const Expr* f) { return f->kind == Kind::Const; }) <= 1;
    if (plain && c < 0 && c != INT64_MIN) {
      out += '-';
      print_product(e, -c, out);
      return;
    }
    if (!leading) out += '+';
    if (plain) {
      print_product(e, c, out);
    } else {
      print(e, out);
    }
    return;
  }
  if (!leading) out += '+';
  const bool paren = e->kind == Kind::Add;
  if (paren) out += '(';
  print(e, out);
  if (paren) out += ')';
}

void print(const Expr* e, std::string& out) {
  switch (e->kind) {
    case Kind::Const:
      out += std::to_string(e->value);
      return;
    case Kind::Sym:
      out += e->name;
      return;
    case Kind::Add: {
      // Terms in order, the constant last: "B*2+1".
      bool leading = true;
      const Expr* constant = nullptr;
      for (const Expr* a : e->args) {
        if (a->kind == Kind::Const && constant == nullptr && a == e->args.front()) {
          constant = a;
          continue;
        }
        print_term(a, leading, out);
        leading = false;
      }
      if (constant != nullptr) print_term(constant, leading, out);
      return;
    }
    case Kind::Mul: {
      const bool plain = std::count_if(e->args.begin(), e->args.end(),
                                       [](const Expr* f) { return f->kind == Kind::Const; }) <= 1;
      if (plain) {
        print_term(e, true, out);
        return;
      }
      // Unfolded constants (overflow): every factor, in order.
      for (std::size_t i = 0; i < e->args.size(); ++i) {
        if (i) out += '*';
        const Expr* f = e->args[i];
        const bool paren = f->kind == Kind::Add || f->kind == Kind::FloorDiv ||
                           (f->kind == Kind::Const && f->value < 0);
        if (paren) out += '(';
        print(f, out);
        if (paren) out += ')';
      }
      return;
    }
    case Kind::FloorDiv: {
      const Expr* n = e->args[0];
      const Expr* d = e->args[1];
      const bool pn = n->kind == Kind::Add || n->kind == Kind::FloorDiv;
      if (pn) out += '(';
      print(n, out);
      if (pn) out += ')';
      out += "//";
      const bool pd = !(d->kind == Kind::Sym || (d->kind == Kind::Const && d->value >= 0));
      if (pd) out += '(';
      print(d, out);
      if (pd) out += ')';
      return;
    }
  }
}

}  // namespace

std::string ExprPool::to_string(const Expr* e) {
  CRUCIBLE_PRE(e != nullptr, "an expression");
  std::string out;
  print(e, out);
  return out;
}

}  // namespace crucible::forge
