// chat_template_ast.h: the internals of the chat-template renderer (chat_template.h), shared by
// its sources (src/text/chat_template*.cpp) and included by nothing else.
//
// What: the value model (Python's None/bool/int/float/str/list/tuple/dict, jinja2's Undefined,
// namespace() objects, callables), the syntax tree (Expr, Stmt, Program) and the seams between
// the parts: chat_template_lex.cpp and chat_template_parse.cpp make a Program,
// chat_template_eval.cpp runs it, chat_template_value.cpp holds Python's value semantics and
// printing, chat_template_strings.cpp Python's strings (code points, whitespace, case mapping),
// chat_template_json.cpp json.dumps and JSON input, chat_template_methods.cpp attribute/item access
// and methods, chat_template_filters.cpp filters, tests and globals; chat_template.cpp is the
// public API.
// Strings are UTF-8 bytes; where Python counts characters (len, index, slice, find) the code
// counts code points, an invalid byte counting as one.
// Ownership: a Program owns its tree. Values share their payload through shared_ptr, so a copy is
// cheap; lists and dicts are never changed once built (jinja2's ImmutableSandboxedEnvironment
// refuses append/update/...); a namespace() is the one mutable value.
// Thread safety: a Program is immutable after parsing; an Evaluator lives for one render call.
#pragma once

#include <nlohmann/json.hpp>

#include "text/chat_template.h"

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace qshard::jinja {

// Nesting bounds (each recursive part of the interpreter is bounded so that it fits an 8 MB stack
// under ASan, whose frames are several times larger; the real templates of tests/data/chat_template
// stay below 12 for each, see chat_template.h):
constexpr int kMaxParseNesting = 200;  // statements inside statements; parentheses, `not`s, unary signs, else-ifs
constexpr int kMaxExprDepth = 200;     // the height of one expression's tree (a + a + ..., x|f|f..., a.b.c...)
constexpr int kMaxValueDepth = 200;    // lists/dicts inside lists/dicts (JSON input and values built by the template)
constexpr int kMaxEvalDepth = 600;     // at run time: nested statements + expression nodes + macro calls + printing

enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };
// What a kList really is in Python: a list or tuple, or a lazy result that cannot be indexed or
// serialized: a generator (map/select/reject/unique/items filters, reverse) or a dict view.
enum class View : uint8_t { kPlain, kGenerator, kDictItems, kDictKeys, kDictValues };

struct Value;
struct Dict;
struct Namespace;
struct Callable;
using ValueList = std::vector<Value>;

struct Value {
  Kind kind = Kind::kUndefined;
  bool tuple = false;  // kList: a Python tuple (prints as (a, b))
  View view = View::kPlain;  // kList
  bool markup = false;       // kString: markupsafe.Markup (from |safe, |escape): `+` escapes the other side
  bool b = false;
  uint16_t depth = 0;        // kList/kDict: 1 + the deepest item (a namespace counts as 0); <= kMaxValueDepth
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
  static Value markup_string(std::string v);
  static Value make_list(ValueList v, bool is_tuple = false);
  static Value make_view(ValueList v, View view);
  static Value make_dict(Dict d);

  bool is(Kind k) const { return kind == k; }
  bool is_number() const { return kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat; }
  const std::string& str() const { return *s; }
  const ValueList& items() const { return *list; }
};

// An insertion-ordered dict (JSON objects, dict literals, dict(...)). Keys are str, or any hashable
// value of a dict literal (int, float, bool, None, tuple); 1, 1.0 and True are the same key.
struct Dict {
  std::vector<std::pair<Value, Value>> entries;
  const Value* find(std::string_view key) const;
  const Value* find(const Value& key) const;
  void set(const std::string& key, Value v);  // replaces in place, else appends
  void set(Value key, Value v);
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
  // Macros: the scope they were defined in. Weak, as that scope holds the macro (a cycle
  // otherwise); a macro called after its scope ended sees the template's top-level variables.
  std::weak_ptr<Scope> closure;
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
  int height = 1;  // 1 + the tallest kid (<= kMaxExprDepth, checked as the parser builds the tree)
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

// chat_template_lex.cpp: the tokens of program.source (data, tag delimiters, names, literals,
// operators; comments dropped), ending with kEof.
enum class Tok : uint8_t { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };
struct Token {
  Tok type = Tok::kEof;
  size_t offset = 0;
  std::string text;  // data, name, operator, or the decoded string literal
  int64_t ival = 0;
  double fval = 0.0;
};
std::vector<Token> lex(const Program& program);
std::string normalize_newlines(const std::string& src);  // \r\n and \r to \n; one trailing \n dropped

// chat_template_parse.cpp
std::unique_ptr<Program> parse_program(std::string source, std::string label);

// What a traced render records about its own output (render_with_spans, chat_template.h). Only
// writes to the render's output count (not a macro's or a block set's text), as byte offsets in it.
struct RenderTrace {
  // In: the message objects of `messages` (their Dicts, shared by slices and loop variables) -> index.
  std::unordered_map<const Dict*, size_t> messages;
  // Out: each for-loop iteration whose loop variable is a message object and that wrote output.
  struct Iteration {
    size_t message = 0;
    size_t begin = 0, end = 0;
  };
  std::vector<Iteration> iterations;
  // Out: the output of each outermost {% generation %} block that wrote any ([begin, end)).
  std::vector<std::pair<size_t, size_t>> generation;
};

// chat_template_eval.cpp: runs `program` with `vars` over the globals; the output text.
// fixed_time: what strftime_now() formats (as UTC) instead of the local clock.
// limits: the budgets (chat_template.h); the run fails at the statement or expression that goes over one.
// trace: when not null, receives RenderTrace's records.
std::string run_program(const Program& program, std::vector<std::pair<std::string, Value>> vars,
                        std::optional<std::time_t> fixed_time = std::nullopt, const ChatTemplateLimits& limits = {},
                        ChatTemplateUsage* usage = nullptr, RenderTrace* trace = nullptr);

// The accounting of the render running on this thread (Evaluator::run installs it; outside a render
// these do nothing): value constructors charge the bytes they allocate, printers and builders check
// the size of what they are about to build, recursive helpers take a DepthGuard. Over a budget or the
// depth bound: an InputError at the node being evaluated.
void charge_bytes(uint64_t n);            // n bytes of a string / list / dict now allocated
void check_bytes(uint64_t n);             // refuses, before allocating, a result of n more bytes
void charge_work(uint64_t n);             // n element steps of a builtin (iteration, search)
[[noreturn]] void fail_value_depth();     // a list/dict nested deeper than kMaxValueDepth
class DepthGuard {
 public:
  explicit DepthGuard(const char* what);  // `what` names the construct in the error
  ~DepthGuard();
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  Evaluator* ev_;
};

class Evaluator {
 public:
  Evaluator(const Program& program, std::optional<std::time_t> fixed_time, const ChatTemplateLimits& limits,
            RenderTrace* trace = nullptr)
      : program_(program), fixed_time_(fixed_time), limits_(limits), trace_(trace) {}
  ~Evaluator();  // empties the namespaces it made (a namespace may hold itself: a cycle)
  std::string run(std::vector<std::pair<std::string, Value>> vars);
  void own(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }
  std::optional<std::time_t> fixed_time() const { return fixed_time_; }
  // Throws InputError "label:line:col: msg" at the expression being evaluated.
  [[noreturn]] void fail(const std::string& msg) const;
  [[noreturn]] void raise(const std::string& template_message) const;
  Value call(const Value& callee, CallArgs& args);
  Value call_macro(const Callable& macro, CallArgs& args);

  // Budgets and nesting (see charge_bytes & co. above).
  void charge_bytes(uint64_t n);
  void check_bytes(uint64_t n);
  void charge_work(uint64_t n);
  void charge_output(uint64_t n);
  void enter(const char* what);  // one level deeper; fails past kMaxEvalDepth
  void leave() { --depth_; }
  static Evaluator* current();
  ChatTemplateUsage usage() const { return {instructions_, iterations_, output_, bytes_, max_depth_}; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out);
  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  // The arguments of a call, filter or test node: kids from `first` on (keywords last).
  void eval_call_like(const Expr& e, const std::shared_ptr<Scope>& scope, CallArgs& args, size_t first);
  void assign(const Target& t, Value v, Scope& scope);

  [[noreturn]] void over_budget(const char* budget, uint64_t limit, const char* key) const;

  const Program& program_;
  const std::optional<std::time_t> fixed_time_;
  const ChatTemplateLimits& limits_;
  size_t at_ = 0;  // offset of the node being evaluated
  int depth_ = 0;  // nested exec/eval/macro calls/printing (kMaxEvalDepth)
  int max_depth_ = 0;
  int macro_depth_ = 0;
  uint64_t instructions_ = 0;  // statements + expression nodes evaluated
  uint64_t iterations_ = 0;    // loop iterations + builtin element steps
  uint64_t output_ = 0;        // bytes written to any output (the render's, macro and block-set bodies)
  uint64_t bytes_ = 0;         // bytes of strings, lists and dicts created (never given back: conservative)
  RenderTrace* trace_ = nullptr;           // null: no tracing
  const std::string* root_out_ = nullptr;  // the render's own output (what the trace records)
  int generation_depth_ = 0;               // {% generation %} blocks open on the render's output
  std::shared_ptr<Scope> root_;  // the render's variables and top-level sets
  std::vector<std::shared_ptr<Namespace>> namespaces_;
};

// chat_template_filters.cpp
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
void add_globals(Scope& scope);

// chat_template_value.cpp
bool truthy(const Value& v);
bool hashable(const Value& v);
bool equal(const Value& a, const Value& b);
std::string to_str(const Value& v);  // Python str()
std::string repr(const Value& v);    // Python repr()
std::string py_float_repr(double d);  // float.__repr__: the shortest round-trip digits (1.0, 1e+16)
std::string type_name(const Value& v);
Value binary(Evaluator& ev, BinOp op, const Value& a, const Value& b);
bool compare(Evaluator& ev, CmpOp op, const Value& a, const Value& b);
ValueList iterate(Evaluator& ev, const Value& v);  // for-loop / filter iteration (dict: keys)
[[noreturn]] void fail_undefined(Evaluator& ev, const Value& v);  // jinja2's UndefinedError
// Python's slice(start, stop, step).indices(len) (None or int bounds); false when one is not an int.
bool slice_indices(const Value& start, const Value& stop, const Value& step, int64_t len, int64_t& b, int64_t& e, int64_t& st,
                   Evaluator& ev);

// chat_template_methods.cpp
Value get_attr(Evaluator& ev, const Value& obj, const std::string& name);  // obj.name
Value get_item(Evaluator& ev, const Value& obj, const Value& key);         // obj[key]
Value get_slice(Evaluator& ev, const Value& obj, const Value& start, const Value& stop, const Value& step);

// chat_template_json.cpp
std::string json_dumps(Evaluator& ev, const Value& v, bool ensure_ascii, const Value& indent, const Value& separators,
                       bool sort_keys);  // Python's json.dumps
// null/bool/number/string/array/object; deeper than kMaxValueDepth: InputError "JSON nested deeper ...".
Value from_json(const nlohmann::ordered_json& j, int depth = 0);

// chat_template_strings.cpp
std::string html_escape(std::string_view s);  // markupsafe.escape: & < > " '
bool py_isspace(uint32_t cp);
std::string_view py_rstrip(std::string_view s);  // str.rstrip(): Python's whitespace
void utf8_append(std::string& out, uint32_t cp);
bool utf8_next(std::string_view s, size_t& pos, uint32_t& cp);  // false at end; bad byte: 0x110000 + byte

// Strings as Python sees them (code points; an invalid byte b is 0x110000 + b and encodes back to b).
std::vector<uint32_t> to_cps(std::string_view s);
std::string from_cps(const std::vector<uint32_t>& cps, size_t begin, size_t end);
size_t cp_length(std::string_view s);
// str.strip/lstrip/rstrip: `chars` null (or None) strips Python whitespace, else those characters.
std::string py_strip(std::string_view s, const Value* chars, bool left, bool right);
// Python's lower/upper/capitalize/title for ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic.
std::string py_lower(std::string_view s);
std::string py_upper(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);
std::string py_swapcase(std::string_view s);
uint32_t py_upper_cp(uint32_t c);  // one code point's simple mapping (ß, ŉ, ΐ, ΰ map to themselves)
uint32_t py_lower_cp(uint32_t c);
bool py_cased_cp(uint32_t c);

// Python-style argument binding for builtins: positional arguments, then keywords by name; too
// many, unknown or repeated arguments fail naming `fn`. get(i) is null when not given.
class Params {
 public:
  Params(Evaluator& ev, CallArgs& args, std::string_view fn, std::initializer_list<const char*> names);
  const Value* get(size_t i) const { return slots_[i]; }
  bool given(size_t i) const { return slots_[i] != nullptr; }
  // The argument, or `fallback` when not given.
  const Value& get_or(size_t i, const Value& fallback) const { return slots_[i] ? *slots_[i] : fallback; }
  int64_t get_int(size_t i, int64_t fallback) const;
  bool get_bool(size_t i, bool fallback) const;
  std::string get_str(size_t i, const std::string& fallback) const;

 private:
  Evaluator& ev_;
  std::string fn_;
  std::vector<const char*> names_;
  std::vector<const Value*> slots_;
};

}  // namespace qshard::jinja
