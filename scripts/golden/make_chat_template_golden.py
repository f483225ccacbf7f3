#!/usr/bin/env python3
"""Golden data for the native chat-template renderer (src/text/chat_template.h), made by the real
transformers library: tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
(transformers' own code path: its ImmutableSandboxedEnvironment with trim_blocks/lstrip_blocks,
loopcontrols, its tojson, raise_exception and strftime_now; its message normalization).

  Templates  real chat templates as shipped by models: the files of llama-cpp-python 0.3.36's sdist
             (vendor/llama.cpp/models/templates/, fetched from each model's tokenizer_config.json by
             llama.cpp's scripts/get_chat_template.py), plus SmolLM2-Instruct's ChatML template (the
             "chat_template" string of HuggingFaceTB/SmolLM2-135M-Instruct's tokenizer_config.json,
             as quoted verbatim by public code that asserts it, e.g. github.com/biom8er/phymes).
             Each is copied to tests/data/chat_template/templates/NAME.jinja byte for byte.
  Conversations  CONVERSATIONS below: single user turn; system + user; multi-turn ending with the
             assistant and with the user; Unicode and emoji; Jinja-looking text, quotes, backslashes,
             CR/LF and tabs; empty contents; reasoning (<think> in content, reasoning_content);
             leading/trailing and Unicode whitespace; an assistant turn first; two user turns in a
             row; tool calls with a tools list; enable_thinking=false; a key whose value is null (dropped). Each is rendered with
             add_generation_prompt False and True.
  Spans      for every conversation, the byte spans of the assistant messages as
             render_with_spans() defines them (the render of messages[:i] with a generation prompt
             -- or, where the finished turn does not repeat all of it, the part it does repeat --
             must be a prefix of the render of messages[:i+1], itself a prefix of the whole
             render; the span is [len(prefix), len(render(messages[:i+1])))), or the error.

Where transformers raises, the golden records it: "raise" with the template's raise_exception()
message, else "error" with the exception type and message; the C++ must raise too.

The minimal tokenizer (a few-word WordLevel model) only carries the special tokens and the template;
apply_chat_template passes the special tokens it has (bos_token, eos_token) to the template. The
special tokens are the models' usual bos/eos (placeholders "<s>"/"</s>" for the extra templates):
they only have to be the same on both sides.
Llama 3.x templates get date_string="26 Jul 2024" (as the brief for Llama asks), except the variant
"meta-llama-Llama-3.2-3B-Instruct@strftime_now", which lets the template call strftime_now. The
clock is fixed for every template: transformers' module-level `datetime` is replaced by one whose
now() is FIXED_NOW (2024-07-26 12:00:00), and the C++ gets ChatTemplate::set_fixed_time(the same
instant as UTC); so granite, gpt-oss and Llama 3.2 render the same on any day.

Output: tests/data/chat_template/golden.json (ordered JSON: conversations, then per template its
file, special tokens, extra variables, renders and spans), templates/*.jinja, SOURCE.txt.

Usage (a venv with no torch is enough):
  python3 -m venv /tmp/ctvenv && /tmp/ctvenv/bin/pip install transformers jinja2
  /tmp/ctvenv/bin/python scripts/golden/make_chat_template_golden.py \
      [--templates DIR_OF_LLAMA_CPP_TEMPLATES] [--out tests/data/chat_template]
The templates folder comes from `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`
(untar; vendor/llama.cpp/models/templates).
"""
import argparse
import datetime
import json
import os
import shutil

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TEMPLATES = "/tmp/tokenizers_found/x/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates"
DEFAULT_OUT = os.path.join(ROOT, "tests", "data", "chat_template")

# HuggingFaceTB/SmolLM2-135M-Instruct tokenizer_config.json "chat_template" (JSON "\n" = newline).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA_DATE = {"date_string": "26 Jul 2024"}
FIXED_NOW = datetime.datetime(2024, 7, 26, 12, 0, 0)
PLACEHOLDER = {"bos_token": "<s>", "eos_token": "</s>"}

# name (file stem, "@variant" for a second run of a file), special tokens, extra variables.
TEMPLATES = [
    ("meta-llama-Llama-3.1-8B-Instruct", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, LLAMA_DATE),
    ("meta-llama-Llama-3.2-3B-Instruct", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, LLAMA_DATE),
    ("meta-llama-Llama-3.2-3B-Instruct@strftime_now", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, {}),
    ("Qwen-Qwen2.5-7B-Instruct", {"eos_token": "<|im_end|>"}, {}),
    ("Qwen-Qwen3-0.6B", {"eos_token": "<|im_end|>"}, {}),
    ("Qwen-QwQ-32B", {"eos_token": "<|im_end|>"}, {}),
    ("HuggingFaceTB-SmolLM3-3B", {"eos_token": "<|im_end|>"}, {}),
    ("HuggingFaceTB-SmolLM2-Instruct", {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, {}),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}, {}),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}, {}),
    ("mistralai-Mistral-Nemo-Instruct-2407", {"bos_token": "<s>", "eos_token": "</s>"}, {}),
    ("microsoft-Phi-3.5-mini-instruct", {"bos_token": "<s>", "eos_token": "<|endoftext|>"}, {}),
    ("google-gemma-2-2b-it", {"bos_token": "<bos>", "eos_token": "<eos>"}, {}),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}, {}),
    ("ibm-granite-granite-3.3-2B-Instruct", {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>"}, {}),
    # More real templates, each for a feature: macros, strftime_now and a large tool layout (gpt-oss);
    # |safe Markup escaping in `+` (functionary); int dict keys and dictsort (Seed-OSS); tojson of a
    # map() generator (llama.cpp's DeepSeek R1); str.format (Hunyuan); a filter jinja2 does not
    # know inside an if, reached only with tool calls (DeepSeek V3.2's from_json).
    ("openai-gpt-oss-120b", {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"}, {}),
    ("Qwen3-Coder", {"eos_token": "<|im_end|>"}, {}),
    ("GLM-4.6", PLACEHOLDER, {}),
    ("moonshotai-Kimi-K2", PLACEHOLDER, {}),
    ("meetkai-functionary-medium-v3.1", PLACEHOLDER, {}),
    ("ByteDance-Seed-OSS", PLACEHOLDER, {}),
    ("llama-cpp-deepseek-r1", PLACEHOLDER, {}),
    ("tencent-Hy3", PLACEHOLDER, {}),
    ("deepseek-ai-DeepSeek-V3.2", PLACEHOLDER, {}),
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS = [
    ("single_user", [{"role": "user", "content": "Hello! Who are you?"}], {}),
    ("system_user", [{"role": "system", "content": "You are a concise assistant."},
                     {"role": "user", "content": "What is 2+2?"}], {}),
    ("multi_turn_end_assistant", [
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7 is a prime number."},
        {"role": "user", "content": "And an even one?"},
        {"role": "assistant", "content": "2 is the only even prime."},
    ], {}),
    ("multi_turn_end_user", [
        {"role": "user", "content": "Hi", "name": None},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ], {}),
    ("system_multi_turn", [
        {"role": "system", "content": "  Answer in French.  "},
        {"role": "user", "content": "Good morning"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "Thank you"},
        {"role": "assistant", "content": "Merci à vous"},
    ], {}),
    ("unicode", [
        {"role": "user", "content": "Ünïcödé: 日本語のテキスト, emoji 👋🏽 👨‍👩‍👧 and Arabic مرحبا"},
        {"role": "assistant", "content": "Ответ: ✓ — «ok» ☕ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"},
        {"role": "user", "content": "\u00a0\u3000nbsp and ideographic spaces around\u2003\u00a0"},
    ], {}),
    ("jinja_looking", [
        {"role": "user", "content": "Render {{ x }} and {% if y %}literally{% endif %}; {# not a comment #}; quotes ' \" "
                                    "and a backslash \\ and\nnew\nlines\tand a tab"},
        {"role": "assistant", "content": "Sure: {{- y -}} {%- raw %} \\n stays\r\nCRLF done"},
    ], {}),
    ("empty_content", [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Still there?"},
    ], {}),
    ("reasoning", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\nThe answer is 4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "It is 6.", "reasoning_content": "Three plus three is six."},
    ], {}),
    ("whitespace", [
        {"role": "system", "content": "\n\tsystem with tabs\t\n"},
        {"role": "user", "content": "   padded   \n\n"},
        {"role": "assistant", "content": "\n\nleading newlines and trailing spaces   "},
    ], {}),
    ("assistant_first", [
        {"role": "assistant", "content": "I speak first."},
        {"role": "user", "content": "Okay."},
    ], {}),
    ("two_users", [
        {"role": "user", "content": "First question."},
        {"role": "user", "content": "Second question."},
    ], {}),
    ("tool_call", [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
    ], {"tools": TOOLS}),
    ("no_think", [
        {"role": "user", "content": "Quick answer: capital of Italy?"},
        {"role": "assistant", "content": "Rome."},
    ], {"enable_thinking": False}),
]


class FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


def make_tokenizer(special, template):
    vocab = {"<unk>": 0}
    for tok in special.values():
        vocab.setdefault(tok, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template, **special)


def outcome(fn):
    try:
        return {"text": fn()}
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:  # raise_exception() raises exactly this type
            return {"raise": str(e)}
        return {"error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # TypeError, ValueError, ... from the template's Python operations
        return {"error": f"{type(e).__name__}: {e}"}


def spans(render, messages):
    """render_with_spans() of chat_template.h, in UTF-8 byte offsets."""
    full = render(messages, False)
    out = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        if i == 0:
            raise ValueError("message 0 is an assistant message: there is no prompt before it")
        prompt = render(messages[:i], True)
        upto = render(messages[: i + 1], False)
        begin = len(prompt)
        if not upto.startswith(prompt):
            # A generation prompt the finished turn does not repeat (DeepSeek-R1's "<think>\n"):
            # the reply starts where the two part, if that is inside the generation prompt.
            base = render(messages[:i], False)
            k = 0
            while k < min(len(prompt), len(upto)) and prompt[k] == upto[k]:
                k += 1
            if not (prompt.startswith(base) and upto.startswith(base) and k >= len(base)):
                raise ValueError(f"message {i}: render(messages[:{i}], add_generation_prompt=True) is not a prefix of render(messages[:{i + 1}])")
            begin = k
        if not full.startswith(upto):
            raise ValueError(f"message {i}: render(messages[:{i + 1}]) is not a prefix of the whole render")
        out.append([len(upto[:begin].encode("utf-8")), len(upto.encode("utf-8"))])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--templates", default=DEFAULT_TEMPLATES)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    chat_template_utils.datetime = FixedDatetime  # strftime_now() = FIXED_NOW.strftime(fmt)

    tdir = os.path.join(args.out, "templates")
    if os.path.isdir(tdir):
        shutil.rmtree(tdir)
    os.makedirs(tdir)
    golden = {
        "generator": "scripts/golden/make_chat_template_golden.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "fixed_time_utc": int(FIXED_NOW.replace(tzinfo=datetime.timezone.utc).timestamp()),
        "conversations": [{"name": n, "messages": m, "extra": x} for n, m, x in CONVERSATIONS],
        "templates": [],
    }
    for name, special, extra in TEMPLATES:
        stem = name.split("@")[0]
        dst = os.path.join(tdir, stem + ".jinja")
        if stem == "HuggingFaceTB-SmolLM2-Instruct":
            with open(dst, "w", encoding="utf-8", newline="") as f:
                f.write(SMOLLM2_TEMPLATE)
        else:
            shutil.copyfile(os.path.join(args.templates, stem + ".jinja"), dst)
        with open(dst, encoding="utf-8", newline="") as f:
            text = f.read()
        tok = make_tokenizer(special, text)
        entry = {"name": name, "file": "templates/" + stem + ".jinja", "special_tokens": special, "extra": extra,
                 "renders": [], "spans": []}
        for cname, messages, cextra in CONVERSATIONS:
            kwargs = dict(extra)
            kwargs.update(cextra)

            def render(msgs, agp, kwargs=kwargs):
                return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, **kwargs)

            for agp in (False, True):
                r = {"conversation": cname, "add_generation_prompt": agp}
                r.update(outcome(lambda: render(messages, agp)))
                entry["renders"].append(r)
            s = {"conversation": cname}
            try:
                s["spans"] = spans(render, messages)
            except Exception as e:
                s["error"] = f"{type(e).__name__}: {e}"
            entry["spans"].append(s)
        golden["templates"].append(entry)
        n_err = sum(1 for r in entry["renders"] if "text" not in r)
        print(f"{name}: {len(entry['renders'])} renders ({n_err} raise/error), "
              f"{sum(1 for s in entry['spans'] if 'spans' in s)} span sets")

    with open(os.path.join(args.out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "SOURCE.txt"), "w", encoding="utf-8") as f:
        f.write(
            "templates/*.jinja except HuggingFaceTB-SmolLM2-Instruct.jinja: copied byte for byte from the PyPI sdist\n"
            "llama-cpp-python 0.3.36 (llama_cpp_python-0.3.36.tar.gz), path vendor/llama.cpp/models/templates/NAME.jinja\n"
            "(llama.cpp fetched each from the model's tokenizer_config.json / chat_template.jinja on the Hugging Face Hub\n"
            "with scripts/get_chat_template.py; see that folder's README.md).\n"
            "templates/HuggingFaceTB-SmolLM2-Instruct.jinja: the \"chat_template\" string of HuggingFaceTB/SmolLM2-135M-Instruct's\n"
            "tokenizer_config.json (the same for the 360M and 1.7B Instruct models), as quoted verbatim by public code that\n"
            "asserts it against the Hub file (e.g. github.com/biom8er/phymes, a test of load_config on tokenizer_config.json).\n"
            f"golden.json: made by scripts/golden/make_chat_template_golden.py with transformers {transformers.__version__} and\n"
            f"jinja2 {jinja2.__version__} (tokenizer.apply_chat_template(..., tokenize=False)).\n"
        )


if __name__ == "__main__":
    main()
