// Jinja builtins: attribute lookup, Python str/dict/list methods, filters, tests and globals
// (see jinja_builtins.h). Behaviour mirrors jinja2 3.1 filters.py/tests.py and CPython's str.
#include "tokenizer/jinja_builtins.h"

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

namespace moet::jinja {

namespace {

using Method = Value (*)(const Value& self, const Args& args);

std::string map_case(const std::string& s, bool upper) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = tok::utf8_next(s, i);
    tok::utf8_append(out, char32_t(upper ? utf8proc_toupper(utf8proc_int32_t(c)) : utf8proc_tolower(utf8proc_int32_t(c))));
  }
  return out;
}

bool is_cased_letter(char32_t c) {
  return utf8proc_toupper(utf8proc_int32_t(c)) != utf8proc_int32_t(c) ||
         utf8proc_tolower(utf8proc_int32_t(c)) != utf8proc_int32_t(c);
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string u = to_u32(s);
  const std::u32string set = chars.is_string() ? to_u32(chars.str()) : std::u32string();
  const auto strip_char = [&](char32_t c) { return chars.is_string() ? set.find(c) != std::u32string::npos : is_py_space(c); };
  size_t lo = 0, hi = u.size();
  if (left)
    while (lo < hi && strip_char(u[lo])) ++lo;
  if (right)
    while (hi > lo && strip_char(u[hi - 1])) --hi;
  return from_u32(u.substr(lo, hi - lo));
}

Value py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List parts;
  if (sep.is_none() || sep.is_undefined()) {
    const std::u32string u = to_u32(s);
    size_t i = 0;
    while (true) {
      while (i < u.size() && is_py_space(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
        size_t end = u.size();
        while (end > i && is_py_space(u[end - 1])) --end;
        parts.emplace_back(from_u32(u.substr(i, end - i)));
        break;
      }
      size_t j = i;
      while (j < u.size() && !is_py_space(u[j])) ++j;
      parts.emplace_back(from_u32(u.substr(i, j - i)));
      i = j;
    }
    return Value::list(std::move(parts));
  }
  const std::string& d = sep.str();
  if (d.empty()) fail("empty separator");
  size_t start = 0;
  while (true) {
    const size_t at = s.find(d, start);
    if (at == std::string::npos || (maxsplit >= 0 && int64_t(parts.size()) == maxsplit)) break;
    parts.emplace_back(s.substr(start, at - start));
    start = at + d.size();
  }
  parts.emplace_back(s.substr(start));
  return Value::list(std::move(parts));
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::u32string u = to_u32(s);
    int64_t done = 0;
    for (char32_t c : u) {
      if (count < 0 || done++ < count) out += repl;
      tok::utf8_append(out, c);
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += repl;
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string py_title(const std::string& s, bool capitalize_only) {
  std::string out;
  bool previous_cased = false;
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = tok::utf8_next(s, i);
    const bool upper = capitalize_only ? first : !previous_cased;
    tok::utf8_append(out, char32_t(upper ? utf8proc_toupper(utf8proc_int32_t(c)) : utf8proc_tolower(utf8proc_int32_t(c))));
    previous_cased = is_cased_letter(c);
    first = false;
  }
  return out;
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  if (affix.is_tuple() || affix.is_list()) {
    for (const auto& a : affix.items())
      if (affix_match(s, a, prefix)) return true;
    return false;
  }
  if (!affix.is_string()) fail("{}swith first arg must be str or a tuple of str", prefix ? "start" : "end");
  const std::string& a = affix.str();
  if (a.size() > s.size()) return false;
  return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
}

int64_t int_arg(const Args& args, size_t index, const std::string& name, int64_t fallback) {
  const Value v = args.get(index, name);
  if (v.is_undefined() || v.is_none()) return fallback;
  if (!v.is_int()) fail("{}() argument '{}' must be an integer", args.callee, name);
  return v.as_int();
}

const std::map<std::string, Method>& string_methods() {
  static const std::map<std::string, Method> methods = {
      {"strip", [](const Value& s, const Args& a) { return Value(py_strip(s.str(), a.get(0, "chars"), true, true)); }},
      {"lstrip", [](const Value& s, const Args& a) { return Value(py_strip(s.str(), a.get(0, "chars"), true, false)); }},
      {"rstrip", [](const Value& s, const Args& a) { return Value(py_strip(s.str(), a.get(0, "chars"), false, true)); }},
      {"split", [](const Value& s, const Args& a) { return py_split(s.str(), a.get(0, "sep"), int_arg(a, 1, "maxsplit", -1)); }},
      {"upper", [](const Value& s, const Args&) { return Value(map_case(s.str(), true)); }},
      {"lower", [](const Value& s, const Args&) { return Value(map_case(s.str(), false)); }},
      {"title", [](const Value& s, const Args&) { return Value(py_title(s.str(), false)); }},
      {"capitalize", [](const Value& s, const Args&) { return Value(py_title(s.str(), true)); }},
      {"startswith", [](const Value& s, const Args& a) { return Value(affix_match(s.str(), a.get(0, "prefix"), true)); }},
      {"endswith", [](const Value& s, const Args& a) { return Value(affix_match(s.str(), a.get(0, "suffix"), false)); }},
      {"replace", [](const Value& s, const Args& a) {
         return Value(py_replace(s.str(), a.get(0, "old").to_str(), a.get(1, "new").to_str(), int_arg(a, 2, "count", -1)));
       }},
      {"find", [](const Value& s, const Args& a) {
         const size_t at = s.str().find(a.get(0, "sub").to_str());
         return Value(at == std::string::npos ? int64_t(-1) : int64_t(to_u32(s.str().substr(0, at)).size()));
       }},
      {"count", [](const Value& s, const Args& a) {
         const std::string sub = a.get(0, "sub").to_str();
         if (sub.empty()) return Value(int64_t(to_u32(s.str()).size() + 1));
         int64_t n = 0;
         for (size_t at = s.str().find(sub); at != std::string::npos; at = s.str().find(sub, at + sub.size())) ++n;
         return Value(n);
       }},
      {"join", [](const Value& s, const Args& a) {
         std::string out;
         bool first = true;
         for (const auto& v : iterate(a.get(0, "iterable"))) {
           if (!v.is_string()) fail("sequence item: expected str instance, {} found", v.type_name());
           out += (first ? "" : s.str()) + v.str();
           first = false;
         }
         return Value(std::move(out));
       }},
      {"splitlines", [](const Value& s, const Args&) {
         List lines;
         std::string current;
         const std::string& t = s.str();
         for (size_t i = 0; i < t.size(); ++i) {
           if (t[i] == '\n' || t[i] == '\r') {
             lines.emplace_back(current);
             current.clear();
             if (t[i] == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
           } else {
             current.push_back(t[i]);
           }
         }
         if (!current.empty()) lines.emplace_back(current);
         return Value::list(std::move(lines));
       }},
      {"isdigit", [](const Value& s, const Args&) {
         return Value(!s.str().empty() && std::all_of(s.str().begin(), s.str().end(), [](char c) { return c >= '0' && c <= '9'; }));
       }},
      {"isspace", [](const Value& s, const Args&) {
         const std::u32string u = to_u32(s.str());
         return Value(!u.empty() && std::all_of(u.begin(), u.end(), is_py_space));
       }},
  };
  return methods;
}

const std::map<std::string, Method>& dict_methods() {
  static const std::map<std::string, Method> methods = {
      {"get", [](const Value& d, const Args& a) {
         const Value key = a.get(0, "key");
         const Value* v = d.find_key(key);
         return v ? *v : a.get(1, "default", Value::none());
       }},
      {"items", [](const Value& d, const Args&) {
         List out;
         for (const auto& [k, v] : d.entries()) out.push_back(Value::list({k, v}, true));
         return Value::generator(std::move(out));
       }},
      {"keys", [](const Value& d, const Args&) {
         List out;
         for (const auto& [k, v] : d.entries()) out.emplace_back(k);
         return Value::list(std::move(out));
       }},
      {"values", [](const Value& d, const Args&) {
         List out;
         for (const auto& [k, v] : d.entries()) out.push_back(v);
         return Value::list(std::move(out));
       }},
  };
  return methods;
}

const std::map<std::string, Method>& list_methods() {
  static const std::map<std::string, Method> methods = {
      {"index", [](const Value& l, const Args& a) {
         const Value x = a.get(0, "value");
         for (size_t i = 0; i < l.items().size(); ++i)
           if (values_equal(l.items()[i], x)) return Value(int64_t(i));
         fail("{} is not in list", x.repr());
       }},
      {"count", [](const Value& l, const Args& a) {
         const Value x = a.get(0, "value");
         return Value(int64_t(std::count_if(l.items().begin(), l.items().end(), [&](const Value& v) { return values_equal(v, x); })));
       }},
  };
  return methods;
}

bool is_unsafe_method(const Value& obj, const std::string& name) {
  static const char* const list_mutators[] = {"append", "pop", "extend", "insert", "remove", "clear", "sort", "reverse"};
  static const char* const dict_mutators[] = {"pop", "popitem", "setdefault", "update", "clear"};
  const auto in = [&](const auto& names) {
    return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
  };
  return (obj.is_list() && !obj.is_tuple() && in(list_mutators)) || (obj.is_dict() && !obj.is_namespace() && in(dict_mutators));
}

Value bind(const Value& self, const std::string& name, Method method) {
  return Value::function(name, [self, method](Args& args) { return method(self, args); });
}

}  // namespace

Value get_attribute(const Value& obj, const std::string& name) {
  if (is_unsafe_method(obj, name)) {
    const std::string type = obj.type_name();
    return Value::function(name, [type, name](Args&) -> Value {
      fail("access to attribute '{}' of '{}' object is unsafe.", name, type);
    });
  }
  const std::map<std::string, Method>* methods = obj.is_string() ? &string_methods()
                                                 : obj.is_namespace() ? nullptr
                                                 : obj.is_dict() ? &dict_methods()
                                                 : obj.is_list() ? &list_methods() : nullptr;
  if (methods)
    if (const auto it = methods->find(name); it != methods->end()) return bind(obj, name, it->second);
  if (obj.is_dict())
    if (const Value* v = obj.find(name)) return *v;
  return Value::undefined(name);
}

int64_t value_length(const Value& v) {
  if (v.is_string()) return int64_t(to_u32(v.str()).size());
  if (v.is_generator()) fail("object of type 'generator' has no len()");
  if (v.is_list()) return int64_t(v.items().size());
  if (v.is_dict()) return int64_t(v.entries().size());
  if (v.is_undefined()) return 0;
  fail("object of type '{}' has no len()", v.type_name());
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_dict()) {
    if (const Value* v = obj.find_key(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && key.is_int()) {
    const int64_t n = value_length(obj);
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (obj.is_list()) return obj.items()[size_t(i)];
      return Value(from_u32(std::u32string(1, to_u32(obj.str())[size_t(i)])));
    }
    return Value::undefined(fmt::format("{} index out of range", obj.type_name()));
  }
  if (key.is_string()) return get_attribute(obj, key.str());
  return Value::undefined(fmt::format("{} has no item {}", obj.type_name(), key.repr()));
}

Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (!obj.is_list() && !obj.is_string()) fail("'{}' object is not subscriptable", obj.type_name());
  const int64_t n = value_length(obj);
  const int64_t st = step.is_int() ? step.as_int() : 1;
  if (st == 0) fail("slice step cannot be zero");
  const auto clamp = [&](const Value& v, int64_t fallback) {
    if (!v.is_int()) return fallback;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t lo = clamp(start, st > 0 ? 0 : n - 1), hi = clamp(stop, st > 0 ? n : -1);
  std::vector<size_t> picks;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) picks.push_back(size_t(i));
  if (obj.is_list()) {
    List out;
    for (size_t i : picks) out.push_back(obj.items()[i]);
    return Value::list(std::move(out));
  }
  const std::u32string u = to_u32(obj.str());
  std::u32string out;
  for (size_t i : picks) out.push_back(u[i]);
  return Value(from_u32(out));
}

List iterate(const Value& v) {
  if (v.is_list()) return v.items();
  if (v.is_dict()) {
    List keys;
    for (const auto& [k, e] : v.entries()) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    List chars;
    for (char32_t c : to_u32(v.str())) chars.emplace_back(from_u32(std::u32string(1, c)));
    return chars;
  }
  if (v.is_undefined()) return {};
  fail("'{}' object is not iterable", v.type_name());
}

void add_globals(Dict& globals) {
  globals.emplace_back("range", Value::function("range", [](Args& a) {
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) stop = int_arg(a, 0, "stop", 0);
    else start = int_arg(a, 0, "start", 0), stop = int_arg(a, 1, "stop", 0), step = int_arg(a, 2, "step", 1);
    if (step == 0) fail("range() arg 3 must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 100000) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      out.emplace_back(i);
    }
    return Value::list(std::move(out));
  }));
  const auto make_dict = [](bool ns) {
    return [ns](Args& a) {
      Value d = Value::dict({}, ns);
      if (!a.positional.empty() && a.positional[0].is_dict())
        for (const auto& [k, v] : a.positional[0].entries()) d.set(k, v);
      for (const auto& [k, v] : a.keyword) d.set(k, v);
      return d;
    };
  };
  globals.emplace_back("dict", Value::function("dict", make_dict(false)));
  globals.emplace_back("namespace", Value::function("namespace", make_dict(true)));
  globals.emplace_back("raise_exception", Value::function("raise_exception", [](Args& a) -> Value {
    fail("{}", a.get(0, "message").to_str());
  }));
  globals.emplace_back("strftime_now", Value::function("strftime_now", [](Args& a) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buffer[256];
    const size_t n = std::strftime(buffer, sizeof(buffer), a.get(0, "format").to_str().c_str(), &local);
    return Value(std::string(buffer, n));
  }));
}

}  // namespace moet::jinja
