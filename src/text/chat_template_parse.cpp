// chat_template_parse.cpp: the parser of the chat-template renderer (chat_template.h). It follows
// jinja2's grammar and precedence (or < and < not < comparisons < + - < ~ < * / // % < ** < unary
// - + < filters, tests, calls < attribute/subscript), its statements (if/elif/else, for with
// else and an `if` filter, set incl. namespace attributes and block set, macro, with,
// break/continue, generation) and its compile-time checks (unknown filters and tests fail unless
// inside an if or an inline if-expression).
#include <fmt/format.h>

#include <algorithm>

#include "text/chat_template_ast.h"
#include "runtime/error.h"

namespace qshard::jinja {
namespace {

using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;

class Parser {
 public:
  Parser(const Program& p, std::vector<Token> toks) : p_(p), t_(std::move(toks)) {}

  Body parse_template() {
    std::string end;
    Body b = parse_body({}, &end);
    return b;
  }

 private:
  const Token& cur() const { return t_[k_]; }
  const Token& peek() const { return t_[std::min(k_ + 1, t_.size() - 1)]; }
  void advance() {
    if (k_ + 1 < t_.size()) ++k_;
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().type == Tok::kName && cur().text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::kData: return "template data";
      case Tok::kVarBegin: return "'{{'";
      case Tok::kVarEnd: return "end of print statement '}}'";
      case Tok::kBlockBegin: return "'{%'";
      case Tok::kBlockEnd: return "end of statement block '%}'";
      case Tok::kName: return "'" + t.text + "'";
      case Tok::kString: return "string literal";
      case Tok::kInt:
      case Tok::kFloat: return "number " + t.text;
      case Tok::kOp: return "'" + t.text + "'";
      case Tok::kEof: return "end of template";
    }
    return "token";
  }
  [[noreturn]] void fail(const std::string& msg) const { throw InputError(p_.where(cur().offset) + ": " + msg); }
  [[noreturn]] void fail_expected(const std::string& what) const { fail("expected " + what + ", got " + describe(cur())); }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail_expected("'" + std::string(op) + "'");
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail_expected("a name");
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail_expected(what);
    advance();
  }
  // Appends a kid (null allowed: an omitted part) and keeps e.height; the tree is built bottom-up,
  // so no node taller than kMaxExprDepth is ever made (evaluating, checking and destroying the tree
  // recurse along its height).
  void add_kid(Expr& e, ExprPtr kid) {
    if (kid) {
      if (kid->height + 1 > kMaxExprDepth) {
        throw InputError(p_.where(kid->offset) + fmt::format(": expression nested deeper than {} levels", kMaxExprDepth));
      }
      e.height = std::max(e.height, kid->height + 1);
    }
    e.kids.push_back(std::move(kid));
  }
  // One level of parser recursion (statements in statements, parentheses, `not`, unary signs,
  // else-ifs): fails past kMaxParseNesting, naming what nests.
  class Nest {
   public:
    Nest(Parser& p, int& counter, const char* what) : n_(counter) {
      if (++n_ > kMaxParseNesting) {
        --n_;
        p.fail(fmt::format("{} nested deeper than {} levels", what, kMaxParseNesting));
      }
    }
    ~Nest() { --n_; }

   private:
    int& n_;
  };
  ExprPtr mk(ExprOp op, size_t offset) const {
    auto e = std::make_unique<Expr>();
    e->op = op;
    e->offset = offset;
    return e;
  }
  StmtPtr mks(StmtOp op, size_t offset) const {
    auto s = std::make_unique<Stmt>();
    s->op = op;
    s->offset = offset;
    return s;
  }

  // ---- statements ----

  // Data, prints and statements until a `{% name %}` with name in `ends` (consumed, in *found).
  Body parse_body(const std::vector<std::string_view>& ends, std::string* found) {
    Nest nest(*this, body_nesting_, "statements");
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.type == Tok::kData) {
        auto s = mks(StmtOp::kText, t.offset);
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == Tok::kVarBegin) {
        auto s = mks(StmtOp::kEmit, t.offset);
        advance();
        s->exprs.push_back(parse_tuple(false, true, {}, false));
        expect(Tok::kVarEnd, "end of print statement '}}'");
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        advance();
        if (cur().type != Tok::kName) fail_expected("a statement name");
        const std::string name = cur().text;
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
          *found = name;
          advance();
          return body;
        }
        body.push_back(parse_statement(ends));
        expect(Tok::kBlockEnd, "end of statement block '%}'");
      } else {  // kEof
        if (!ends.empty()) fail("unexpected end of template, expected " + list_names(ends));
        return body;
      }
    }
  }
  static std::string list_names(const std::vector<std::string_view>& names) {
    std::string s;
    for (size_t i = 0; i < names.size(); ++i) s += (i ? (i + 1 == names.size() ? " or '" : ", '") : "'") + std::string(names[i]) + "'";
    return s;
  }
  // `%}` then a body up to one of `ends`.
  Body parse_block(const std::vector<std::string_view>& ends, std::string* found) {
    skip_op(":");
    expect(Tok::kBlockEnd, "end of statement block '%}'");
    return parse_body(ends, found);
  }

  StmtPtr parse_statement(const std::vector<std::string_view>& outer_ends) {
    const std::string name = cur().text;
    const size_t at = cur().offset;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "with") return parse_with();
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail("'" + name + "' outside of a loop");
      advance();
      return mks(name == "break" ? StmtOp::kBreak : StmtOp::kContinue, at);
    }
    if (name == "generation") {
      advance();
      auto s = mks(StmtOp::kScoped, at);
      std::string end;
      s->bodies.push_back(parse_block({"endgeneration"}, &end));
      return s;
    }
    static const char* const kUnsupported[] = {"include", "extends", "import", "from", "block", "call", "filter", "autoescape", "do"};
    for (const char* u : kUnsupported) {
      if (name == u) fail("unsupported statement '" + name + "'");
    }
    if (name.rfind("end", 0) == 0 || name == "else" || name == "elif") {
      fail("unexpected '" + name + "'" + (outer_ends.empty() ? std::string() : " (expected " + list_names(outer_ends) + ")"));
    }
    fail("unknown statement '" + name + "'");
  }

  StmtPtr parse_if() {
    auto s = mks(StmtOp::kIf, cur().offset);
    advance();
    for (;;) {
      s->exprs.push_back(parse_tuple(false, false, {}, false));
      std::string end;
      s->bodies.push_back(parse_block({"elif", "else", "endif"}, &end));
      if (end == "elif") continue;
      if (end == "else") s->bodies.push_back(parse_block({"endif"}, &end));
      return s;
    }
  }

  StmtPtr parse_for() {
    auto s = mks(StmtOp::kFor, cur().offset);
    advance();
    s->targets.push_back(parse_assign_target({"in"}, false));
    if (!skip_name("in")) fail_expected("'in'");
    s->exprs.push_back(parse_tuple(false, false, {"recursive"}, false));
    s->exprs.push_back(skip_name("if") ? parse_expression(true) : nullptr);
    if (is_name("recursive")) fail("recursive loops are not supported");
    std::string end;
    ++loop_depth_;
    s->bodies.push_back(parse_block({"endfor", "else"}, &end));
    --loop_depth_;
    s->bodies.emplace_back();
    if (end == "else") s->bodies.back() = parse_block({"endfor"}, &end);
    return s;
  }

  StmtPtr parse_set() {
    const size_t at = cur().offset;
    advance();
    Target target = parse_assign_target({}, true);
    if (skip_op("=")) {
      auto s = mks(StmtOp::kSet, at);
      s->targets.push_back(std::move(target));
      s->exprs.push_back(parse_tuple(false, true, {}, false));
      return s;
    }
    if (is_op("|")) fail("filters on a block set are not supported");
    auto s = mks(StmtOp::kSetBlock, at);
    s->targets.push_back(std::move(target));
    std::string end;
    s->bodies.push_back(parse_block({"endset"}, &end));
    return s;
  }

  StmtPtr parse_macro() {
    auto s = mks(StmtOp::kMacro, cur().offset);
    advance();
    s->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      s->params.push_back(expect_name());
      s->exprs.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    expect_op(")");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    s->bodies.push_back(parse_block({"endmacro"}, &end));
    loop_depth_ = saved;
    return s;
  }

  StmtPtr parse_with() {
    auto s = mks(StmtOp::kWith, cur().offset);
    advance();
    while (cur().type != Tok::kBlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(parse_assign_target({}, false));
      expect_op("=");
      s->exprs.push_back(parse_expression(true));
    }
    std::string end;
    s->bodies.push_back(parse_block({"endwith"}, &end));
    return s;
  }

  Target parse_assign_target(const std::vector<std::string_view>& extra_end, bool with_namespace) {
    Target t;
    if (with_namespace && cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == ".") {
      t.names.push_back(expect_name());
      advance();
      t.attr = expect_name();
      return t;
    }
    const size_t at = cur().offset;
    ExprPtr e = parse_tuple(true, false, extra_end, false);
    auto add = [&](const Expr& x) {
      if (x.op != ExprOp::kName) throw InputError(p_.where(x.offset) + ": can only assign to names here");
      t.names.push_back(x.name);
    };
    if (e->op == ExprOp::kTuple) {
      t.unpack = true;
      for (const auto& k : e->kids) add(*k);
    } else {
      add(*e);
    }
    for (const auto& n : t.names) {
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None") {
        throw InputError(p_.where(at) + ": cannot assign to '" + n + "'");
      }
    }
    return t;
  }

  // ---- expressions ----

  bool is_tuple_end(const std::vector<std::string_view>& extra_end) const {
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || cur().type == Tok::kEof || is_op(")")) return true;
    return cur().type == Tok::kName && std::find(extra_end.begin(), extra_end.end(), cur().text) != extra_end.end();
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string_view>& extra_end, bool explicit_parens) {
    const size_t at = cur().offset;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    for (;;) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail_expected("an expression");
    }
    auto e = mk(ExprOp::kTuple, at);
    for (auto& a : args) add_kid(*e, std::move(a));
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    Nest nest(*this, nesting_, "expressions");
    const size_t at = cur().offset;
    ExprPtr e = parse_or();
    while (skip_name("if")) {
      auto c = mk(ExprOp::kCond, at);
      ExprPtr test = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_condexpr() : nullptr;
      add_kid(*c, std::move(e));
      add_kid(*c, std::move(test));
      add_kid(*c, std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary_node(ExprOp op, size_t at, ExprPtr a, ExprPtr b) {
    auto e = mk(op, at);
    add_kid(*e, std::move(a));
    add_kid(*e, std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t at = cur().offset;
      advance();
      e = binary_node(ExprOp::kOr, at, std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t at = cur().offset;
      advance();
      e = binary_node(ExprOp::kAnd, at, std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(*this, nesting_, "expressions");
      auto e = mk(ExprOp::kNot, cur().offset);
      advance();
      add_kid(*e, parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const size_t at = cur().offset;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      CmpOp op;
      if (is_op("==")) op = CmpOp::kEq;
      else if (is_op("!=")) op = CmpOp::kNe;
      else if (is_op("<")) op = CmpOp::kLt;
      else if (is_op("<=")) op = CmpOp::kLe;
      else if (is_op(">")) op = CmpOp::kGt;
      else if (is_op(">=")) op = CmpOp::kGe;
      else if (is_name("in")) op = CmpOp::kIn;
      else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") op = CmpOp::kNotIn, advance();
      else break;
      advance();
      if (!cmp) {
        cmp = mk(ExprOp::kCompare, at);
        add_kid(*cmp, std::move(first));
      }
      cmp->cmps.push_back(op);
      add_kid(*cmp, parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr arith(BinOp op, size_t at, ExprPtr a, ExprPtr b) {
    auto e = binary_node(ExprOp::kBinary, at, std::move(a), std::move(b));
    e->bin = op;
    return e;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const BinOp op = is_op("+") ? BinOp::kAdd : BinOp::kSub;
      const size_t at = cur().offset;
      advance();
      e = arith(op, at, std::move(e), parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    const size_t at = cur().offset;
    ExprPtr e = parse_math2();
    if (!is_op("~")) return e;
    auto c = mk(ExprOp::kConcat, at);
    add_kid(*c, std::move(e));
    while (skip_op("~")) add_kid(*c, parse_math2());
    return c;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    for (;;) {
      BinOp op;
      if (is_op("*")) op = BinOp::kMul;
      else if (is_op("/")) op = BinOp::kDiv;
      else if (is_op("//")) op = BinOp::kFloorDiv;
      else if (is_op("%")) op = BinOp::kMod;
      else return e;
      const size_t at = cur().offset;
      advance();
      e = arith(op, at, std::move(e), parse_pow());
    }
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const size_t at = cur().offset;
      advance();
      e = arith(BinOp::kPow, at, std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = mk(is_op("-") ? ExprOp::kNeg : ExprOp::kPos, cur().offset);
      advance();
      Nest nest(*this, nesting_, "expressions");
      add_kid(*e, parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    Nest nest(*this, nesting_, "expressions");
    const Token& t = cur();
    const size_t at = t.offset;
    if (t.type == Tok::kName) {
      auto e = mk(ExprOp::kConst, at);
      if (t.text == "true" || t.text == "True") e->value = Value::boolean(true);
      else if (t.text == "false" || t.text == "False") e->value = Value::boolean(false);
      else if (t.text == "none" || t.text == "None") e->value = Value::none();
      else e->op = ExprOp::kName, e->name = t.text;
      advance();
      return e;
    }
    if (t.type == Tok::kString) {
      std::string v;
      while (cur().type == Tok::kString) {
        v += cur().text;
        advance();
      }
      auto e = mk(ExprOp::kConst, at);
      e->value = Value::string(std::move(v));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      auto e = mk(ExprOp::kConst, at);
      e->value = t.type == Tok::kInt ? Value::integer(t.ival) : Value::real(t.fval);
      advance();
      return e;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = mk(ExprOp::kList, at);
      while (!is_op("]")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("]")) break;
        add_kid(*e, parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (skip_op("{")) {
      auto e = mk(ExprOp::kDict, at);
      while (!is_op("}")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("}")) break;
        add_kid(*e, parse_expression(true));
        expect_op(":");
        add_kid(*e, parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    fail_expected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".") || is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const size_t at = cur().offset;
    if (skip_op(".")) {
      if (cur().type == Tok::kName) {
        auto e = mk(ExprOp::kGetAttr, at);
        e->name = cur().text;
        advance();
        add_kid(*e, std::move(obj));
        return e;
      }
      if (cur().type != Tok::kInt) fail_expected("a name or a number after '.'");
      auto e = mk(ExprOp::kGetItem, at);
      auto key = mk(ExprOp::kConst, cur().offset);
      key->value = Value::integer(cur().ival);
      advance();
      add_kid(*e, std::move(obj));
      add_kid(*e, std::move(key));
      return e;
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.size() != 1) {  // x[] and x[a, b] subscript with a tuple, as jinja2 does
      auto key = mk(ExprOp::kTuple, at);
      for (auto& a : args) {
        if (a->op == ExprOp::kSlice) fail("slices inside a tuple subscript are not supported");
        add_kid(*key, std::move(a));
      }
      auto e = mk(ExprOp::kGetItem, at);
      add_kid(*e, std::move(obj));
      add_kid(*e, std::move(key));
      return e;
    }
    if (args[0]->op == ExprOp::kSlice) {
      auto slice = mk(ExprOp::kSlice, at);
      add_kid(*slice, std::move(obj));
      for (size_t k = 1; k < args[0]->kids.size(); ++k) add_kid(*slice, std::move(args[0]->kids[k]));
      return slice;
    }
    auto e = mk(ExprOp::kGetItem, at);
    add_kid(*e, std::move(obj));
    add_kid(*e, std::move(args[0]));
    return e;
  }
  // An index or a slice [start:stop:step]; a slice comes back as kSlice with kids[0] empty.
  ExprPtr parse_subscribed() {
    const size_t at = cur().offset;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    advance();  // ':'
    auto e = mk(ExprOp::kSlice, at);
    add_kid(*e, nullptr);
    add_kid(*e, std::move(start));
    add_kid(*e, is_op(":") || is_op("]") || is_op(",") ? nullptr : parse_expression(true));
    ExprPtr step;
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) step = parse_expression(true);
    }
    add_kid(*e, std::move(step));
    return e;
  }

  // (args, name=value, ...) appended to e->kids, keyword names in e->kw_names.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        e.kw_names.push_back(cur().text);
        advance();
        advance();
        add_kid(e, parse_expression(true));
      } else {
        if (!e.kw_names.empty()) fail("a positional argument follows a keyword argument");
        add_kid(e, parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = mk(ExprOp::kCall, cur().offset);
    add_kid(*e, std::move(callee));
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    return name;
  }

  ExprPtr parse_filter(ExprPtr subject) {
    while (skip_op("|")) {
      const size_t at = cur().offset;
      auto e = mk(ExprOp::kFilter, at);
      e->name = dotted_name();
      e->filter = find_filter(e->name);  // unknown: checked by check_names()
      add_kid(*e, std::move(subject));
      if (is_op("(")) parse_call_args(*e);
      subject = std::move(e);
    }
    return subject;
  }

  ExprPtr parse_test(ExprPtr subject) {
    const size_t is_at = cur().offset;
    advance();  // 'is'
    const bool negated = skip_name("not");
    const size_t at = cur().offset;
    auto e = mk(ExprOp::kTest, at);
    e->name = dotted_name();
    e->test = find_test(e->name);  // unknown: checked by check_names()
    add_kid(*e, std::move(subject));
    const Tok ty = cur().type;
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((ty == Tok::kName || ty == Tok::kString || ty == Tok::kInt || ty == Tok::kFloat || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("cannot chain tests with 'is'");
      add_kid(*e, parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = mk(ExprOp::kNot, is_at);
    add_kid(*n, std::move(e));
    return n;
  }

  const Program& p_;
  std::vector<Token> t_;
  size_t k_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;       // expression recursion (Nest)
  int body_nesting_ = 0;  // statement bodies (Nest)
};

// Unknown filters and tests are errors when the template is compiled, except inside an if
// statement (its tests and bodies) or an inline if-expression, where jinja2 only fails if they
// are reached ("soft" frames); a for-loop body, macro, with/set block or generation block is a
// new frame, not soft.
void check_names(const Program& p, const Expr& e, bool soft) {
  if (e.op == ExprOp::kCond) soft = true;
  if (!soft && ((e.op == ExprOp::kFilter && e.filter == nullptr) || (e.op == ExprOp::kTest && e.test == nullptr))) {
    throw InputError(p.where(e.offset) + ": unknown " + (e.op == ExprOp::kFilter ? "filter" : "test") + " '" + e.name + "'");
  }
  for (const auto& k : e.kids) {
    if (k) check_names(p, *k, soft);
  }
}
void check_names(const Program& p, const Body& body, bool soft) {
  for (const auto& s : body) {
    const bool inner_soft = s->op == StmtOp::kIf ? true : s->op == StmtOp::kSet || s->op == StmtOp::kEmit ? soft : false;
    for (size_t k = 0; k < s->exprs.size(); ++k) {
      if (s->exprs[k]) check_names(p, *s->exprs[k], s->op == StmtOp::kFor && k == 0 ? soft : inner_soft);
    }
    for (const auto& b : s->bodies) check_names(p, b, inner_soft);
  }
}

}  // namespace

std::string Program::where(size_t offset) const {
  const auto it = std::upper_bound(line_starts.begin(), line_starts.end(), offset);
  const size_t line = static_cast<size_t>(it - line_starts.begin());  // 1-based
  const size_t col = offset - line_starts[line - 1] + 1;
  return fmt::format("{}:{}:{}", label, line, col);
}

std::unique_ptr<Program> parse_program(std::string source, std::string label) {
  auto p = std::make_unique<Program>();
  p->label = std::move(label);
  p->source = normalize_newlines(source);
  p->line_starts.push_back(0);
  for (size_t k = 0; k < p->source.size(); ++k) {
    if (p->source[k] == '\n') p->line_starts.push_back(k + 1);
  }
  Parser parser(*p, lex(*p));
  p->body = parser.parse_template();
  check_names(*p, p->body, false);
  return p;
}

}  // namespace qshard::jinja
