// Values of the Jinja interpreter, modelled on the Python objects jinja2 manipulates: undefined,
// None, bool, int (int64), float, str (UTF-8), list/tuple and dict (insertion-ordered, string
// keys) with shared reference semantics, namespace (a dict whose attributes may be assigned) and
// callables (macros, globals). to_str/repr/to_json reproduce Python's str(), repr() and
// json.dumps() byte for byte for these types, so rendered prompts match jinja2.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moet::jinja {

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<Value, Value>>;  // Python dict: any hashable key
struct Args;
using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, function };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(int64_t(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(List items = {}, bool tuple = false);
  // A lazy sequence in jinja2 (map/select/... results): iterable, but no len() and no JSON.
  static Value generator(List items);
  // markupsafe.Markup: a string marked safe; concatenating a plain string to it escapes that string.
  static Value markup(std::string s);
  static Value dict(Dict items = {}, bool is_namespace = false);
  static Value function(std::string name, Function fn);
  static Value from_json(const nlohmann::ordered_json& j);
  // Undefined that remembers what was missing, for error messages.
  static Value undefined(std::string what);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_int() const { return kind_ == Kind::integer || kind_ == Kind::boolean; }  // Python: bool is an int
  bool is_number() const { return is_int() || kind_ == Kind::floating; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_markup() const { return kind_ == Kind::string && markup_; }
  bool is_list() const { return kind_ == Kind::list; }
  bool is_tuple() const { return kind_ == Kind::list && tuple_; }
  bool is_generator() const { return kind_ == Kind::list && generator_; }
  bool is_dict() const { return kind_ == Kind::dict; }
  bool is_namespace() const { return kind_ == Kind::dict && namespace_; }
  bool is_function() const { return kind_ == Kind::function; }

  bool as_bool() const { return b_; }
  int64_t as_int() const;    // bool or int
  double as_double() const;  // any number
  const std::string& str() const { return s_; }  // string value; undefined: what was missing
  List& items() const { return *list_; }
  Dict& entries() const { return *dict_; }
  const Function& fn() const { return *fn_; }

  // dict lookup by string key / by any key; nullptr when absent.
  Value* find(const std::string& key) const;
  Value* find_key(const Value& key) const;
  void set(const Value& key, Value v) const;

  bool truthy() const;
  std::string to_str() const;  // Python str()
  std::string repr() const;    // Python repr()
  // Python json.dumps(x, ensure_ascii, indent (<0: none), separators default, sort_keys).
  std::string to_json(int indent = -1, bool ensure_ascii = false, bool sort_keys = false,
                      const std::string& item_sep = "", const std::string& key_sep = "") const;
  const char* type_name() const;

 private:
  Kind kind_ = Kind::undefined;
  bool b_ = false;
  bool tuple_ = false;
  bool generator_ = false;
  bool markup_ = false;
  bool namespace_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

bool values_equal(const Value& a, const Value& b);
// -1/0/1; throws for unorderable types (like Python's TypeError).
int values_compare(const Value& a, const Value& b);
std::string python_float_repr(double d);

// Arguments of a call: positional and keyword, with helpers that check arity.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  std::string callee;
  // The index-th positional, else the keyword, else fallback.
  Value get(size_t index, const std::string& name, Value fallback = Value()) const;
  bool has(size_t index, const std::string& name) const;
};

// Whole-string decimal integer / float parsing without exceptions; nullopt when malformed or out of range.
std::optional<int64_t> parse_int(const std::string& s);
std::optional<double> parse_float(const std::string& s);

// Python string helpers on UTF-8.
std::u32string to_u32(const std::string& s);
std::string from_u32(const std::u32string& s);
bool is_py_space(char32_t c);

}  // namespace moet::jinja
