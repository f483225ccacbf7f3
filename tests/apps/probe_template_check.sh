#!/usr/bin/env bash
# Hostile chat templates and records through `qshard tokenize --format chat` (issue 25): nesting
# 100k deep (statements, `not`, operator / filter / attribute chains, parentheses, macros; a
# message content nested past the template's bound), runaway loops, doubling strings, a value shared 2^60 ways
# under tojson, huge indents, quadratic appends, huge output, a 100k-message record whose spans
# cannot be traced - each refused
# with exit 2 and a message naming the template (or record) and the construct or budget; no crash,
# no hang, no out-of-memory kill. Every probe runs under a 4 GiB address-space limit (ulimit -v)
# and a 60 s timeout; the wrong exit code (124 = timeout, >= 128 = a signal) or a missing pattern
# fails the probe. A 100k-message record with a real template is tokenized (linear spans). The same classes, in-process: tests/text/chat_template_limits_test.cpp.
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

source "$(dirname "$0")/probe_lib.sh"
# tprobe NAME PATTERN [RECORDS]: tokenizes RECORDS (default chat.jsonl) with model NAME under the
# limits (probe_lib.sh); wants exit 2 + PATTERN.
tprobe() {
  probe "$1" 2 "$2" -- "$qshard" tokenize "${3:-$work/chat.jsonl}" --format chat --tokenizer "$work/$1" --out "$work/$1.tok"
}

n=100000
t="chat_template.jinja"
model deep_if "$(rep '{% if true %}' $n)x$(rep '{% endif %}' $n)"
tprobe deep_if "$t:1:[0-9]+: statements nested deeper than 200 levels"
model deep_for "$(rep '{% for x in [1] %}' $n)x$(rep '{% endfor %}' $n)"
tprobe deep_for "$t:1:[0-9]+: statements nested deeper than 200 levels"
model deep_setblock "$(rep '{% set x %}' $n)x$(rep '{% endset %}' $n)"
tprobe deep_setblock "$t:1:[0-9]+: statements nested deeper than 200 levels"
model deep_macro "$(rep '{% macro m() %}' $n)x$(rep '{% endmacro %}' $n)"
tprobe deep_macro "$t:1:[0-9]+: statements nested deeper than 200 levels"
model deep_not "{{ $(rep 'not ' $n)x }}"
tprobe deep_not "$t:1:[0-9]+: expressions nested deeper than 200 levels"
model deep_plus "{{ 1$(rep ' + 1' $n) }}"
tprobe deep_plus "$t:1:[0-9]+: expression nested deeper than 200 levels"
model deep_filters "{{ 'a'$(rep '|lower' $n) }}"
tprobe deep_filters "$t:1:[0-9]+: expression nested deeper than 200 levels"
model deep_attrs "{{ a$(rep '.b' $n) }}"
tprobe deep_attrs "$t:1:[0-9]+: expression nested deeper than 200 levels"
model deep_parens "{{ $(rep '(' $n)1$(rep ')' $n) }}"
tprobe deep_parens "$t:1:[0-9]+: expressions nested deeper than 200 levels"
model print_content '{% for m in messages %}{{ m.data }}{{ m.data|tojson }}{% endfor %}'
# (230 deep: past the template's bound of 200, within the record reader's 256)
{ printf '{"messages": [{"role": "user", "content": "x", "data": '; rep '[' 230; rep ']' 230; printf '}, {"role": "assistant", "content": "x"}]}\n'; } \
  > "$work/deep.jsonl"
tprobe print_content "$t: messages\[0\]: JSON nested deeper than 200 levels" "$work/deep.jsonl"
model self_namespace '{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}'
tprobe self_namespace "$t:1:[0-9]+: printed values nested deeper than 600 levels"
model recursive_macro '{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}'
tprobe recursive_macro "$t:1:[0-9]+: (macro calls nested too deeply|.*nested deeper than)"

model range_huge '{% for i in range(10**10) %}{{ i }}{% endfor %}'
tprobe range_huge "$t:1:[0-9]+: range too big"
model nested_loops '{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}'
tprobe nested_loops "$t:1:[0-9]+: the template went over its iteration budget"
model doubling '{% set ns = namespace(s="a") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}'
tprobe doubling "$t:1:[0-9]+: the template went over its memory budget"
model shared_tojson '{% set ns = namespace(l=["x"]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l|tojson }}'
tprobe shared_tojson "$t:1:[0-9]+: the template would build a value of [0-9]+ bytes, over its memory budget"
model huge_indent '{{ ("a\n" * 100000)|indent(10**12) }}'
tprobe huge_indent "$t:1:[0-9]+: the template would build a value of [0-9]+ bytes, over its memory budget"
model quadratic_append '{% set ns = namespace(s="") %}{% for i in range(100000) %}{% set ns.s = ns.s ~ "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" %}{% endfor %}'
tprobe quadratic_append "$t:1:[0-9]+: the template went over its memory budget"
model huge_output '{% for i in range(100000) %}{{ "x" * 100000 }}{% endfor %}'
tprobe huge_output "$t:1:[0-9]+: the template went over its output budget"
# A 100k-message record with a real template: the render is linear, and so are the per-reply spans
# (the template's own turns, from the one render: text/chat_template.h's rule 3).
model many_messages "$(cat "$(dirname "$0")/../data/chat_template/templates/Qwen-Qwen2.5-7B-Instruct.jinja")"
python3 -c 'import json; print(json.dumps({"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "m%d" % i} for i in range(100000)]}))' \
  > "$work/many.jsonl"
probe many_messages 0 "tokenized 1 files, 1 documents" -- "$qshard" tokenize "$work/many.jsonl" --format chat \
  --tokenizer "$work/many_messages" --out "$work/many_messages.tok"
# The same record through a template whose loop is not over the message objects (no turns to trace):
# the per-reply spans would be quadratic, and are refused at once.
model many_untraced '{% for c in messages | map(attribute="content") %}<m>{{ c }}{% endfor %}'
tprobe many_untraced "$t: the per-reply spans of this conversation \(100000 messages" "$work/many.jsonl"

probe_summary "probe_template_check: all probes refused cleanly"
