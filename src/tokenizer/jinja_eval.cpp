// Jinja interpreter (see jinja_eval.h).
#include "tokenizer/jinja_eval.h"

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"

#include <cmath>
#include <map>

namespace moet::jinja {

namespace {

// An error that already carries its template position.
class PositionedError : public Error {
 public:
  using Error::Error;
};

enum class Flow { normal, break_, continue_ };

constexpr int kMaxCallDepth = 200;
// Total loop iterations one render may run: a guard against templates that would never finish.
constexpr int64_t kMaxLoopIterations = 10'000'000;

class Interpreter {
 public:
  Interpreter(const Template& tmpl, Dict variables) : tmpl_(tmpl) {
    auto root = std::make_shared<Frame>();
    Dict globals;
    add_globals(globals);
    for (auto& [k, v] : globals) (*root)[k.str()] = std::move(v);
    for (auto& [k, v] : variables) (*root)[k.to_str()] = std::move(v);
    scopes_.push_back(root);
  }

  std::string run() {
    std::string out;
    exec(tmpl_.body, out);
    return out;
  }

 private:
  using Frame = std::map<std::string, Value>;

  [[noreturn]] void error_at(size_t pos, const std::string& message) const {
    throw PositionedError(fmt::format("{}: {}", source_location(tmpl_.source, pos), message));
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (const auto found = (*it)->find(name); found != (*it)->end()) return found->second;
    return Value::undefined(name);
  }

  void assign(const std::string& target, Value value, size_t pos) {
    const size_t dot = target.find('.');
    if (dot == std::string::npos) {
      (*scopes_.back())[target] = std::move(value);
      return;
    }
    const Value ns = lookup(target.substr(0, dot));
    if (!ns.is_namespace()) error_at(pos, "can only assign attributes of a namespace()");
    ns.set(target.substr(dot + 1), std::move(value));
  }

  void assign_targets(const std::vector<std::string>& targets, const Value& value, size_t pos) {
    if (targets.size() == 1) {
      assign(targets[0], value, pos);
      return;
    }
    const List items = iterate(value);
    if (items.size() != targets.size())
      error_at(pos, fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i], pos);
  }

  Flow exec(const Body& body, std::string& out) {
    for (const auto& s : body)
      if (const Flow f = exec_one(*s, out); f != Flow::normal) return f;
    return Flow::normal;
  }

  Flow exec_one(const Stmt& s, std::string& out) {
    try {
      return exec_statement(s, out);
    } catch (const PositionedError&) {
      throw;
    } catch (const Error& err) {
      error_at(s.pos, err.what());
    }
  }

  Flow exec_statement(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::text: out += s.text; return Flow::normal;
      case Stmt::Kind::output: out += eval(*s.expr).to_str(); return Flow::normal;
      case Stmt::Kind::if_:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond).truthy()) return exec(body, out);
        return exec(s.else_body, out);
      case Stmt::Kind::for_: return exec_for(s, out);
      case Stmt::Kind::set: assign_targets(s.targets, eval(*s.expr), s.pos); return Flow::normal;
      case Stmt::Kind::set_block: {
        Value captured(capture(s.body));
        if (s.expr) captured = eval_with_body(*s.expr, std::move(captured));
        assign_targets(s.targets, captured, s.pos);
        return Flow::normal;
      }
      case Stmt::Kind::macro: define_macro(s); return Flow::normal;
      case Stmt::Kind::filter_block: out += eval_with_body(*s.expr, Value(capture(s.body))).to_str(); return Flow::normal;
      case Stmt::Kind::scope: return exec(s.body, out);
      case Stmt::Kind::break_: return Flow::break_;
      case Stmt::Kind::continue_: return Flow::continue_;
    }
    return Flow::normal;
  }

  std::string capture(const Body& body) {
    std::string out;
    exec(body, out);
    return out;
  }

  Value eval_with_body(const Expr& chain, Value body) {
    scopes_.push_back(std::make_shared<Frame>(Frame{{" body", std::move(body)}}));
    Value result = eval(chain);
    scopes_.pop_back();
    return result;
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    List items = iterate(eval(*s.expr));
    if (s.loop_filter) {
      List kept;
      for (auto& item : items) {
        scopes_.push_back(std::make_shared<Frame>());
        assign_targets(s.targets, item, s.pos);
        const bool keep = eval(*s.loop_filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(s.else_body, out);
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      if (++iterations_ > kMaxLoopIterations) error_at(s.pos, "template exceeded the loop iteration budget");
      scopes_.push_back(std::make_shared<Frame>());
      Dict loop{{"index", Value(i + 1)},      {"index0", Value(i)},         {"revindex", Value(n - i)},
                {"revindex0", Value(n - i - 1)}, {"first", Value(i == 0)},  {"last", Value(i == n - 1)},
                {"length", Value(n)},          {"depth", Value(1)},         {"depth0", Value(0)}};
      if (i > 0) loop.emplace_back("previtem", items[size_t(i - 1)]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[size_t(i + 1)]);
      loop.emplace_back("cycle", Value::function("cycle", [i](Args& a) {
                          if (a.positional.empty()) fail("no items for cycling given");
                          return a.positional[size_t(i) % a.positional.size()];
                        }));
      (*scopes_.back())["loop"] = Value::dict(std::move(loop));
      assign_targets(s.targets, items[size_t(i)], s.pos);
      const Flow f = exec(s.body, out);
      scopes_.pop_back();
      if (f == Flow::break_) break;
    }
    return Flow::normal;
  }

  void define_macro(const Stmt& s) {
    const Stmt* macro = &s;
    (*scopes_.back())[s.text] = Value::function(s.text, [this, macro](Args& args) {
      if (++depth_ > kMaxCallDepth) error_at(macro->pos, "maximum macro recursion depth exceeded");
      auto frame = std::make_shared<Frame>();
      for (size_t i = 0; i < macro->params.size(); ++i) {
        const auto& [name, fallback] = macro->params[i];
        if (args.has(i, name)) (*frame)[name] = args.get(i, name);
        else (*frame)[name] = fallback ? eval(*fallback) : Value::undefined(name);
      }
      List varargs;
      for (size_t i = macro->params.size(); i < args.positional.size(); ++i) varargs.push_back(args.positional[i]);
      (*frame)["varargs"] = Value::list(std::move(varargs));
      std::vector<std::shared_ptr<Frame>> saved = {scopes_.front(), frame};
      std::swap(saved, scopes_);
      std::string out;
      try {
        exec(macro->body, out);
      } catch (...) {
        std::swap(saved, scopes_);
        --depth_;
        throw;
      }
      std::swap(saved, scopes_);
      --depth_;
      return Value(std::move(out));
    });
  }

  Args eval_args(const CallArgs& call, const std::string& callee) {
    Args args;
    args.callee = callee;
    for (const auto& e : call.positional) args.positional.push_back(eval(*e));
    for (const auto& [k, e] : call.keyword) args.keyword.emplace_back(k, eval(*e));
    return args;
  }

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const PositionedError&) {
      throw;
    } catch (const Error& err) {
      error_at(e.pos, err.what());
    }
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: return lookup(e.name);
      case Expr::Kind::attr: {
        const Value obj = eval(*e.a);
        if (obj.is_undefined()) fail("'{}' is undefined", obj.str());
        Value v = get_attribute(obj, e.name);
        return v.is_undefined() ? Value::undefined(fmt::format("{} object has no attribute '{}'", obj.type_name(), e.name)) : v;
      }
      case Expr::Kind::item: {
        const Value obj = eval(*e.a);
        if (obj.is_undefined()) fail("'{}' is undefined", obj.str());
        return get_item(obj, eval(*e.b));
      }
      case Expr::Kind::slice: {
        const Value obj = eval(*e.a);
        return slice_value(obj, e.b ? eval(*e.b) : Value::none(), e.c ? eval(*e.c) : Value::none(),
                           e.items.empty() ? Value::none() : eval(*e.items[0]));
      }
      case Expr::Kind::call: {
        const Value callee = eval(*e.a);
        if (callee.is_undefined()) fail("'{}' is undefined", callee.str());
        if (!callee.is_function()) fail("'{}' object is not callable", callee.type_name());
        Args args = eval_args(e.args, callee.str());
        return callee.fn()(args);
      }
      case Expr::Kind::filter: {
        const Value input = eval(*e.a);
        return apply_filter(e.name, input, eval_args(e.args, e.name));
      }
      case Expr::Kind::test: {
        const Value input = eval(*e.a);
        return Value(apply_test(e.name, input, eval_args(e.args, e.name)) != e.negated);
      }
      case Expr::Kind::unary: {
        const Value v = eval(*e.a);
        if (e.name == "not") return Value(!v.truthy());
        if (!v.is_number()) fail("bad operand type for unary {}: '{}'", e.name, v.type_name());
        if (e.name == "+") return v;
        return v.kind() == Value::Kind::floating ? Value(-v.as_double()) : Value(-v.as_int());
      }
      case Expr::Kind::binary: return eval_binary(e);
      case Expr::Kind::cond:
        if (eval(*e.a).truthy()) return eval(*e.b);
        return e.c ? eval(*e.c) : Value::undefined("conditional expression");
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        List items;
        for (const auto& item : e.items) items.push_back(eval(*item));
        return Value::list(std::move(items), e.kind == Expr::Kind::tuple);
      }
      case Expr::Kind::dict: {
        Value d = Value::dict();
        for (size_t i = 0; i < e.keys.size(); ++i) {
          const Value key = eval(*e.keys[i]);
          d.set(key, eval(*e.items[i]));
        }
        return d;
      }
    }
    return Value();
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    const Value a = eval(*e.a);
    if (op == "and") return a.truthy() ? eval(*e.b) : a;
    if (op == "or") return a.truthy() ? a : eval(*e.b);
    const Value b = eval(*e.b);
    if (op == "==") return Value(values_equal(a, b));
    if (op == "!=") return Value(!values_equal(a, b));
    if (op == "<") return Value(values_compare(a, b) < 0);
    if (op == "<=") return Value(values_compare(a, b) <= 0);
    if (op == ">") return Value(values_compare(a, b) > 0);
    if (op == ">=") return Value(values_compare(a, b) >= 0);
    if (op == "in" || op == "not in") return Value(contains(b, a) == (op == "in"));
    if (op == "~") return Value(a.to_str() + b.to_str());  // str_join: autoescape is off
    if (op == "+" && a.is_string() && b.is_string()) return concat(a, b);
    if (a.is_undefined() || b.is_undefined()) fail("'{}' is undefined", (a.is_undefined() ? a : b).str());
    return arithmetic(op, a, b);
  }

  // String concatenation with markupsafe's rule: if either side is Markup, the other is escaped.
  static Value concat(const Value& a, const Value& b) {
    if (!a.is_markup() && !b.is_markup()) return Value(a.str() + b.str());
    const auto escaped = [](const Value& v) { return apply_filter("escape", v, Args{}).str(); };
    return Value::markup(escaped(a) + escaped(b));
  }

  static bool contains(const Value& container, const Value& item) {
    if (container.is_string()) {
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not {}", item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    }
    if (container.is_dict()) return container.find_key(item) != nullptr;
    for (const auto& v : iterate(container))
      if (values_equal(v, item)) return true;
    return false;
  }

  static Value arithmetic(const std::string& op, const Value& a, const Value& b) {
    if (op == "%" && a.is_string()) return percent_format(a.str(), b.is_tuple() ? b.items() : List{b});
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
      if (a.is_list() && b.is_list()) {
        List items = a.items();
        items.insert(items.end(), b.items().begin(), b.items().end());
        return Value::list(std::move(items));
      }
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.is_int()) {
      if (a.is_string()) {
        std::string out;
        for (int64_t i = 0; i < b.as_int() && out.size() < (1u << 24); ++i) out += a.str();
        return Value(std::move(out));
      }
      List items;
      for (int64_t i = 0; i < b.as_int() && items.size() < (1u << 20); ++i)
        items.insert(items.end(), a.items().begin(), a.items().end());
      return Value::list(std::move(items));
    }
    if (!a.is_number() || !b.is_number())
      fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
    const bool floating = a.kind() == Value::Kind::floating || b.kind() == Value::Kind::floating;
    const double x = a.as_double(), y = b.as_double();
    if (op == "/") {
      if (y == 0) fail("division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail("integer division or modulo by zero");
      if (!floating) {
        const int64_t p = a.as_int(), q = b.as_int();
        int64_t quotient = p / q, rest = p % q;
        if (rest != 0 && ((rest < 0) != (q < 0))) --quotient, rest += q;
        return Value(op == "//" ? quotient : rest);
      }
      const double quotient = std::floor(x / y);
      return Value(op == "//" ? quotient : x - quotient * y);
    }
    if (op == "**") {
      if (!floating && b.as_int() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.as_int() && i < 64; ++i) r *= a.as_int();
        return Value(r);
      }
      return Value(std::pow(x, y));
    }
    if (!floating) {
      if (op == "+") return Value(a.as_int() + b.as_int());
      if (op == "-") return Value(a.as_int() - b.as_int());
      if (op == "*") return Value(a.as_int() * b.as_int());
    }
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    fail("unsupported operator {}", op);
  }

  // Python's "fmt" % args for %s, %d, %r and %%.
  static Value percent_format(const std::string& format, const List& args) {
    std::string out;
    size_t next = 0;
    for (size_t i = 0; i < format.size(); ++i) {
      if (format[i] != '%' || i + 1 >= format.size()) {
        out.push_back(format[i]);
        continue;
      }
      const char spec = format[++i];
      if (spec == '%') {
        out.push_back('%');
        continue;
      }
      if (next >= args.size()) fail("not enough arguments for format string");
      const Value& v = args[next++];
      if (spec == 's') out += v.to_str();
      else if (spec == 'r') out += v.repr();
      else if (spec == 'd' && v.is_number()) out += std::to_string(int64_t(v.as_double()));
      else fail("unsupported format character '{}'", spec);
    }
    if (next != args.size()) fail("not all arguments converted during string formatting");
    return Value(std::move(out));
  }

  const Template& tmpl_;
  std::vector<std::shared_ptr<Frame>> scopes_;
  int depth_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace

std::string render_template(const Template& tmpl, Dict variables) {
  return Interpreter(tmpl, std::move(variables)).run();
}

}  // namespace moet::jinja
