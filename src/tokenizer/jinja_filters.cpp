// jinja2's filters and tests over interpreter values (see jinja_builtins.h). Signatures and
// defaults follow jinja2 3.1 (e.g. sort/dictsort/unique are case-insensitive by default) and HF's
// tojson override (json.dumps with ensure_ascii=False, indent, separators, sort_keys).
#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace moet::jinja {

namespace {

using Filter = Value (*)(const Value& input, const Args& args);
using Test = bool (*)(const Value& input, const Args& args);

// attribute="a.b" or an integer index path, as jinja2's make_attrgetter.
Value attribute_path(const Value& v, const Value& path) {
  if (path.is_int()) return get_item(v, path);
  Value current = v;
  std::string p = path.to_str();
  size_t start = 0;
  while (true) {
    const size_t dot = p.find('.', start);
    const std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    const auto index = numeric ? parse_int(part) : std::nullopt;
    current = index ? get_item(current, Value(*index)) : get_item(current, Value(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

Value call_method(const Value& self, const char* name, Args args = {}) {
  args.callee = name;
  return get_attribute(self, name).fn()(args);
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return apply_filter("lower", v, Args{});
  return v;
}

List sorted(List items, bool reverse, bool case_sensitive, const Value& attribute) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : items) {
    const Value key = attribute.is_undefined() || attribute.is_none() ? item : attribute_path(item, attribute);
    keyed.emplace_back(sort_key(key, case_sensitive), std::move(item));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? values_compare(b.first, a.first) < 0 : values_compare(a.first, b.first) < 0;
  });
  List out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

Args shifted(const Args& args, size_t from) {
  Args out;
  out.callee = args.callee;
  for (size_t i = from; i < args.positional.size(); ++i) out.positional.push_back(args.positional[i]);
  out.keyword = args.keyword;
  return out;
}

// select/reject (by_attribute=false) and selectattr/rejectattr (true).
Value select_items(const Value& input, const Args& args, bool by_attribute, bool keep) {
  const size_t test_index = by_attribute ? 1 : 0;
  const bool has_test = args.positional.size() > test_index;
  const std::string test = has_test ? args.positional[test_index].to_str() : "";
  const Args test_args = shifted(args, test_index + 1);
  List out;
  for (const auto& item : input.truthy() ? iterate(input) : List{}) {  // jinja2: "if value: for item in value"
    const Value v = by_attribute ? attribute_path(item, args.get(0, "attribute")) : item;
    const bool passed = has_test ? apply_test(test, v, test_args) : v.truthy();
    if (passed == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

std::string indent_text(const std::string& text, const Value& width, bool first, bool blank) {
  const std::string pad = width.is_string() ? width.str() : std::string(size_t(width.is_int() ? width.as_int() : 4), ' ');
  std::vector<std::string> lines;
  std::string s = text + "\n";
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) out += "\n" + ((blank || !lines[i].empty()) ? pad + lines[i] : lines[i]);
  return first ? pad + out : out;
}

Value to_int(const Value& v, const Value& fallback) {
  if (v.is_int()) return Value(v.as_int());
  if (v.kind() == Value::Kind::floating) return Value(int64_t(v.as_double()));
  if (v.is_string()) {
    const std::string s = apply_filter("trim", v, Args{}).str();
    if (const auto i = parse_int(s)) return Value(*i);
    if (const auto d = parse_float(s); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) return Value(int64_t(*d));
  }
  return fallback;
}

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = {
      {"abs", [](const Value& v, const Args&) {
         if (!v.is_number()) fail("bad operand type for abs(): '{}'", v.type_name());
         return v.kind() == Value::Kind::floating ? Value(std::fabs(v.as_double())) : Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
       }},
      {"attr", [](const Value& v, const Args& a) { return get_attribute(v, a.get(0, "name").to_str()); }},
      {"capitalize", [](const Value& v, const Args&) { return call_method(Value(v.to_str()), "capitalize"); }},
      {"count", [](const Value& v, const Args&) { return Value(value_length(v)); }},
      {"default", [](const Value& v, const Args& a) {
         const bool boolean = a.get(1, "boolean", Value(false)).truthy();
         return (v.is_undefined() || (boolean && !v.truthy())) ? a.get(0, "default_value", Value("")) : v;
       }},
      {"dictsort", [](const Value& v, const Args& a) {
         if (!v.is_dict()) fail("dictsort expects a dict");
         const bool by_value = a.get(1, "by", Value("key")).to_str() == "value";
         List pairs;
         for (const auto& [k, e] : v.entries()) pairs.push_back(Value::list({k, e}, true));
         return Value::list(sorted(std::move(pairs), a.get(2, "reverse", Value(false)).truthy(),
                                   a.get(0, "case_sensitive", Value(false)).truthy(), Value(int64_t(by_value ? 1 : 0))));
       }},
      {"escape", [](const Value& v, const Args&) {
         if (v.is_markup()) return v;
         std::string out;
         for (char c : v.to_str()) {
           switch (c) {
             case '&': out += "&amp;"; break;
             case '<': out += "&lt;"; break;
             case '>': out += "&gt;"; break;
             case '"': out += "&#34;"; break;
             case '\'': out += "&#39;"; break;
             default: out.push_back(c);
           }
         }
         return Value::markup(std::move(out));
       }},
      {"first", [](const Value& v, const Args&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("first of empty sequence") : items.front();
       }},
      {"float", [](const Value& v, const Args& a) {
         if (v.is_number()) return Value(v.as_double());
         if (const auto d = parse_float(apply_filter("trim", v, Args{}).str())) return Value(*d);
         return a.get(0, "default", Value(0.0));
       }},
      {"indent", [](const Value& v, const Args& a) {
         return Value(indent_text(v.to_str(), a.get(0, "width", Value(int64_t(4))), a.get(1, "first", Value(false)).truthy(),
                                  a.get(2, "blank", Value(false)).truthy()));
       }},
      {"int", [](const Value& v, const Args& a) { return to_int(v, a.get(0, "default", Value(int64_t(0)))); }},
      {"items", [](const Value& v, const Args&) {
         if (v.is_undefined()) return Value::list();
         if (!v.is_dict()) fail("items filter expects a mapping, got {}", v.type_name());
         return call_method(v, "items");
       }},
      {"join", [](const Value& v, const Args& a) {
         const std::string sep = a.get(0, "d", Value("")).to_str();
         const Value attribute = a.get(1, "attribute");
         std::string out;
         bool first = true;
         for (const auto& item : iterate(v)) {
           out += (first ? "" : sep) + (attribute.is_undefined() ? item : attribute_path(item, attribute)).to_str();
           first = false;
         }
         return Value(std::move(out));
       }},
      {"last", [](const Value& v, const Args&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("last of empty sequence") : items.back();
       }},
      {"length", [](const Value& v, const Args&) { return Value(value_length(v)); }},
      {"list", [](const Value& v, const Args&) { return Value::list(iterate(v)); }},
      {"lower", [](const Value& v, const Args&) { return call_method(Value(v.to_str()), "lower"); }},
      {"map", [](const Value& v, const Args& a) {
         List out;
         const bool by_attribute = a.has(9999, "attribute");
         for (const auto& item : v.truthy() ? iterate(v) : List{}) {
           if (by_attribute) {
             Value got = attribute_path(item, a.get(9999, "attribute"));
             out.push_back(got.is_undefined() && a.has(9999, "default") ? a.get(9999, "default") : got);
           } else {
             if (a.positional.empty()) fail("map requires a filter name or attribute=");
             out.push_back(apply_filter(a.positional[0].to_str(), item, shifted(a, 1)));
           }
         }
         return Value::generator(std::move(out));
       }},
      {"max", [](const Value& v, const Args& a) {
         List items = sorted(iterate(v), true, a.get(0, "case_sensitive", Value(false)).truthy(), a.get(1, "attribute"));
         return items.empty() ? Value::undefined("max of empty sequence") : items.front();
       }},
      {"min", [](const Value& v, const Args& a) {
         List items = sorted(iterate(v), false, a.get(0, "case_sensitive", Value(false)).truthy(), a.get(1, "attribute"));
         return items.empty() ? Value::undefined("min of empty sequence") : items.front();
       }},
      {"reject", [](const Value& v, const Args& a) { return select_items(v, a, false, false); }},
      {"rejectattr", [](const Value& v, const Args& a) { return select_items(v, a, true, false); }},
      {"replace", [](const Value& v, const Args& a) {
         return call_method(Value(v.to_str()), "replace", a);
       }},
      {"reverse", [](const Value& v, const Args&) {
         if (v.is_string()) return slice_value(v, Value::none(), Value::none(), Value(int64_t(-1)));
         List items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::generator(std::move(items));
       }},
      {"round", [](const Value& v, const Args& a) {
         if (!v.is_number()) fail("round expects a number");
         const double scale = std::pow(10.0, double(a.get(0, "precision", Value(int64_t(0))).as_int()));
         const std::string method = a.get(1, "method", Value("common")).to_str();
         const double x = v.as_double() * scale;
         const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
         return Value(r / scale);
       }},
      {"safe", [](const Value& v, const Args&) { return Value::markup(v.to_str()); }},
      {"select", [](const Value& v, const Args& a) { return select_items(v, a, false, true); }},
      {"selectattr", [](const Value& v, const Args& a) { return select_items(v, a, true, true); }},
      {"sort", [](const Value& v, const Args& a) {
         return Value::list(sorted(iterate(v), a.get(0, "reverse", Value(false)).truthy(),
                                   a.get(1, "case_sensitive", Value(false)).truthy(), a.get(2, "attribute")));
       }},
      {"string", [](const Value& v, const Args&) { return Value(v.to_str()); }},
      {"sum", [](const Value& v, const Args& a) {
         Value total = a.get(1, "start", Value(int64_t(0)));
         const Value attribute = a.get(0, "attribute");
         for (const auto& item : iterate(v)) {
           const Value x = attribute.is_undefined() ? item : attribute_path(item, attribute);
           if (!x.is_number() || !total.is_number()) fail("unsupported operand type(s) for +");
           total = (x.kind() == Value::Kind::floating || total.kind() == Value::Kind::floating)
                       ? Value(total.as_double() + x.as_double()) : Value(total.as_int() + x.as_int());
         }
         return total;
       }},
      {"title", [](const Value& v, const Args&) { return call_method(Value(v.to_str()), "title"); }},
      {"tojson", [](const Value& v, const Args& a) {
         const Value indent = a.get(1, "indent");
         const Value separators = a.get(2, "separators");
         std::string item_sep, key_sep;
         if (separators.is_list() && separators.items().size() == 2) {
           item_sep = separators.items()[0].to_str();
           key_sep = separators.items()[1].to_str();
         }
         return Value(v.to_json(indent.is_int() ? int(indent.as_int()) : -1, a.get(0, "ensure_ascii", Value(false)).truthy(),
                                a.get(3, "sort_keys", Value(false)).truthy(), item_sep, key_sep));
       }},
      {"trim", [](const Value& v, const Args& a) {
         return call_method(Value(v.to_str()), "strip", Args{{a.get(0, "chars", Value::none())}, {}, ""});
       }},
      {"unique", [](const Value& v, const Args& a) {
         const bool case_sensitive = a.get(0, "case_sensitive", Value(false)).truthy();
         const Value attribute = a.get(1, "attribute");
         List out, seen;
         for (const auto& item : iterate(v)) {
           const Value key = sort_key(attribute.is_undefined() ? item : attribute_path(item, attribute), case_sensitive);
           if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); })) {
             seen.push_back(key);
             out.push_back(item);
           }
         }
         return Value::generator(std::move(out));
       }},
      {"upper", [](const Value& v, const Args&) { return call_method(Value(v.to_str()), "upper"); }},
      {"wordcount", [](const Value& v, const Args&) {
         return Value(value_length(call_method(Value(v.to_str()), "split")));
       }},
  };
  return table;
}

const std::map<std::string, Filter>& filter_aliases() {
  static const std::map<std::string, Filter> table = {
      {"d", filters().at("default")}, {"e", filters().at("escape")}};
  return table;
}

const std::map<std::string, Test>& tests() {
  static const std::map<std::string, Test> table = {
      {"boolean", [](const Value& v, const Args&) { return v.is_bool(); }},
      {"callable", [](const Value& v, const Args&) { return v.is_function(); }},
      {"defined", [](const Value& v, const Args&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, const Args&) { return v.is_undefined(); }},
      {"divisibleby", [](const Value& v, const Args& a) {
         const Value d = a.get(0, "num");
         return v.is_int() && d.is_int() && d.as_int() != 0 && v.as_int() % d.as_int() == 0;
       }},
      {"eq", [](const Value& v, const Args& a) { return values_equal(v, a.get(0, "other")); }},
      {"ne", [](const Value& v, const Args& a) { return !values_equal(v, a.get(0, "other")); }},
      {"lt", [](const Value& v, const Args& a) { return values_compare(v, a.get(0, "other")) < 0; }},
      {"le", [](const Value& v, const Args& a) { return values_compare(v, a.get(0, "other")) <= 0; }},
      {"gt", [](const Value& v, const Args& a) { return values_compare(v, a.get(0, "other")) > 0; }},
      {"ge", [](const Value& v, const Args& a) { return values_compare(v, a.get(0, "other")) >= 0; }},
      {"even", [](const Value& v, const Args&) { return v.is_int() && v.as_int() % 2 == 0; }},
      {"odd", [](const Value& v, const Args&) { return v.is_int() && v.as_int() % 2 != 0; }},
      {"false", [](const Value& v, const Args&) { return v.is_bool() && !v.as_bool(); }},
      {"true", [](const Value& v, const Args&) { return v.is_bool() && v.as_bool(); }},
      {"float", [](const Value& v, const Args&) { return v.kind() == Value::Kind::floating; }},
      {"integer", [](const Value& v, const Args&) { return v.is_int(); }},
      {"in", [](const Value& v, const Args& a) {
         const Value c = a.get(0, "seq");
         if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
         if (c.is_dict()) return c.find_key(v) != nullptr;
         const List items = iterate(c);
         return std::any_of(items.begin(), items.end(), [&](const Value& x) { return values_equal(x, v); });
       }},
      {"iterable", [](const Value& v, const Args&) { return v.is_list() || v.is_dict() || v.is_string(); }},
      {"lower", [](const Value& v, const Args&) { return v.is_string() && apply_filter("lower", v, Args{}).str() == v.str(); }},
      {"upper", [](const Value& v, const Args&) { return v.is_string() && apply_filter("upper", v, Args{}).str() == v.str(); }},
      {"mapping", [](const Value& v, const Args&) { return v.is_dict() && !v.is_namespace(); }},
      {"none", [](const Value& v, const Args&) { return v.is_none(); }},
      {"number", [](const Value& v, const Args&) { return v.is_number(); }},
      {"sameas", [](const Value& v, const Args& a) {
         const Value o = a.get(0, "other");
         if (v.is_list() && o.is_list()) return &v.items() == &o.items();
         if (v.is_dict() && o.is_dict()) return &v.entries() == &o.entries();
         return (v.is_none() && o.is_none()) || (v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool());
       }},
      {"sequence", [](const Value& v, const Args&) { return (v.is_list() && !v.is_generator()) || v.is_dict() || v.is_string(); }},
      {"string", [](const Value& v, const Args&) { return v.is_string(); }},
  };
  return table;
}

const std::map<std::string, std::string>& test_aliases() {
  static const std::map<std::string, std::string> table = {
      {"==", "eq"}, {"equalto", "eq"}, {"!=", "ne"}, {"<", "lt"}, {"lessthan", "lt"}, {"<=", "le"},
      {">", "gt"},  {"greaterthan", "gt"}, {">=", "ge"}};
  return table;
}

}  // namespace

bool is_known_filter(const std::string& name) { return filters().count(name) || filter_aliases().count(name); }
bool is_known_test(const std::string& name) { return tests().count(name) || test_aliases().count(name); }

Value apply_filter(const std::string& name, const Value& input, const Args& args) {
  if (const auto it = filters().find(name); it != filters().end()) return it->second(input, args);
  if (const auto it = filter_aliases().find(name); it != filter_aliases().end()) return it->second(input, args);
  fail("no filter named '{}'", name);
}

bool apply_test(const std::string& name, const Value& input, const Args& args) {
  const auto alias = test_aliases().find(name);
  const std::string& real = alias == test_aliases().end() ? name : alias->second;
  if (const auto it = tests().find(real); it != tests().end()) return it->second(input, args);
  fail("no test named '{}'", name);
}

}  // namespace moet::jinja
