// Syntax tree of a Jinja template. Expressions and statements are plain structs with a kind tag
// and child pointers; every node keeps the byte offset it came from so the interpreter can report
// errors as line:column. Trees are immutable after parsing and may be rendered concurrently.
#pragma once

#include "tokenizer/jinja_value.h"

#include <memory>
#include <string>
#include <vector>

namespace moet::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct CallArgs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct Expr {
  enum class Kind {
    literal,    // value
    name,       // name
    attr,       // a.name
    item,       // a[b]
    slice,      // a[b:c:d] (children may be null)
    call,       // a(args)
    filter,     // a | name(args)
    test,       // a is [not] name(args)
    unary,      // op a   ("not", "-", "+")
    binary,     // a op b (arithmetic, comparison, in, not in, and, or, ~)
    cond,       // b if a else c
    list,       // [items]
    tuple,      // (items)
    dict,       // {keys[i]: items[i]}
  };
  Kind kind;
  size_t pos = 0;
  Value value;
  std::string name;  // name / attribute / filter / test / operator
  bool negated = false;
  ExprPtr a, b, c;
  CallArgs args;
  std::vector<ExprPtr> items, keys;
};

struct Stmt {
  enum class Kind { text, output, if_, for_, set, set_block, macro, filter_block, scope, break_, continue_ };
  Kind kind;
  size_t pos = 0;
  std::string text;                        // text
  ExprPtr expr;                            // output, set value, for iterable, filter_block (filter chain on a placeholder)
  std::vector<std::pair<ExprPtr, Body>> branches;  // if / elif
  Body body, else_body;
  std::vector<std::string> targets;        // for / set names ("a.b" for namespace attribute)
  ExprPtr loop_filter;                     // for ... if cond
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
};

struct Template {
  std::string source;
  Body body;
};

// Parses source with HF's settings (trim_blocks, lstrip_blocks, keep_trailing_newline=False).
// Throws moet::Error "line L, column C: message" for syntax errors and unknown filters/tests.
std::shared_ptr<const Template> parse_template(std::string source);
// "line L, column C" of a byte offset.
std::string source_location(const std::string& source, size_t pos);
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

}  // namespace moet::jinja
