// chat_template_eval.cpp: runs a parsed chat template (chat_template_ast.h) as jinja2 does.
//
// Scoping follows jinja2: `set` writes to the innermost frame; a for-loop iteration, a macro call,
// a with block, a block set's body and the generation block each get a fresh frame whose writes do
// not leak out (an `if` does not make a frame); namespace() objects are shared, so `set ns.x`
// inside a loop is seen after it. Names not found are Undefined (empty when printed, false,
// `is defined` false); using one in arithmetic, as an object (x.y, x[0]) or calling it is an
// error, as with jinja2's default Undefined.
#include <fmt/format.h>

#include <algorithm>

#include "text/chat_template.h"
#include "text/chat_template_ast.h"

namespace qshard::jinja {

Value Value::undefined(std::string why) {
  Value v;
  if (!why.empty()) v.s = std::make_shared<const std::string>(std::move(why));
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::real(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  charge_bytes(x.size());
  Value v;
  v.kind = Kind::kString;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}
Value Value::markup_string(std::string x) {
  Value v = string(std::move(x));
  v.markup = true;
  return v;
}
Value Value::make_list(ValueList x, bool is_tuple) {
  charge_bytes(x.size() * sizeof(Value));
  int depth = 0;
  for (const auto& item : x) depth = std::max<int>(depth, item.depth);
  if (depth + 1 > kMaxValueDepth) fail_value_depth();
  Value v;
  v.depth = static_cast<uint16_t>(depth + 1);
  v.kind = Kind::kList;
  v.tuple = is_tuple;
  v.list = std::make_shared<const ValueList>(std::move(x));
  return v;
}
Value Value::make_view(ValueList x, View view) {
  Value v = make_list(std::move(x));
  v.view = view;
  return v;
}
Value Value::make_dict(Dict d) {
  charge_bytes(d.entries.size() * 2 * sizeof(Value));
  int depth = 0;
  for (const auto& [k, item] : d.entries) depth = std::max<int>({depth, k.depth, item.depth});
  if (depth + 1 > kMaxValueDepth) fail_value_depth();
  Value v;
  v.depth = static_cast<uint16_t>(depth + 1);
  v.kind = Kind::kDict;
  v.dict = std::make_shared<const Dict>(std::move(d));
  return v;
}

const Value* Dict::find(std::string_view key) const {
  charge_work(entries.size());
  for (const auto& [k, v] : entries) {
    if (k.is(Kind::kString) && k.str() == key) return &v;
  }
  return nullptr;
}
const Value* Dict::find(const Value& key) const {
  if (key.is(Kind::kString)) return find(std::string_view(key.str()));
  charge_work(entries.size());
  for (const auto& [k, v] : entries) {
    if (equal(k, key)) return &v;
  }
  return nullptr;
}
void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : entries) {
    if (k.is(Kind::kString) && k.str() == key) {
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(Value::string(key), std::move(v));
}
void Dict::set(Value key, Value v) {
  for (auto& [k, old] : entries) {
    if (equal(k, key)) {
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(v));
}

const Value* Scope::lookup(std::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}
void Scope::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}

namespace {

constexpr int kMaxMacroDepth = 200;
thread_local Evaluator* t_current = nullptr;  // the render running on this thread

// Installs an evaluator as this thread's current render for the scope (restoring the previous one,
// should a render ever run inside another).
struct CurrentRender {
  Evaluator* saved;
  explicit CurrentRender(Evaluator* ev) : saved(t_current) { t_current = ev; }
  ~CurrentRender() { t_current = saved; }
};

std::string undefined_message(const Value& v) { return v.s ? *v.s : std::string("an undefined value was used"); }

// loop.cycle(a, b, ...): the argument at loop.index0 modulo the count.
Value loop_cycle(Evaluator& ev, const Callable& self, CallArgs& args) {
  if (args.pos.empty()) ev.fail("loop.cycle() needs at least one argument");
  return args.pos[static_cast<size_t>(self.self.i) % args.pos.size()];
}

// The `loop` object of iteration idx. Built directly (not through make_dict): its size is fixed,
// so it is paid for by the iteration budget rather than the memory budget; its keys are made once.
Value make_loop(size_t idx, const ValueList& items) {
  static const char* const kNames[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                                       "depth", "depth0", "previtem", "nextitem", "cycle"};
  static const std::vector<Value> kKeys = [] {
    std::vector<Value> keys;
    for (const char* n : kNames) {
      Value k;
      k.kind = Kind::kString;
      k.s = std::make_shared<const std::string>(n);
      keys.push_back(std::move(k));
    }
    return keys;
  }();
  const size_t n = items.size();
  auto cycle = std::make_shared<Callable>();
  cycle->name = "loop.cycle";
  cycle->builtin = &loop_cycle;
  cycle->self = Value::integer(static_cast<int64_t>(idx));
  Value c;
  c.kind = Kind::kCallable;
  c.fn = std::move(cycle);
  const Value values[] = {
      Value::integer(static_cast<int64_t>(idx + 1)), Value::integer(static_cast<int64_t>(idx)),
      Value::integer(static_cast<int64_t>(n - idx)), Value::integer(static_cast<int64_t>(n - idx - 1)),
      Value::boolean(idx == 0), Value::boolean(idx + 1 == n), Value::integer(static_cast<int64_t>(n)),
      Value::integer(1), Value::integer(0),
      idx > 0 ? items[idx - 1] : Value::undefined("there is no previous item"),
      idx + 1 < n ? items[idx + 1] : Value::undefined("there is no next item"), std::move(c)};
  auto d = std::make_shared<Dict>();
  d->entries.reserve(std::size(kNames));
  for (size_t k = 0; k < std::size(kNames); ++k) d->entries.emplace_back(kKeys[k], values[k]);
  Value v;
  v.kind = Kind::kDict;
  v.depth = static_cast<uint16_t>(1 + std::max(values[9].depth, values[10].depth));
  v.dict = std::move(d);
  return v;
}

}  // namespace

std::string run_program(const Program& program, std::vector<std::pair<std::string, Value>> vars,
                        std::optional<std::time_t> fixed_time, const ChatTemplateLimits& limits, ChatTemplateUsage* usage,
                        RenderTrace* trace) {
  Evaluator ev(program, fixed_time, limits, trace);
  std::string out = ev.run(std::move(vars));
  if (usage != nullptr) *usage = ev.usage();
  return out;
}

Evaluator* Evaluator::current() { return t_current; }

void charge_bytes(uint64_t n) {
  if (t_current != nullptr) t_current->charge_bytes(n);
}
void check_bytes(uint64_t n) {
  if (t_current != nullptr) t_current->check_bytes(n);
}
void charge_work(uint64_t n) {
  if (t_current != nullptr) t_current->charge_work(n);
}
void fail_value_depth() {
  const std::string msg = fmt::format("a list or dict nested deeper than {} levels", kMaxValueDepth);
  if (t_current != nullptr) t_current->fail(msg);
  throw InputError(msg);
}
DepthGuard::DepthGuard(const char* what) : ev_(t_current) {
  if (ev_ != nullptr) ev_->enter(what);
}
DepthGuard::~DepthGuard() {
  if (ev_ != nullptr) ev_->leave();
}

void Evaluator::over_budget(const char* budget, uint64_t limit, const char* key) const {
  fail(fmt::format("the template went over its {} budget ({}; QSHARD_TEMPLATE_LIMITS={}=N sets it)", budget, limit, key));
}
void Evaluator::charge_bytes(uint64_t n) {
  bytes_ += n;
  if (bytes_ > limits_.max_bytes) over_budget("memory", limits_.max_bytes, "bytes");
}
void Evaluator::check_bytes(uint64_t n) {
  if (n > limits_.max_bytes || bytes_ + n > limits_.max_bytes) {
    fail(fmt::format("the template would build a value of {} bytes, over its memory budget ({}; QSHARD_TEMPLATE_LIMITS=bytes=N sets it)",
                     n, limits_.max_bytes));
  }
}
void Evaluator::charge_work(uint64_t n) {
  iterations_ += n;
  if (iterations_ > limits_.max_iterations) over_budget("iteration", limits_.max_iterations, "iterations");
}
void Evaluator::charge_output(uint64_t n) {
  output_ += n;
  if (output_ > limits_.max_output_bytes) over_budget("output", limits_.max_output_bytes, "output");
}
void Evaluator::enter(const char* what) {
  if (++depth_ > kMaxEvalDepth) {
    --depth_;
    fail(fmt::format("{} nested deeper than {} levels at run time", what, kMaxEvalDepth));
  }
  max_depth_ = std::max(max_depth_, depth_);
}

Evaluator::~Evaluator() {
  for (auto& ns : namespaces_) ns->attrs.entries.clear();
}

std::string Evaluator::run(std::vector<std::pair<std::string, Value>> vars) {
  CurrentRender current(this);
  auto globals = std::make_shared<Scope>();
  add_globals(*globals);
  root_ = std::make_shared<Scope>();
  root_->parent = globals;
  for (auto& [k, v] : vars) root_->set(k, std::move(v));
  std::string out;
  root_out_ = &out;
  exec(program_.body, root_, out);
  return out;
}

void Evaluator::fail(const std::string& msg) const { throw InputError(program_.where(at_) + ": " + msg); }

void Evaluator::raise(const std::string& template_message) const {
  throw ChatTemplateRaise(program_.where(at_) + ": raise_exception: " + template_message, template_message);
}

Evaluator::Flow Evaluator::exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out) {
  DepthGuard guard("statements");
  for (const auto& sp : body) {
    const Stmt& s = *sp;
    at_ = s.offset;
    if (++instructions_ > limits_.max_instructions) over_budget("instruction", limits_.max_instructions, "instructions");
    switch (s.op) {  // output is charged where it is written (text, emit); nested bodies charge their own
      case StmtOp::kText:
        charge_output(s.text.size());
        out += s.text;
        break;
      case StmtOp::kEmit: {
        const Value v = eval(*s.exprs[0], scope);
        at_ = s.offset;
        if (v.is(Kind::kString)) {
          charge_output(v.str().size());
          out += v.str();
        } else {
          const std::string text = to_str(v);
          charge_output(text.size());
          out += text;
        }
        break;
      }
      case StmtOp::kIf: {
        size_t branch = 0;
        while (branch < s.exprs.size() && !truthy(eval(*s.exprs[branch], scope))) ++branch;
        if (branch < s.bodies.size()) {
          const Flow f = exec(s.bodies[branch], scope, out);
          if (f != Flow::kNormal) return f;
        }
        break;
      }
      case StmtOp::kFor:
        exec_for(s, scope, out);
        break;
      case StmtOp::kSet:
        assign(s.targets[0], eval(*s.exprs[0], scope), *scope);
        break;
      case StmtOp::kSetBlock: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        std::string text;
        exec(s.bodies[0], inner, text);
        at_ = s.offset;
        assign(s.targets[0], Value::string(std::move(text)), *scope);
        break;
      }
      case StmtOp::kMacro: {
        auto fn = std::make_shared<Callable>();
        fn->name = s.text;
        fn->macro = &s;
        fn->closure = scope;
        Value v;
        v.kind = Kind::kCallable;
        v.fn = std::move(fn);
        scope->set(s.text, std::move(v));
        break;
      }
      case StmtOp::kWith: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        std::vector<Value> values;
        for (const auto& e : s.exprs) values.push_back(eval(*e, scope));
        for (size_t k = 0; k < values.size(); ++k) assign(s.targets[k], std::move(values[k]), *inner);
        const Flow f = exec(s.bodies[0], inner, out);
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtOp::kScoped: {  // {% generation %}: traced when it writes to the render's output
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        const bool traced = trace_ != nullptr && &out == root_out_;
        const size_t begin = out.size();
        if (traced) ++generation_depth_;
        const Flow f = exec(s.bodies[0], inner, out);
        if (traced && --generation_depth_ == 0 && out.size() > begin) trace_->generation.emplace_back(begin, out.size());
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtOp::kBreak:
        return Flow::kBreak;
      case StmtOp::kContinue:
        return Flow::kContinue;
    }
  }
  return Flow::kNormal;
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string& out) {
  const Value iterable = eval(*s.exprs[0], scope);
  at_ = s.offset;
  ValueList items = iterate(*this, iterable);
  if (s.exprs[1]) {  // for x in xs if cond
    ValueList kept;
    for (auto& item : items) {
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      assign(s.targets[0], item, *probe);
      if (truthy(eval(*s.exprs[1], probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    exec(s.bodies[1], inner, out);
    return Flow::kNormal;
  }
  for (size_t idx = 0; idx < items.size(); ++idx) {
    at_ = s.offset;
    charge_work(1);
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    at_ = s.offset;
    // Traced: an iteration over a message object that writes to the render's output.
    size_t message = SIZE_MAX;
    if (trace_ != nullptr && &out == root_out_ && items[idx].is(Kind::kDict)) {
      auto it = trace_->messages.find(items[idx].dict.get());
      if (it != trace_->messages.end()) message = it->second;
    }
    const size_t begin = out.size();
    assign(s.targets[0], items[idx], *inner);
    inner->set("loop", make_loop(idx, items));
    const Flow f = exec(s.bodies[0], inner, out);
    if (message != SIZE_MAX && out.size() > begin) trace_->iterations.push_back({message, begin, out.size()});
    if (f == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Evaluator::assign(const Target& t, Value v, Scope& scope) {
  if (!t.attr.empty()) {
    const Value* ns = scope.lookup(t.names[0]);
    if (ns == nullptr || !ns->is(Kind::kNamespace)) {
      fail("cannot assign attribute '" + t.attr + "' on '" + t.names[0] + "': it is not a namespace() object");
    }
    if (t.attr[0] == '_') fail("namespace attributes cannot start with '_': '" + t.attr + "'");
    ns->ns->attrs.set(t.attr, std::move(v));
    return;
  }
  if (!t.unpack) {
    scope.set(t.names[0], std::move(v));
    return;
  }
  ValueList parts = iterate(*this, v);
  if (parts.size() != t.names.size()) {
    fail(fmt::format("{} values to unpack (expected {}, got {})", parts.size() > t.names.size() ? "too many" : "not enough",
                     t.names.size(), parts.size()));
  }
  for (size_t k = 0; k < parts.size(); ++k) scope.set(t.names[k], std::move(parts[k]));
}

void Evaluator::eval_call_like(const Expr& e, const std::shared_ptr<Scope>& scope, CallArgs& args, size_t first) {
  const size_t n_kw = e.kw_names.size();
  const size_t n_pos = e.kids.size() - first - n_kw;
  for (size_t k = 0; k < n_pos; ++k) args.pos.push_back(eval(*e.kids[first + k], scope));
  for (size_t k = 0; k < n_kw; ++k) args.kw.emplace_back(e.kw_names[k], eval(*e.kids[first + n_pos + k], scope));
  at_ = e.offset;
}

Value Evaluator::eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  at_ = e.offset;
  if (++instructions_ > limits_.max_instructions) over_budget("instruction", limits_.max_instructions, "instructions");
  DepthGuard guard("expressions");
  switch (e.op) {
    case ExprOp::kConst:
      return e.value;
    case ExprOp::kName: {
      const Value* v = scope->lookup(e.name);
      return v != nullptr ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprOp::kGetAttr: {
      const Value obj = eval(*e.kids[0], scope);
      at_ = e.offset;
      return get_attr(*this, obj, e.name);
    }
    case ExprOp::kGetItem: {
      const Value obj = eval(*e.kids[0], scope);
      const Value key = eval(*e.kids[1], scope);
      at_ = e.offset;
      return get_item(*this, obj, key);
    }
    case ExprOp::kSlice: {
      const Value obj = eval(*e.kids[0], scope);
      Value part[3];
      for (int k = 0; k < 3; ++k) part[k] = e.kids[1 + k] ? eval(*e.kids[1 + k], scope) : Value::none();
      at_ = e.offset;
      return get_slice(*this, obj, part[0], part[1], part[2]);
    }
    case ExprOp::kList:
    case ExprOp::kTuple: {
      ValueList items;
      for (const auto& k : e.kids) items.push_back(eval(*k, scope));
      return Value::make_list(std::move(items), e.op == ExprOp::kTuple);
    }
    case ExprOp::kDict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
        Value key = eval(*e.kids[k], scope);
        if (!hashable(key)) {
          at_ = e.kids[k]->offset;
          fail("unhashable type: '" + type_name(key) + "'");
        }
        d.set(std::move(key), eval(*e.kids[k + 1], scope));
      }
      return Value::make_dict(std::move(d));
    }
    case ExprOp::kNeg:
    case ExprOp::kPos: {
      const Value x = eval(*e.kids[0], scope);
      at_ = e.offset;
      if (x.is(Kind::kUndefined)) fail(undefined_message(x));
      if (!x.is_number()) fail(fmt::format("bad operand type for unary {}: '{}'", e.op == ExprOp::kNeg ? '-' : '+', type_name(x)));
      if (e.op == ExprOp::kPos) return x.is(Kind::kBool) ? Value::integer(x.b) : x;
      if (x.is(Kind::kFloat)) return Value::real(-x.f);
      const int64_t i = x.is(Kind::kBool) ? x.b : x.i;
      if (i == INT64_MIN) fail("integer overflow");
      return Value::integer(-i);
    }
    case ExprOp::kNot:
      return Value::boolean(!truthy(eval(*e.kids[0], scope)));
    case ExprOp::kBinary: {
      const Value a = eval(*e.kids[0], scope);
      const Value b = eval(*e.kids[1], scope);
      at_ = e.offset;
      return binary(*this, e.bin, a, b);
    }
    case ExprOp::kConcat: {
      std::string s;
      for (const auto& k : e.kids) s += to_str(eval(*k, scope));
      return Value::string(std::move(s));
    }
    case ExprOp::kAnd: {
      Value a = eval(*e.kids[0], scope);
      return truthy(a) ? eval(*e.kids[1], scope) : a;
    }
    case ExprOp::kOr: {
      Value a = eval(*e.kids[0], scope);
      return truthy(a) ? a : eval(*e.kids[1], scope);
    }
    case ExprOp::kCompare: {
      Value left = eval(*e.kids[0], scope);
      for (size_t k = 0; k < e.cmps.size(); ++k) {
        Value right = eval(*e.kids[k + 1], scope);
        at_ = e.offset;
        if (!compare(*this, e.cmps[k], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprOp::kCond:
      if (truthy(eval(*e.kids[1], scope))) return eval(*e.kids[0], scope);
      if (e.kids[2]) return eval(*e.kids[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and has no else section");
    case ExprOp::kFilter: {
      const Value subject = eval(*e.kids[0], scope);
      CallArgs args;
      eval_call_like(e, scope, args, 1);
      if (e.filter == nullptr) fail("no filter named '" + e.name + "'");
      return e.filter(*this, subject, args);
    }
    case ExprOp::kTest: {
      const Value subject = eval(*e.kids[0], scope);
      CallArgs args;
      eval_call_like(e, scope, args, 1);
      if (e.test == nullptr) fail("no test named '" + e.name + "'");
      return Value::boolean(e.test(*this, subject, args));
    }
    case ExprOp::kCall: {
      const Value callee = eval(*e.kids[0], scope);
      CallArgs args;
      eval_call_like(e, scope, args, 1);
      return call(callee, args);
    }
  }
  fail("unknown expression");
}

Value Evaluator::call(const Value& callee, CallArgs& args) {
  if (callee.is(Kind::kUndefined)) fail(undefined_message(callee) + " (and cannot be called)");
  if (!callee.is(Kind::kCallable)) fail("'" + type_name(callee) + "' object is not callable");
  const Callable& fn = *callee.fn;
  if (fn.macro != nullptr) return call_macro(fn, args);
  return fn.builtin(*this, fn, args);
}

Value Evaluator::call_macro(const Callable& fn, CallArgs& args) {
  const Stmt& m = *fn.macro;
  if (macro_depth_ >= kMaxMacroDepth) fail("macro calls nested too deeply (recursion?) in '" + fn.name + "'");
  if (args.pos.size() > m.params.size()) {
    fail(fmt::format("macro '{}' takes not more than {} argument(s)", fn.name, m.params.size()));
  }
  auto inner = std::make_shared<Scope>();
  inner->parent = fn.closure.lock();
  if (!inner->parent) inner->parent = root_;
  std::vector<bool> given(m.params.size(), false);
  for (size_t k = 0; k < args.pos.size(); ++k) {
    inner->set(m.params[k], std::move(args.pos[k]));
    given[k] = true;
  }
  for (auto& [name, v] : args.kw) {
    size_t k = 0;
    while (k < m.params.size() && m.params[k] != name) ++k;
    if (k == m.params.size()) fail("macro '" + fn.name + "' takes no keyword argument '" + name + "'");
    if (given[k]) fail("macro '" + fn.name + "' got multiple values for argument '" + name + "'");
    inner->set(name, std::move(v));
    given[k] = true;
  }
  const size_t saved_at = at_;
  for (size_t k = 0; k < m.params.size(); ++k) {
    if (given[k]) continue;
    inner->set(m.params[k], m.exprs[k] ? eval(*m.exprs[k], inner) : Value::undefined("parameter '" + m.params[k] + "' was not provided"));
  }
  ++macro_depth_;
  std::string out;
  exec(m.bodies[0], inner, out);
  --macro_depth_;
  at_ = saved_at;
  return Value::string(std::move(out));
}

}  // namespace qshard::jinja
