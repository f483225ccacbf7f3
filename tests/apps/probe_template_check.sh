#!/usr/bin/env bash
# Hostile chat templates and records through `qshard tokenize --format chat` (issue 25): nesting
# 100k deep (statements, `not`, operator / filter / attribute chains, parentheses, macros; a
# message content nested past the template's bound), runaway loops, doubling strings, a value shared 2^60 ways
# under tojson, huge indents, quadratic appends, huge output, a 100k-message record - each refused
# with exit 2 and a message naming the template (or record) and the construct or budget; no crash,
# no hang, no out-of-memory kill. Every probe runs under a 4 GiB address-space limit (ulimit -v)
# and a 60 s timeout; the wrong exit code (124 = timeout, >= 128 = a signal) or a missing pattern
# fails the probe. The same classes, in-process: tests/text/chat_template_limits_test.cpp.
# Usage: probe_template_check.sh QSHARD TOKENIZER_JSON WORK_DIR
set -uo pipefail
qshard=$1 tokenizer_json=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fails=0

# rep STRING N: STRING N times.
rep() { local s=$1 n=$2 out=""; out=$(printf "%${n}s" "" | sed "s/ /$(printf '%s' "$s" | sed 's/[\/&]/\\&/g')/g"); printf '%s' "$out"; }

# model NAME TEMPLATE-TEXT: a tokenizer folder whose chat_template.jinja is the text.
model() {
  mkdir -p "$work/$1"
  cp "$tokenizer_json" "$work/$1/tokenizer.json"
  echo '{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}' > "$work/$1/tokenizer_config.json"
  printf '%s' "$2" > "$work/$1/chat_template.jinja"
}
echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}' > "$work/chat.jsonl"

# probe NAME PATTERN [RECORDS]: tokenizes RECORDS (default chat.jsonl) with model NAME; wants exit 2 + PATTERN.
probe() {
  local name=$1 pattern=$2 records=${3:-$work/chat.jsonl} out rc
  out=$( (ulimit -v 4194304; timeout 60 "$qshard" tokenize "$records" --format chat --tokenizer "$work/$name" \
    --out "$work/$name.tok") 2>&1)
  rc=$?
  if [ "$rc" != 2 ] || ! grep -Eq -e "$pattern" <<< "$out"; then
    echo "FAIL $name: exit $rc (want 2), pattern '$pattern'"
    echo "$out" | tail -5 | cut -c1-300
    fails=$((fails + 1))
  else
    echo "ok   $name: $(grep -Eo -e "$pattern.{0,60}" <<< "$out" | head -1)"
  fi
}

n=100000
t="chat_template.jinja"
model deep_if "$(rep '{% if true %}' $n)x$(rep '{% endif %}' $n)"
probe deep_if "$t:1:[0-9]+: statements nested deeper than 200 levels"
model deep_for "$(rep '{% for x in [1] %}' $n)x$(rep '{% endfor %}' $n)"
probe deep_for "$t:1:[0-9]+: statements nested deeper than 200 levels"
model deep_setblock "$(rep '{% set x %}' $n)x$(rep '{% endset %}' $n)"
probe deep_setblock "$t:1:[0-9]+: statements nested deeper than 200 levels"
model deep_macro "$(rep '{% macro m() %}' $n)x$(rep '{% endmacro %}' $n)"
probe deep_macro "$t:1:[0-9]+: statements nested deeper than 200 levels"
model deep_not "{{ $(rep 'not ' $n)x }}"
probe deep_not "$t:1:[0-9]+: expressions nested deeper than 200 levels"
model deep_plus "{{ 1$(rep ' + 1' $n) }}"
probe deep_plus "$t:1:[0-9]+: expression nested deeper than 200 levels"
model deep_filters "{{ 'a'$(rep '|lower' $n) }}"
probe deep_filters "$t:1:[0-9]+: expression nested deeper than 200 levels"
model deep_attrs "{{ a$(rep '.b' $n) }}"
probe deep_attrs "$t:1:[0-9]+: expression nested deeper than 200 levels"
model deep_parens "{{ $(rep '(' $n)1$(rep ')' $n) }}"
probe deep_parens "$t:1:[0-9]+: expressions nested deeper than 200 levels"
model print_content '{% for m in messages %}{{ m.data }}{{ m.data|tojson }}{% endfor %}'
# (230 deep: past the template's bound of 200, within the record reader's 256)
{ printf '{"messages": [{"role": "user", "content": "x", "data": '; rep '[' 230; rep ']' 230; printf '}, {"role": "assistant", "content": "x"}]}\n'; } \
  > "$work/deep.jsonl"
probe print_content "$t: messages\[0\]: JSON nested deeper than 200 levels" "$work/deep.jsonl"
model self_namespace '{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}'
probe self_namespace "$t:1:[0-9]+: printed values nested deeper than 600 levels"
model recursive_macro '{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}'
probe recursive_macro "$t:1:[0-9]+: (macro calls nested too deeply|.*nested deeper than)"

model range_huge '{% for i in range(10**10) %}{{ i }}{% endfor %}'
probe range_huge "$t:1:[0-9]+: range too big"
model nested_loops '{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}'
probe nested_loops "$t:1:[0-9]+: the template went over its iteration budget"
model doubling '{% set ns = namespace(s="a") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}'
probe doubling "$t:1:[0-9]+: the template went over its memory budget"
model shared_tojson '{% set ns = namespace(l=["x"]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l|tojson }}'
probe shared_tojson "$t:1:[0-9]+: the template would build a value of [0-9]+ bytes, over its memory budget"
model huge_indent '{{ ("a\n" * 100000)|indent(10**12) }}'
probe huge_indent "$t:1:[0-9]+: the template would build a value of [0-9]+ bytes, over its memory budget"
model quadratic_append '{% set ns = namespace(s="") %}{% for i in range(100000) %}{% set ns.s = ns.s ~ "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" %}{% endfor %}'
probe quadratic_append "$t:1:[0-9]+: the template went over its memory budget"
model huge_output '{% for i in range(100000) %}{{ "x" * 100000 }}{% endfor %}'
probe huge_output "$t:1:[0-9]+: the template went over its output budget"
# A 100k-message record with a real template: the render is linear; the per-reply spans are refused at once.
model many_messages "$(cat "$(dirname "$0")/../data/chat_template/templates/Qwen-Qwen2.5-7B-Instruct.jinja")"
python3 -c 'import json; print(json.dumps({"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "m%d" % i} for i in range(100000)]}))' \
  > "$work/many.jsonl"
probe many_messages "$t: the per-reply spans of this conversation \(100000 messages" "$work/many.jsonl"

if [ "$fails" != 0 ]; then
  echo "probe_template_check: $fails probe(s) failed"
  exit 1
fi
echo "probe_template_check: all probes refused cleanly"
