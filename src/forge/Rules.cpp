// Rules.cpp — strict parsing of rules/<class>.toml, `extends` resolution, the rules digest.
#include "crucible/forge/Rules.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "crucible/forge/Digest.h"

namespace crucible::forge {
namespace {

// Note [Priority bands]: a rule's priority says what it is, so that a larger pattern always
// matches before its subset (vLLM orders its patterns the same way) and the fallback only ever
// catches what nothing else does:
//   200..999  multi-op fusions (two or more steps, a repeated "+"/"*" step, or horizontal)
//    10..199  single-op defaults (one step)
//          0  the fallback: pattern ["*"], kernel "opaque" (runs op by op)
// The parser refuses a priority outside its band, so a file cannot silently invert them.
constexpr std::int32_t kMultiMin = 200, kMultiMax = 999, kSingleMin = 10, kSingleMax = 199;

constexpr std::string_view kClassKeys[] = {"name", "extends", "capabilities", "description"};
constexpr std::string_view kRuleKeys[] = {"id",       "pattern",  "kernel",   "recipe",
                                          "modes",    "rows",     "requires", "numerics",
                                          "priority", "settings", "horizontal", "phases",
                                          "escaping", "note"};

template <std::size_t N>
bool one_of(std::string_view k, const std::string_view (&keys)[N]) {
  return std::find(std::begin(keys), std::end(keys), k) != std::end(keys);
}
template <std::size_t N>
std::string list_of(const std::string_view (&keys)[N]) {
  std::string s;
  for (std::string_view k : keys) {
    if (!s.empty()) s += ", ";
    s += k;
  }
  return s;
}

std::string kind_names() {
  std::string s;
  for (const CKernelInfo& k : ckernel_table()) {
    if (!s.empty()) s += ", ";
    s += k.name;
  }
  return s;
}

std::string template_names() {
  std::string s;
  for (std::size_t i = 0; i < static_cast<std::size_t>(KernelTemplate::kCount); ++i) {
    if (!s.empty()) s += ", ";
    s += kernel_template_name(static_cast<KernelTemplate>(i));
  }
  return s;
}

std::string recipe_names() {
  std::string s;
  for (const NamedRecipe& r : recipe_registry()) {
    if (!s.empty()) s += ", ";
    s += r.name;
  }
  return s;
}

// One parsed file, before the chain is merged.
struct ClassFile {
  std::string name;
  std::string file;
  std::string text;
  std::string extends;  // "" when the class is a root
  std::vector<std::string> capabilities;
  std::vector<Rule> rules;
};

// Errors name the file, the rule (by id, or by position before its id is known) and the key.
class Where {
 public:
  explicit Where(const std::string& file) : file_(file) {}
  void rule(std::size_t index, std::string_view id) {
    rule_ = id.empty() ? "rule #" + std::to_string(index + 1) : "rule \"" + std::string(id) + "\"";
  }
  void section(std::string s) { rule_ = std::move(s); }
  Status error(std::string_view key, std::string_view what, std::string_view fix) const {
    std::string m = file_;
    if (!rule_.empty()) m += ": " + rule_;
    if (!key.empty()) m += ": key \"" + std::string(key) + "\"";
    m += ": ";
    m += what;
    return invalid_input(m, fix);
  }

 private:
  const std::string& file_;
  std::string rule_;
};

Result<std::vector<std::string>> string_list(const toml::node& n, const Where& w,
                                             std::string_view key, bool unique) {
  const toml::array* a = n.as_array();
  if (a == nullptr) return w.error(key, "is not an array of strings", "write [\"a\", \"b\"]");
  std::vector<std::string> out;
  for (const toml::node& e : *a) {
    const auto* s = e.as_string();
    if (s == nullptr) return w.error(key, "has a non-string element", "write [\"a\", \"b\"]");
    std::string v = s->get();
    if (unique && std::find(out.begin(), out.end(), v) != out.end())
      return w.error(key, "lists \"" + v + "\" twice", "list each entry once");
    out.push_back(std::move(v));
  }
  return out;
}

Result<std::string> string_value(const toml::node& n, const Where& w, std::string_view key) {
  const auto* s = n.as_string();
  if (s == nullptr) return w.error(key, "is not a string", "write key = \"value\"");
  return s->get();
}

Result<PatternStep> parse_step(std::string_view text, const Where& w) {
  PatternStep step;
  std::string_view t = text;
  if (!t.empty() && (t.back() == '?' || t.back() == '+' || t.back() == '*')) {
    step.optional = t.back() != '+';
    step.repeated = t.back() != '?';
    t.remove_suffix(1);
  }
  if (t.empty()) return w.error("pattern", "has an empty step", "name a kind or an op");
  if (t.find("::") != std::string_view::npos) {
    if (t.find('|') != std::string_view::npos)
      return w.error("pattern", "step \"" + std::string(text) + "\" joins ops with \"|\"",
                     "\"|\" joins kinds only; write one rule per op");
    step.op = std::string(t);
    return step;
  }
  while (!t.empty()) {
    const std::size_t bar = t.find('|');
    const std::string_view name = t.substr(0, bar);
    auto it = std::find_if(ckernel_table().begin(), ckernel_table().end(),
                           [&](const CKernelInfo& k) { return k.name == name; });
    if (it == ckernel_table().end())
      return w.error("pattern", "unknown kind \"" + std::string(name) + "\"",
                     "use one of " + kind_names() +
                         ", an op name such as \"aten::relu\", or \"*\"");
    step.kinds.push_back(it->kind);
    t = bar == std::string_view::npos ? std::string_view{} : t.substr(bar + 1);
    if (bar != std::string_view::npos && t.empty())
      return w.error("pattern", "step \"" + std::string(text) + "\" ends with \"|\"",
                     "name a kind after each \"|\"");
  }
  return step;
}

bool is_wildcard(const std::vector<PatternStep>& p) {
  return p.size() == 1 && p[0].kinds.empty() && p[0].op.empty() && !p[0].optional;
}

bool valid_setting(std::string_view s) {
  const std::size_t eq = s.find('=');
  const std::string_view name = s.substr(0, eq);
  if (name.empty()) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  return eq == std::string_view::npos || eq + 1 < s.size();
}

Result<Rule> parse_rule(const toml::table& t, std::size_t index, const std::string& file,
                        Where& w) {
  Rule r;
  r.source = file;
  w.rule(index, "");
  if (const toml::node* id = t.get("id")) {
    auto s = string_value(*id, w, "id");
    if (!s.ok()) return s.status();
    r.id = *s;
    if (r.id.empty()) return w.error("id", "is empty", "give every rule a unique id");
  } else {
    return w.error("id", "is missing", "give every rule a unique id");
  }
  w.rule(index, r.id);
  for (auto&& [k, v] : t) {
    if (!one_of(k.str(), kRuleKeys))
      return w.error(k.str(), "is not a rule key", "rule keys are " + list_of(kRuleKeys));
  }
  for (std::string_view required : {"pattern", "kernel", "priority"}) {
    if (t.get(required) == nullptr)
      return w.error(required, "is missing", "every rule states pattern, kernel and priority");
  }
  // pattern
  {
    auto steps = string_list(*t.get("pattern"), w, "pattern", false);
    if (!steps.ok()) return steps.status();
    if (steps->empty()) return w.error("pattern", "is empty", "list at least one step");
    for (const std::string& s : *steps) {
      if (s == "*") {
        if (steps->size() != 1)
          return w.error("pattern", "uses \"*\" inside a longer pattern",
                         "\"*\" (any one op) is a pattern of its own: the fallback");
        r.pattern.push_back(PatternStep{});
        continue;
      }
      auto step = parse_step(s, w);
      if (!step.ok()) return step.status();
      r.pattern.push_back(*step);
    }
    if (std::all_of(r.pattern.begin(), r.pattern.end(),
                    [](const PatternStep& p) { return p.optional; }))
      return w.error("pattern", "has only optional steps", "make at least one step required");
  }
  // kernel, recipe
  {
    auto k = string_value(*t.get("kernel"), w, "kernel");
    if (!k.ok()) return k.status();
    if (!kernel_template_from_name(*k, &r.kernel))
      return w.error("kernel", "unknown template \"" + *k + "\"", "use one of " + template_names());
    if (const toml::node* rn = t.get("recipe")) {
      auto name = string_value(*rn, w, "recipe");
      if (!name.ok()) return name.status();
      r.recipe = recipe_by_name(*name);
      if (r.recipe == nullptr)
        return w.error("recipe", "unknown recipe \"" + *name + "\"",
                       "use one of " + recipe_names());
    } else if (r.kernel != KernelTemplate::Opaque && r.kernel != KernelTemplate::View) {
      return w.error("recipe", "is missing",
                     "a kernel that computes is pinned to a recipe; only opaque and view omit it");
    }
    // Note [Bit-exact fusions]: a bit-exact recipe promises ATen's bits, which a fused kernel
    // keeps only when every op still rounds in its own order: elementwise ops (and views, copies,
    // factories, the generator's draws) do; a reduction's summation order (GEMM, conv, norms,
    // softmax, losses, pooling, embedding backward, collectives) is the kernel's own.
    if (r.recipe != nullptr && r.recipe->determinism == Determinism::BitexactStrict) {
      for (const PatternStep& step : r.pattern) {
        std::vector<CKernel> kinds = step.kinds;
        if (!step.op.empty()) kinds.push_back(classify_op(step.op).kind);
        for (CKernel k : kinds) {
          if (k == CKernel::Gemm || k == CKernel::Conv || k == CKernel::Reduce ||
              k == CKernel::Norm || k == CKernel::Softmax || k == CKernel::Loss ||
              k == CKernel::Pooling || k == CKernel::Embedding || k == CKernel::Collective)
            return w.error("recipe", "is bit-exact but the pattern reduces (" +
                                         std::string(ckernel_info(k).name) + ")",
                           "pin a fusion with a reduction to an ordered recipe (f32_ordered, "
                           "f32_pairwise): see Note [Bit-exact fusions] in Rules.cpp");
        }
      }
    }
  }
  // modes
  if (const toml::node* m = t.get("modes")) {
    auto modes = string_list(*m, w, "modes", true);
    if (!modes.ok()) return modes.status();
    if (modes->empty()) return w.error("modes", "is empty", "list \"train\", \"infer\" or both");
    r.train = r.infer = false;
    for (const std::string& s : *modes) {
      if (s == "train") {
        r.train = true;
      } else if (s == "infer") {
        r.infer = true;
      } else {
        return w.error("modes", "unknown mode \"" + s + "\"", "use \"train\" and/or \"infer\"");
      }
    }
  }
  // rows
  if (const toml::node* rows = t.get("rows")) {
    const toml::array* a = rows->as_array();
    if (a == nullptr || a->size() != 2 || !(*a)[0].is_integer() || !(*a)[1].is_integer())
      return w.error("rows", "is not a pair of integers", "write rows = [min, max]");
    r.rows_min = *(*a)[0].value<std::int64_t>();
    r.rows_max = *(*a)[1].value<std::int64_t>();
    if (r.rows_min < 0 || r.rows_min > r.rows_max)
      return w.error("rows",
                     "range [" + std::to_string(r.rows_min) + ", " + std::to_string(r.rows_max) +
                         "] is empty or negative",
                     "write 0 <= min <= max");
  }
  if (const toml::node* req = t.get("requires")) {
    auto caps = string_list(*req, w, "requires", true);
    if (!caps.ok()) return caps.status();
    r.requires_caps = std::move(*caps);
  }
  if (const toml::node* num = t.get("numerics")) {
    auto s = string_value(*num, w, "numerics");
    if (!s.ok()) return s.status();
    if (*s == "reference") {
      r.numerics = Numerics::Reference;
    } else if (*s == "bit_identical") {
      r.numerics = Numerics::BitIdentical;
    } else if (*s == "differs") {
      r.numerics = Numerics::Differs;
    } else {
      return w.error("numerics", "unknown value \"" + *s + "\"",
                     "use \"reference\", \"bit_identical\" or \"differs\"");
    }
  }
  if (const toml::node* s = t.get("settings")) {
    auto settings = string_list(*s, w, "settings", true);
    if (!settings.ok()) return settings.status();
    for (const std::string& e : *settings)
      if (!valid_setting(e))
        return w.error("settings", "entry \"" + e + "\" is not a setting name",
                       "write \"name\" (must be stated) or \"name=value\" (applies only then)");
    r.settings = std::move(*settings);
  }
  if (const toml::node* ph = t.get("phases")) {
    auto phases = string_list(*ph, w, "phases", true);
    if (!phases.ok()) return phases.status();
    if (phases->empty())
      return w.error("phases", "is empty", "list \"forward\", \"backward\", \"optimizer\"");
    for (const std::string& e : *phases) {
      if (e == "forward") r.phases.push_back(record::Phase::Forward);
      else if (e == "backward") r.phases.push_back(record::Phase::Backward);
      else if (e == "optimizer") r.phases.push_back(record::Phase::Optimizer);
      else
        return w.error("phases", "has unknown phase \"" + e + "\"",
                       "use \"forward\", \"backward\" or \"optimizer\"");
    }
  }
  if (const toml::node* e = t.get("escaping")) {
    if (!e->is_boolean()) return w.error("escaping", "is not a boolean", "write escaping = false");
    r.escaping = *e->value<bool>();
  }
  if (const toml::node* h = t.get("horizontal")) {
    if (!h->is_boolean())
      return w.error("horizontal", "is not a boolean", "write horizontal = true");
    r.horizontal = *h->value<bool>();
    if (r.horizontal && is_wildcard(r.pattern))
      return w.error("horizontal", "is set on the \"*\" fallback",
                     "a horizontal rule names the ops of one member");
  }
  if (const toml::node* note = t.get("note")) {
    auto s = string_value(*note, w, "note");
    if (!s.ok()) return s.status();
  }
  // priority and its band
  {
    const toml::node& p = *t.get("priority");
    if (!p.is_integer()) return w.error("priority", "is not an integer", "write priority = 300");
    const std::int64_t v = *p.value<std::int64_t>();
    const bool wildcard = is_wildcard(r.pattern);
    std::int64_t lo = kSingleMin, hi = kSingleMax;
    std::string band = "single-op defaults take 10..199";
    if (wildcard) {
      lo = hi = 0;
      band = "the \"*\" fallback takes priority 0";
    } else if (r.pattern.size() >= 2 || r.horizontal ||
               std::any_of(r.pattern.begin(), r.pattern.end(),
                           [](const PatternStep& p) { return p.repeated; })) {
      lo = kMultiMin;
      hi = kMultiMax;
      band = "multi-op fusions take 200..999";
    }
    if (v < lo || v > hi)
      return w.error("priority", std::to_string(v) + " is outside its band",
                     band + " (see Note [Priority bands] in Rules.cpp)");
    r.priority = static_cast<std::int32_t>(v);
    if (wildcard && r.kernel != KernelTemplate::Opaque)
      return w.error("kernel", "of the \"*\" fallback is not \"opaque\"",
                     "the fallback runs any op op by op: kernel = \"opaque\"");
  }
  return r;
}

Result<ClassFile> parse_class(std::string_view name, std::string file, std::string text) {
  ClassFile c;
  c.name = std::string(name);
  c.file = std::move(file);
  c.text = std::move(text);
  Where w(c.file);
  toml::table doc;
  try {
    doc = toml::parse(c.text, c.file);
  } catch (const toml::parse_error& e) {
    std::ostringstream what;
    what << "line " << e.source().begin.line << ", column " << e.source().begin.column << ": "
         << e.description();
    return w.error("", what.str(), "fix the TOML syntax");
  }
  for (auto&& [k, v] : doc) {
    if (k.str() != "class" && k.str() != "rule")
      return w.error(k.str(), "is not a top-level key", "use [class] and [[rule]] only");
  }
  w.section("[class]");
  const toml::table* cls = doc["class"].as_table();
  if (cls == nullptr) return w.error("", "is missing", "start the file with a [class] table");
  for (auto&& [k, v] : *cls)
    if (!one_of(k.str(), kClassKeys))
      return w.error(k.str(), "is not a class key", "class keys are " + list_of(kClassKeys));
  if (const toml::node* n = cls->get("name")) {
    auto s = string_value(*n, w, "name");
    if (!s.ok()) return s.status();
    if (*s != name)
      return w.error(
          "name", "is \"" + *s + "\" but the file is loaded as class \"" + std::string(name) + "\"",
          "name the class after its file (rules/<name>.toml)");
  } else {
    return w.error("name", "is missing", "write name = \"" + std::string(name) + "\"");
  }
  if (const toml::node* n = cls->get("extends")) {
    auto s = string_value(*n, w, "extends");
    if (!s.ok()) return s.status();
    if (s->empty()) return w.error("extends", "is empty", "name a class or omit the key");
    c.extends = *s;
  }
  if (const toml::node* n = cls->get("capabilities")) {
    auto caps = string_list(*n, w, "capabilities", true);
    if (!caps.ok()) return caps.status();
    c.capabilities = std::move(*caps);
  }
  if (const toml::node* n = cls->get("description")) {
    auto s = string_value(*n, w, "description");
    if (!s.ok()) return s.status();
  }
  if (const toml::node* rules = doc.get("rule")) {
    const toml::array* a = rules->as_array();
    if (a == nullptr || !a->is_array_of_tables()) {
      w.section("");
      return w.error("rule", "is not an array of tables", "write each rule as [[rule]]");
    }
    std::set<std::string> ids;
    for (std::size_t i = 0; i < a->size(); ++i) {
      auto r = parse_rule(*(*a)[i].as_table(), i, c.file, w);
      if (!r.ok()) return r.status();
      if (!ids.insert(r->id).second)
        return w.error("id", "is used twice in this file", "give every rule a unique id");
      c.rules.push_back(std::move(*r));
    }
  }
  return c;
}

Result<RuleSet> parse_chain(std::string_view name,
                            const std::function<Result<std::string>(std::string_view)>& read_text,
                            const std::function<std::string(std::string_view)>& file_of) {
  std::vector<ClassFile> files;  // derived first
  std::string current(name), extended_by;
  for (;;) {
    for (const ClassFile& f : files) {
      if (f.name == current) {
        std::string cycle;
        for (const ClassFile& g : files) cycle += g.name + " -> ";
        cycle += current;
        return invalid_input("rules classes extend each other in a cycle: " + cycle,
                             "make one class a root (remove its extends)");
      }
    }
    auto text = read_text(current);
    if (!text.ok()) {
      std::string what = "cannot read rules class \"" + current + "\"";
      if (!extended_by.empty()) what += " (extended by \"" + extended_by + "\")";
      return invalid_input(what + ": " + message_of(text.status()),
                           "check the class name and the rules directory");
    }
    auto f = parse_class(current, file_of(current), std::move(*text));
    if (!f.ok()) return f.status();
    files.push_back(std::move(*f));
    if (files.back().extends.empty()) break;
    extended_by = current;
    current = files.back().extends;
  }
  RuleSet set;
  set.hardware = std::string(name);
  // Note [Rules digest]: SHA-256 over the chain's texts in chain order (class first), each
  // framed by its class name and byte length so that no two chains hash the same bytes.
  std::string hashed;
  for (const ClassFile& f : files) {
    set.chain.push_back(f.name);
    hashed += "class " + f.name + ' ' + std::to_string(f.text.size()) + '\n' + f.text + '\n';
  }
  set.digest = sha256_hex(hashed);
  // Merge from the root down: base rules first, a same-id rule replaces in place, new ids append;
  // capabilities accumulate (a derived class offers what its base offers, and more).
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    for (const std::string& cap : it->capabilities)
      if (std::find(set.capabilities.begin(), set.capabilities.end(), cap) ==
          set.capabilities.end())
        set.capabilities.push_back(cap);
    for (Rule& r : it->rules) {
      auto same = std::find_if(set.rules.begin(), set.rules.end(),
                               [&](const Rule& x) { return x.id == r.id; });
      if (same != set.rules.end()) {
        *same = std::move(r);
      } else {
        set.rules.push_back(std::move(r));
      }
    }
  }
  return set;
}

}  // namespace

Result<RuleSet> parse_rules(std::string_view name,
                            const std::function<Result<std::string>(std::string_view)>& read_text) {
  return parse_chain(name, read_text, [](std::string_view c) { return std::string(c) + ".toml"; });
}

Result<RuleSet> load_rules_dir(const std::string& dir, std::string_view name) {
  auto path_of = [&dir](std::string_view c) {
    return (std::filesystem::path(dir) / (std::string(c) + ".toml")).string();
  };
  auto read = [&](std::string_view c) -> Result<std::string> {
    const std::string path = path_of(c);
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::string known;
      std::error_code ec;
      std::vector<std::string> names;
      for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
      std::sort(names.begin(), names.end());
      for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
      return invalid_input(path + " does not exist or cannot be read",
                           known.empty() ? "no rules/*.toml there" : "classes there: " + known);
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  return parse_chain(name, read, path_of);
}

std::string_view numerics_name(std::uint8_t n) noexcept {
  switch (n) {
    case 0: return "reference";
    case 1: return "bit_identical";
    case 2: return "differs";
    default: return "unknown";
  }
}

// Keeps the rules that apply under the policy and the class; a rule reading a setting the policy
// does not state is an error (a rule never guesses a default).
Result<std::vector<const Rule*>> applicable_rules(const RuleSet& rules, const Policy& policy) {
  for (const std::string& id : policy.allow_differs) {
    auto it = std::find_if(rules.rules.begin(), rules.rules.end(),
                           [&](const Rule& r) { return r.id == id; });
    if (it == rules.rules.end() || it->numerics != Numerics::Differs) {
      std::string ids;
      for (const Rule& r : rules.rules)
        if (r.numerics == Numerics::Differs) ids += (ids.empty() ? "" : ", ") + r.id;
      return invalid_input("the policy allows \"differs\" rule \"" + id +
                               "\", which rules class \"" + rules.hardware + "\" does not have",
                           ids.empty() ? "this class has no differs rules: allow none"
                                       : "its differs rules are: " + ids);
    }
  }
  std::vector<const Rule*> out;
  for (const Rule& r : rules.rules) {
    if (!(policy.training ? r.train : r.infer)) continue;
    bool caps = true;
    for (const std::string& c : r.requires_caps)
      caps &= std::find(rules.capabilities.begin(), rules.capabilities.end(), c) !=
              rules.capabilities.end();
    if (!caps) continue;
    if (r.numerics == Numerics::Differs &&
        std::find(policy.allow_differs.begin(), policy.allow_differs.end(), r.id) ==
            policy.allow_differs.end())
      continue;
    bool settings_hold = true;
    for (const std::string& s : r.settings) {
      const std::size_t eq = s.find('=');
      const std::string name = s.substr(0, eq);
      auto it = policy.settings.find(name);
      if (it == policy.settings.end())
        return invalid_input("rule \"" + r.id + "\" (" + r.source + ") reads setting \"" + name +
                                 "\", which the policy does not state",
                             "state " + name +
                                 "=<value> in the policy, or remove the setting "
                                 "from the rule");
      if (eq != std::string::npos && it->second != s.substr(eq + 1)) settings_hold = false;
    }
    if (settings_hold) out.push_back(&r);
  }
  std::stable_sort(out.begin(), out.end(), [](const Rule* a, const Rule* b) {
    return a->priority != b->priority ? a->priority > b->priority : a->id < b->id;
  });
  return out;
}


}  // namespace crucible::forge
