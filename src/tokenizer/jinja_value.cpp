// Jinja values: construction, Python truthiness/equality/ordering, str()/repr()/json.dumps()
// formatting (see jinja_value.h).
#include "tokenizer/jinja_value.h"

#include "core/error.h"
#include "tokenizer/unicode.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace moet::jinja {

Value Value::none() {
  Value v;
  v.kind_ = Kind::none;
  return v;
}
Value::Value(bool b) : kind_(Kind::boolean), b_(b), i_(b) {}
Value::Value(int64_t i) : kind_(Kind::integer), i_(i) {}
Value::Value(double d) : kind_(Kind::floating), d_(d) {}
Value::Value(std::string s) : kind_(Kind::string), s_(std::move(s)) {}

Value Value::list(List items, bool tuple) {
  Value v;
  v.kind_ = Kind::list;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::generator(List items) {
  Value v = list(std::move(items));
  v.generator_ = true;
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

Value Value::dict(Dict items, bool is_namespace) {
  Value v;
  v.kind_ = Kind::dict;
  v.namespace_ = is_namespace;
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}

Value Value::function(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::function;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::undefined(std::string what) {
  Value v;
  v.s_ = std::move(what);
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [k, e] : j.items()) items.emplace_back(k, from_json(e));
      return dict(std::move(items));
    }
    default: return Value();
  }
}

int64_t Value::as_int() const { return i_; }
double Value::as_double() const { return kind_ == Kind::floating ? d_ : double(i_); }

Value* Value::find(const std::string& key) const {
  for (auto& [k, v] : *dict_)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

Value* Value::find_key(const Value& key) const {
  for (auto& [k, v] : *dict_)
    if (values_equal(k, key)) return &v;
  return nullptr;
}

void Value::set(const Value& key, Value v) const {
  if (Value* slot = find_key(key)) *slot = std::move(v);
  else dict_->emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean:
    case Kind::integer: return i_ != 0;
    case Kind::floating: return d_ != 0;
    case Kind::string: return !s_.empty();
    case Kind::list: return !list_->empty();
    case Kind::dict: return namespace_ || !dict_->empty();
    case Kind::function: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: return generator_ ? "generator" : tuple_ ? "tuple" : "list";
    case Kind::dict: return namespace_ ? "Namespace" : "dict";
    case Kind::function: return "function";
  }
  return "?";
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // e.g. "-1.2345e+05"
  const size_t e = sci.find('e');
  const int exponent = int(parse_int(sci.substr(e + 1)).value_or(0));
  std::string mantissa = sci.substr(0, e);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(size_t(-exponent - 1), '0') + digits;
    } else if (size_t(exponent) + 1 >= digits.size()) {
      out += digits + std::string(size_t(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(exponent) + 1) + "." + digits.substr(size_t(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += exponent < 0 ? "e-" : "e+";
  const std::string exp_digits = std::to_string(std::abs(exponent));
  out += (exp_digits.size() < 2 ? "0" : "") + exp_digits;
  return out;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = use_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const size_t begin = i;
    const char32_t c = tok::utf8_next(s, i);
    if (c == char32_t(quote) || c == '\\') out += '\\', out += char(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", uint32_t(c));
    else if ((c >= 0x80 && c < 0xA0) || c == 0xAD) out += fmt::format("\\x{:02x}", uint32_t(c));
    else out.append(s, begin, i - begin);
  }
  return out + quote;
}

std::string json_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const size_t begin = i;
    const char32_t c = tok::utf8_next(s, i);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", uint32_t(c));
        } else if (ensure_ascii && c >= 0x7F) {
          if (c >= 0x10000) {
            const uint32_t v = uint32_t(c) - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", uint32_t(c));
          }
        } else {
          out.append(s, begin, i - begin);
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::undefined: return "";
    case Kind::string: return s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::undefined: return "";
    case Kind::none: return "None";
    case Kind::boolean: return b_ ? "True" : "False";
    case Kind::integer: return std::to_string(i_);
    case Kind::floating: return python_float_repr(d_);
    case Kind::string: return repr_string(s_);
    case Kind::list: {
      if (generator_) return "<generator object>";
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::dict: {
      std::string out = namespace_ ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->size(); ++i)
        out += (i ? ", " : "") + (*dict_)[i].first.repr() + ": " + (*dict_)[i].second.repr();
      return out + (namespace_ ? "}>" : "}");
    }
    case Kind::function: return "<function " + s_ + ">";
  }
  return "";
}

std::string Value::to_json(int indent, bool ensure_ascii, bool sort_keys, const std::string& item_sep,
                           const std::string& key_sep) const {
  const std::string isep = !item_sep.empty() ? item_sep : indent >= 0 ? "," : ", ";
  const std::string ksep = !key_sep.empty() ? key_sep : ": ";
  std::function<std::string(const Value&, int)> dump = [&](const Value& v, int depth) -> std::string {
    const std::string nl = indent >= 0 ? "\n" + std::string(size_t(indent * (depth + 1)), ' ') : "";
    const std::string close = indent >= 0 ? "\n" + std::string(size_t(indent * depth), ' ') : "";
    switch (v.kind_) {
      case Kind::none: return "null";
      case Kind::boolean: return v.b_ ? "true" : "false";
      case Kind::integer: return std::to_string(v.i_);
      case Kind::floating:
        if (std::isnan(v.d_)) return "NaN";
        if (std::isinf(v.d_)) return v.d_ > 0 ? "Infinity" : "-Infinity";
        return python_float_repr(v.d_);
      case Kind::string: return json_string(v.s_, ensure_ascii);
      case Kind::list: {
        if (v.generator_) fail("Object of type generator is not JSON serializable");
        if (v.list_->empty()) return "[]";
        std::string out = "[" + nl;
        for (size_t i = 0; i < v.list_->size(); ++i) out += (i ? isep + nl : "") + dump((*v.list_)[i], depth + 1);
        return out + close + "]";
      }
      case Kind::dict: {
        if (v.namespace_) fail("Object of type Namespace is not JSON serializable");
        if (v.dict_->empty()) return "{}";
        Dict entries = *v.dict_;
        if (sort_keys)
          std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return values_compare(a.first, b.first) < 0; });
        std::string out = "{" + nl;
        for (size_t i = 0; i < entries.size(); ++i)
          out += (i ? isep + nl : "") + json_string(entries[i].first.is_string() ? entries[i].first.str() : entries[i].first.to_json(), ensure_ascii) + ksep + dump(entries[i].second, depth + 1);
        return out + close + "}";
      }
      default: fail("Object of type {} is not JSON serializable", v.type_name());
    }
  };
  return dump(*this, 0);
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::floating || b.kind() == Value::Kind::floating) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none: return true;
    case Value::Kind::string: return a.str() == b.str();
    case Value::Kind::list: {
      if (a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!values_equal(a.items()[i], b.items()[i])) return false;
      return true;
    }
    case Value::Kind::dict: {
      if (&a.entries() == &b.entries()) return true;
      if (a.entries().size() != b.entries().size()) return false;
      for (const auto& [k, v] : a.entries()) {
        const Value* other = b.find_key(k);
        if (!other || !values_equal(v, *other)) return false;
      }
      return true;
    }
    default: return false;
  }
}

int values_compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str() ? -1 : a.str() > b.str() ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < a.items().size() && i < b.items().size(); ++i)
      if (const int c = values_compare(a.items()[i], b.items()[i])) return c;
    return a.items().size() < b.items().size() ? -1 : a.items().size() > b.items().size() ? 1 : 0;
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

Value Args::get(size_t index, const std::string& name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keyword)
    if (k == name) return v;
  return fallback;
}

bool Args::has(size_t index, const std::string& name) const {
  if (index < positional.size()) return true;
  for (const auto& [k, v] : keyword)
    if (k == name) return true;
  return false;
}

std::optional<int64_t> parse_int(const std::string& s) {
  int64_t v = 0;
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  const auto [end, ec] = std::from_chars(begin, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || begin == end) return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& s) {
  double v = 0;
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  const auto [end, ec] = std::from_chars(begin, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || begin == end) return std::nullopt;
  return v;
}

std::u32string to_u32(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) out.push_back(tok::utf8_next(s, i));
  return out;
}

std::string from_u32(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) tok::utf8_append(out, c);
  return out;
}

bool is_py_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

}  // namespace moet::jinja
