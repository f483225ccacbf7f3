// chat_template_ast.h: the internals of the chat-template renderer (chat_template.h), shared by
// its three sources and included by nothing else.
//
// What: the value model (Python's None/bool/int/float/str/list/tuple/dict, jinja2's Undefined,
// namespace() objects, callables), the syntax tree (Expr, Stmt, Program) and the seams between
// the parts: chat_template.cpp lexes and parses, chat_template_eval.cpp runs a Program,
// chat_template_builtins.cpp holds filters, tests, methods, globals and Python-exact printing.
// Strings are UTF-8 bytes; where Python counts characters (len, index, slice, find) the code
// counts code points, an invalid byte counting as one.
// Ownership: a Program owns its tree. Values share their payload through shared_ptr, so a copy is
// cheap; lists and dicts are never changed once built (jinja2's ImmutableSandboxedEnvironment
// refuses append/update/...); a namespace() is the one mutable value.
// Thread safety: a Program is immutable after parsing; an Evaluator lives for one render call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qshard::jinja {

enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

struct Value;
struct Dict;
struct Namespace;
struct Callable;
using ValueList = std::vector<Value>;

struct Value {
  Kind kind = Kind::kUndefined;
  bool tuple = false;  // kList: a Python tuple (prints as (a, b))
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::shared_ptr<const std::string> s;  // kString: the text; kUndefined: what is undefined (or null)
  std::shared_ptr<const ValueList> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Namespace> ns;
  std::shared_ptr<const Callable> fn;

  static Value undefined(std::string why = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value make_list(ValueList v, bool is_tuple = false);
  static Value make_dict(Dict d);

  bool is(Kind k) const { return kind == k; }
  bool is_number() const { return kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat; }
  const std::string& str() const { return *s; }
  const ValueList& items() const { return *list; }
};

// An insertion-ordered dict with string keys (JSON objects, dict literals, dict(...)).
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);  // replaces in place, else appends
};

struct Namespace {
  Dict attrs;
};

struct CallArgs {
  ValueList pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Evaluator;
struct Stmt;
struct Scope;
using BuiltinFn = Value (*)(Evaluator& ev, const Callable& self, CallArgs& args);

// A global function, a bound method (self + name) or a macro.
struct Callable {
  std::string name;
  BuiltinFn builtin = nullptr;
  Value self;
  const Stmt* macro = nullptr;
  std::shared_ptr<Scope> closure;  // macros: the scope they were defined in
};

// A chain of variable frames: the globals, the render's variables (and top-level sets), then one
// frame per for-loop iteration, macro call, with block.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* lookup(std::string_view name) const;
  void set(const std::string& name, Value v);
};

using FilterFn = Value (*)(Evaluator& ev, const Value& subject, CallArgs& args);
using TestFn = bool (*)(Evaluator& ev, const Value& subject, CallArgs& args);

enum class ExprOp : uint8_t {
  kConst, kName, kGetAttr, kGetItem, kSlice, kList, kTuple, kDict, kNeg, kPos, kNot, kBinary,
  kConcat, kAnd, kOr, kCompare, kCond, kFilter, kTest, kCall
};
enum class BinOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

// kids by op: GetAttr [obj] (name = attribute); GetItem [obj, key]; Slice [obj, start, stop, step]
// (null = omitted); List/Tuple/Concat [items]; Dict [k0, v0, k1, v1, ...]; Neg/Pos/Not [x];
// Binary/And/Or [a, b]; Compare [x0, x1, ...] with cmps[i] between x_i and x_i+1;
// Cond [then, test, else] (else null = Undefined); Filter/Test [subject, args...] and Call
// [callee, args...], the last kw_names.size() args being keyword arguments.
struct Expr {
  ExprOp op = ExprOp::kConst;
  size_t offset = 0;  // in Program::source, for messages
  Value value;        // kConst
  std::string name;   // kName, kGetAttr, kFilter, kTest
  BinOp bin = BinOp::kAdd;
  std::vector<CmpOp> cmps;
  std::vector<std::unique_ptr<Expr>> kids;
  std::vector<std::string> kw_names;
  FilterFn filter = nullptr;
  TestFn test = nullptr;
};

// An assignment target: a name, names to unpack (a, b), or a namespace attribute (ns.attr).
struct Target {
  std::vector<std::string> names;
  bool unpack = false;
  std::string attr;  // non-empty: names[0].attr
};

enum class StmtOp : uint8_t { kText, kEmit, kIf, kFor, kSet, kSetBlock, kMacro, kWith, kScoped, kBreak, kContinue };

// By op: Text (text); Emit exprs [value]; If exprs [cond...], bodies [one per cond, then else if
// any]; For targets [t], exprs [iterable, filter or null], bodies [body, else]; Set targets [t],
// exprs [value]; SetBlock targets [t], bodies [body]; Macro text = name, params, exprs [default
// or null per param], bodies [body]; With targets/exprs pairwise, bodies [body]; Scoped (the
// generation block) bodies [body].
struct Stmt {
  StmtOp op = StmtOp::kText;
  size_t offset = 0;
  std::string text;
  std::vector<std::unique_ptr<Expr>> exprs;
  std::vector<std::vector<std::unique_ptr<Stmt>>> bodies;
  std::vector<Target> targets;
  std::vector<std::string> params;
};
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Program {
  std::string label;
  std::string source;               // newlines normalized, one trailing newline dropped (as jinja2)
  std::vector<size_t> line_starts;  // offsets of line starts in source
  Body body;
  std::string where(size_t offset) const;  // "label:line:col"
};

// chat_template.cpp
std::unique_ptr<Program> parse_program(std::string source, std::string label);

// chat_template_eval.cpp: runs `program` with `vars` over the globals; the output text.
std::string run_program(const Program& program, std::vector<std::pair<std::string, Value>> vars);

class Evaluator {
 public:
  explicit Evaluator(const Program& program) : program_(program) {}
  std::string run(std::vector<std::pair<std::string, Value>> vars);
  // Throws InputError "label:line:col: msg" at the expression being evaluated.
  [[noreturn]] void fail(const std::string& msg) const;
  [[noreturn]] void raise(const std::string& template_message) const;
  Value call(const Value& callee, CallArgs& args);
  Value call_macro(const Callable& macro, CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value eval_call_like(const Expr& e, const std::shared_ptr<Scope>& scope, CallArgs& args, size_t first);
  void assign(const Target& t, Value v, Scope& scope);

  const Program& program_;
  size_t at_ = 0;  // offset of the node being evaluated
  int depth_ = 0;  // macro call depth
};

// chat_template_builtins.cpp
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
void add_globals(Scope& scope);
Value from_json_text(std::string_view json_text);  // a JSON document (nlohmann dump) as Values
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
std::string to_str(const Value& v);  // Python str()
std::string repr(const Value& v);    // Python repr()
std::string type_name(const Value& v);
Value get_attr(Evaluator& ev, const Value& obj, const std::string& name);  // obj.name
Value get_item(Evaluator& ev, const Value& obj, const Value& key);         // obj[key]
Value get_slice(Evaluator& ev, const Value& obj, const Value& start, const Value& stop, const Value& step);
Value binary(Evaluator& ev, BinOp op, const Value& a, const Value& b);
bool compare(Evaluator& ev, CmpOp op, const Value& a, const Value& b);
ValueList iterate(Evaluator& ev, const Value& v);  // for-loop / filter iteration (dict: keys)
bool py_isspace(uint32_t cp);
std::string py_rstrip(std::string_view s);  // str.rstrip() with Python's whitespace
bool utf8_next(std::string_view s, size_t& pos, uint32_t& cp);  // false at end; bad byte: 0x110000 + byte

}  // namespace qshard::jinja
