// Jinja builtins used by the interpreter: attribute/item access with Python's lookup order and
// ImmutableSandboxedEnvironment's rules (methods that mutate lists/dicts are refused), string /
// dict / list methods, jinja2's filters and tests, and the globals HF provides (range, dict,
// namespace, raise_exception, strftime_now). Errors are thrown as moet::Error without position;
// the interpreter adds line and column.
#pragma once

#include "tokenizer/jinja_value.h"

#include <string>

namespace moet::jinja {

// obj.name: attribute (a bound method for str/dict/list) first, then item; undefined if absent.
Value get_attribute(const Value& obj, const std::string& name);
// obj[key]: item first, then attribute for string keys; undefined if absent.
Value get_item(const Value& obj, const Value& key);
Value apply_filter(const std::string& name, const Value& input, const Args& args);
bool apply_test(const std::string& name, const Value& input, const Args& args);
// Adds the global functions to a variable table.
void add_globals(Dict& globals);
// Python slicing of a list or string.
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);
// len() of a string (code points), list or dict.
int64_t value_length(const Value& v);
// Iteration as jinja2 does it: list items, dict keys, string characters; undefined/none -> empty.
List iterate(const Value& v);

}  // namespace moet::jinja
