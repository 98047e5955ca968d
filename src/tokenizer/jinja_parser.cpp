// Recursive-descent parser for Jinja templates, following jinja2/parser.py's grammar and operator
// precedence: conditional > or > and > not > comparison/in/is > + - > ~ > * / // % > ** > unary >
// postfix (.attr, [item], (call)) and filters. Statements: if/elif/else, for (with unpacking, loop
// filter, else), set (names, tuples, namespace attributes, block form), macro, filter blocks,
// generation (HF's extension, rendered as its body), break/continue (loopcontrols).
#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <set>

namespace moet::jinja {

std::string source_location(const std::string& source, size_t pos) {
  pos = std::min(pos, source.size());
  const size_t line = size_t(std::count(source.begin(), source.begin() + long(pos), '\n')) + 1;
  const size_t line_begin = source.rfind('\n', pos == 0 ? 0 : pos - 1);
  const size_t column = pos - (line_begin == std::string::npos || pos == 0 ? 0 : line_begin + 1) + 1;
  return fmt::format("line {}, column {}", line, column);
}

namespace {

class Parser {
 public:
  Parser(const std::string& source, std::vector<Token> tokens) : src_(source), tokens_(std::move(tokens)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (peek().kind != Token::Kind::eof) error(peek().pos, "unexpected tag");
    return body;
  }

 private:
  [[noreturn]] void error(size_t pos, const std::string& message) const {
    fail("{}: {}", source_location(src_, pos), message);
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::Kind::eof: return "end of template";
      case Token::Kind::block_end: return "end of statement block";
      case Token::Kind::var_end: return "end of print statement";
      case Token::Kind::string: return "string";
      default: return "'" + t.text + "'";
    }
  }
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(index_ + ahead, tokens_.size() - 1)]; }
  const Token& next() { return tokens_[std::min(index_++, tokens_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::op && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::name && peek(ahead).text == name;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++index_;
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    ++index_;
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) error(peek().pos, fmt::format("expected '{}'", op));
  }
  void expect_name(const char* name) {
    if (!accept_name(name)) error(peek().pos, fmt::format("expected '{}'", name));
  }
  std::string expect_identifier() {
    if (peek().kind != Token::Kind::name) error(peek().pos, "expected a name");
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != Token::Kind::block_end) error(peek().pos, "expected end of statement block");
    ++index_;
  }

  // Parses statements until a block tag whose keyword is in `ends` (left unconsumed, positioned
  // at the keyword) or the end of input.
  Body parse_body(const std::set<std::string>& ends) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == Token::Kind::eof) {
        if (!ends.empty()) error(t.pos, fmt::format("unexpected end of template, expected '{}'", *ends.begin()));
        return body;
      }
      if (t.kind == Token::Kind::text) {
        auto s = std::make_unique<Stmt>(Stmt{Stmt::Kind::text, t.pos});
        s->text = t.text;
        body.push_back(std::move(s));
        ++index_;
      } else if (t.kind == Token::Kind::var_begin) {
        ++index_;
        auto s = std::make_unique<Stmt>(Stmt{Stmt::Kind::output, t.pos});
        s->expr = parse_tuple();
        if (peek().kind != Token::Kind::var_end) error(peek().pos, "expected '}}'");
        ++index_;
        body.push_back(std::move(s));
      } else if (t.kind == Token::Kind::block_begin) {
        if (peek(1).kind == Token::Kind::name && ends.count(peek(1).text)) {
          ++index_;
          return body;
        }
        ++index_;
        body.push_back(parse_statement());
      } else {
        error(t.pos, "unexpected token");
      }
    }
  }

  StmtPtr parse_statement() {
    const DepthGuard guard(*this, peek().pos);
    const Token& t = peek();
    if (t.kind != Token::Kind::name) error(t.pos, "expected a statement name");
    const std::string keyword = next().text;
    if (keyword == "if") return parse_if(t.pos);
    if (keyword == "for") return parse_for(t.pos);
    if (keyword == "set") return parse_set(t.pos);
    if (keyword == "macro") return parse_macro(t.pos);
    if (keyword == "filter") return parse_filter_block(t.pos);
    if (keyword == "generation") return parse_scope(t.pos, "endgeneration");
    if (keyword == "break" || keyword == "continue") {
      expect_block_end();
      return std::make_unique<Stmt>(Stmt{keyword == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, t.pos});
    }
    error(t.pos, fmt::format("unknown tag '{}'", keyword));
  }

  // jinja2 reports unknown filters/tests at compile time, except inside an if statement, where
  // the error is deferred to the moment they run.
  StmtPtr parse_if(size_t pos) {
    ++if_depth_;
    StmtPtr s = parse_if_branches(pos);
    --if_depth_;
    return s;
  }

  StmtPtr parse_if_branches(size_t pos) {
    auto s = std::make_unique<Stmt>(Stmt{Stmt::Kind::if_, pos});
    ExprPtr cond = parse_expression();
    expect_block_end();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      const std::string keyword = next().text;
      if (keyword == "elif") {
        cond = parse_expression();
        expect_block_end();
        continue;
      }
      if (keyword == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"});
        next();
      }
      expect_block_end();
      return s;
    }
  }

  StmtPtr parse_for(size_t pos) {
    auto s = std::make_unique<Stmt>(Stmt{Stmt::Kind::for_, pos});
    do {
      s->targets.push_back(expect_identifier());
    } while (accept_op(","));
    expect_name("in");
    s->expr = parse_tuple(/*no_conditional=*/true);
    if (accept_name("if")) s->loop_filter = parse_expression();
    if (accept_name("recursive")) error(pos, "recursive loops are not supported");
    expect_block_end();
    s->body = parse_body({"else", "endfor"});
    if (next().text == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"});
      next();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(size_t pos) {
    std::vector<std::string> targets;
    do {
      std::string target = expect_identifier();
      if (accept_op(".")) target += "." + expect_identifier();
      targets.push_back(std::move(target));
    } while (accept_op(","));
    if (accept_op("=")) {
      auto s = std::make_unique<Stmt>(Stmt{Stmt::Kind::set, pos});
      s->targets = std::move(targets);
      s->expr = parse_tuple();
      expect_block_end();
      return s;
    }
    auto s = std::make_unique<Stmt>(Stmt{Stmt::Kind::set_block, pos});
    s->targets = std::move(targets);
    if (is_op("|")) s->expr = parse_filters(placeholder(pos));
    expect_block_end();
    s->body = parse_body({"endset"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(size_t pos) {
    auto s = std::make_unique<Stmt>(Stmt{Stmt::Kind::macro, pos});
    s->text = expect_identifier();
    expect_op("(");
    while (!accept_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (accept_op(")")) break;
      std::string name = expect_identifier();
      ExprPtr fallback = accept_op("=") ? parse_expression() : nullptr;
      s->params.emplace_back(std::move(name), std::move(fallback));
    }
    expect_block_end();
    s->body = parse_body({"endmacro"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(size_t pos) {
    auto s = std::make_unique<Stmt>(Stmt{Stmt::Kind::filter_block, pos});
    s->expr = parse_filters(placeholder(pos), /*leading_pipe=*/false);
    expect_block_end();
    s->body = parse_body({"endfilter"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_scope(size_t pos, const char* end) {
    auto s = std::make_unique<Stmt>(Stmt{Stmt::Kind::scope, pos});
    expect_block_end();
    s->body = parse_body({end});
    next();
    expect_block_end();
    return s;
  }

  static ExprPtr make(Expr::Kind kind, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  // The value a filter block / set block feeds into its filter chain ("caller" output).
  static ExprPtr placeholder(size_t pos) {
    auto e = make(Expr::Kind::name, pos);
    e->name = " body";
    return e;
  }

  // expression ("," expression)* -> tuple when a comma is present.
  ExprPtr parse_tuple(bool no_conditional = false) {
    const size_t pos = peek().pos;
    ExprPtr first = no_conditional ? parse_or() : parse_expression();
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::tuple, pos);
    t->items.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == Token::Kind::block_end || peek().kind == Token::Kind::var_end || is_op(")")) break;
      t->items.push_back(no_conditional ? parse_or() : parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto c = make(Expr::Kind::cond, next().pos);
      c->a = parse_or();
      c->b = std::move(e);
      if (accept_name("else")) c->c = parse_expression();
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, size_t pos) {
    auto e = make(Expr::Kind::binary, pos);
    e->name = op;
    e->a = std::move(left);
    e->b = std::move(right);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t pos = next().pos;
      e = binary("or", std::move(e), parse_and(), pos);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t pos = next().pos;
      e = binary("and", std::move(e), parse_not(), pos);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto e = make(Expr::Kind::unary, next().pos);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      const size_t pos = peek().pos;
      std::string op;
      if (peek().kind == Token::Kind::op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == "<=" ||
           peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (accept_name("in")) {
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        index_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = binary(op, std::move(e), parse_math1(), pos);
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.text, std::move(e), parse_concat(), t.pos);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const size_t pos = next().pos;
      e = binary("~", std::move(e), parse_math2(), pos);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t.text, std::move(e), parse_pow(), t.pos);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary();
    while (is_op("**")) {
      const size_t pos = next().pos;
      e = binary("**", std::move(e), parse_unary(), pos);
    }
    return e;
  }

  // Bounds recursion so hostile input cannot overflow the stack (jinja2 would hit Python's limit).
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser, size_t pos) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.error(pos, "template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };
  static constexpr int kMaxNesting = 200;

  ExprPtr parse_unary(bool with_filter = true) {
    const DepthGuard guard(*this, peek().pos);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(Expr::Kind::unary, t.pos);
      e->name = t.text;
      e->a = parse_unary(false);
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = next();
    switch (t.kind) {
      case Token::Kind::name: {
        auto e = make(Expr::Kind::literal, t.pos);
        if (t.text == "true" || t.text == "True") e->value = Value(true);
        else if (t.text == "false" || t.text == "False") e->value = Value(false);
        else if (t.text == "none" || t.text == "None") e->value = Value::none();
        else {
          e->kind = Expr::Kind::name;
          e->name = t.text;
        }
        return e;
      }
      case Token::Kind::string: {
        auto e = make(Expr::Kind::literal, t.pos);
        std::string s = t.text;
        while (peek().kind == Token::Kind::string) s += next().text;
        e->value = Value(std::move(s));
        return e;
      }
      case Token::Kind::integer: {
        auto e = make(Expr::Kind::literal, t.pos);
        const auto value = parse_int(t.text);
        if (!value) error(t.pos, "integer literal out of range");
        e->value = Value(*value);
        return e;
      }
      case Token::Kind::floating: {
        auto e = make(Expr::Kind::literal, t.pos);
        const auto value = parse_float(t.text);
        if (!value) error(t.pos, "float literal out of range");
        e->value = Value(*value);
        return e;
      }
      case Token::Kind::op:
        if (t.text == "(") {
          if (accept_op(")")) return make(Expr::Kind::tuple, t.pos);
          ExprPtr inner = parse_tuple();
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          auto e = make(Expr::Kind::list, t.pos);
          while (!accept_op("]")) {
            if (!e->items.empty()) expect_op(",");
            if (accept_op("]")) break;
            e->items.push_back(parse_expression());
          }
          return e;
        }
        if (t.text == "{") {
          auto e = make(Expr::Kind::dict, t.pos);
          while (!accept_op("}")) {
            if (!e->items.empty()) expect_op(",");
            if (accept_op("}")) break;
            e->keys.push_back(parse_expression());
            expect_op(":");
            e->items.push_back(parse_expression());
          }
          return e;
        }
        break;
      default: break;
    }
    error(t.pos, fmt::format("unexpected {}", describe(t)));
  }

  void parse_call_args(CallArgs& args) {
    while (!accept_op(")")) {
      if (!args.positional.empty() || !args.keyword.empty()) expect_op(",");
      if (accept_op(")")) break;
      if (peek().kind == Token::Kind::name && is_op("=", 1)) {
        std::string name = next().text;
        next();
        args.keyword.emplace_back(std::move(name), parse_expression());
      } else {
        if (!args.keyword.empty()) error(peek().pos, "positional argument follows keyword argument");
        args.positional.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const size_t pos = peek().pos;
      if (accept_op(".")) {
        const Token& t = next();
        if (t.kind == Token::Kind::name) {
          auto a = make(Expr::Kind::attr, pos);
          a->name = t.text;
          a->a = std::move(e);
          e = std::move(a);
        } else if (t.kind == Token::Kind::integer) {
          auto a = make(Expr::Kind::item, pos);
          a->a = std::move(e);
          a->b = make(Expr::Kind::literal, t.pos);
          const auto index = parse_int(t.text);
          if (!index) error(t.pos, "integer literal out of range");
          a->b->value = Value(*index);
          e = std::move(a);
        } else {
          error(t.pos, "expected an attribute name");
        }
      } else if (accept_op("[")) {
        e = parse_subscript(std::move(e), pos);
      } else if (accept_op("(")) {
        auto c = make(Expr::Kind::call, pos);
        c->a = std::move(e);
        parse_call_args(c->args);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, size_t pos) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!accept_op("]")) {
      if (accept_op(":")) {
        is_slice = true;
        if (++part > 2) error(peek().pos, "too many ':' in slice");
        continue;
      }
      if (parts[part]) error(peek().pos, "expected ']'");
      parts[part] = parse_expression();
    }
    auto e = make(is_slice ? Expr::Kind::slice : Expr::Kind::item, pos);
    e->a = std::move(target);
    if (!is_slice && !parts[0]) error(pos, "empty subscript");
    if (is_slice) {
      e->b = std::move(parts[0]);
      e->c = std::move(parts[1]);
      if (parts[2]) e->items.push_back(std::move(parts[2]));
    } else {
      e->b = std::move(parts[0]);
    }
    return e;
  }

  ExprPtr parse_filters(ExprPtr e, bool leading_pipe = true) {
    while (true) {
      if (leading_pipe && accept_op("|")) {
      } else if (!leading_pipe) {
        leading_pipe = true;
      } else if (is_name("is")) {
        const size_t pos = next().pos;
        auto t = make(Expr::Kind::test, pos);
        t->negated = accept_name("not");
        t->name = expect_identifier();
        if (if_depth_ == 0 && !is_known_test(t->name)) error(pos, fmt::format("no test named '{}'", t->name));
        t->a = std::move(e);
        if (accept_op("(")) {
          parse_call_args(t->args);
        } else if (starts_test_argument()) {
          t->args.positional.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
        continue;
      } else {
        return e;
      }
      const size_t pos = peek().pos;
      auto f = make(Expr::Kind::filter, pos);
      f->name = expect_identifier();
      if (if_depth_ == 0 && !is_known_filter(f->name)) error(pos, fmt::format("no filter named '{}'", f->name));
      f->a = std::move(e);
      if (accept_op("(")) parse_call_args(f->args);
      e = std::move(f);
    }
  }

  bool starts_test_argument() const {
    const Token& t = peek();
    if (t.kind == Token::Kind::name)
      return t.text != "else" && t.text != "or" && t.text != "and" && t.text != "if" && t.text != "in" && t.text != "not" && t.text != "is";
    if (t.kind == Token::Kind::string || t.kind == Token::Kind::integer || t.kind == Token::Kind::floating) return true;
    return t.kind == Token::Kind::op && (t.text == "[" || t.text == "{");
  }

  const std::string& src_;
  std::vector<Token> tokens_;
  size_t index_ = 0;
  int if_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

std::shared_ptr<const Template> parse_template(std::string source) {
  auto t = std::make_shared<Template>();
  t->source = normalize_source(source);
  Parser parser(t->source, lex_template(t->source));
  t->body = parser.parse_all();
  return t;
}

}  // namespace moet::jinja
