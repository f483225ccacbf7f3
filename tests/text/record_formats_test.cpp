// The record formats of `qshard tokenize` without a model tokenizer (text/record_formats.h,
// text/json_record_reader.h, text/byte_tokenizer.h): JSON array files streamed element by element,
// format detection from the first record's keys, prompt_completion's masking token by token,
// ShareGPT's role mapping and every format's errors by file:line and field, and --preview's text.
// The chat-template side (sharegpt and conversational prompt_completion rendered and trained):
// tests/text/chat_tokenize_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/test_util.h"
#include "runtime/error.h"
#include "text/byte_tokenizer.h"
#include "text/json_record_reader.h"
#include "text/record_formats.h"
#include "text/token_file.h"

namespace qshard {
namespace {

using testing_util::error_of;
using testing_util::TempDir;
using testing_util::write_bytes;

std::vector<uint32_t> read_all(const std::string& path) {
  const TokenFile f = TokenFile::open(path);
  return {f.tokens().begin(), f.tokens().end()};
}

// All records of a file: (where, record) pairs.
std::vector<std::pair<std::string, nlohmann::ordered_json>> records_of(const std::string& path, int64_t max = 1 << 20) {
  JsonRecordReader r(path, max, "--max-record-bytes");
  std::vector<std::pair<std::string, nlohmann::ordered_json>> out;
  nlohmann::ordered_json rec;
  std::string where;
  while (r.next(rec, where)) out.emplace_back(where, rec);
  return out;
}

TEST(JsonArray, ElementsAreCutOutsideStrings) {
  TempDir dir;
  const std::string f = dir.file("a.json");
  // Brackets, braces, commas and escaped quotes inside strings; nested containers; odd whitespace.
  write_bytes(f,
              " \r\n[\n"
              "  {\"text\": \"a ] } [ { , \\\" \\\\\"},\n"
              "\t{\"text\": \"b\", \"n\": [1, {\"x\": \"]\"}, []], \"o\": {\"k\": {}}}\n"
              " ,{\"text\":\"c\\\"]\"}\n"
              "]\n\n");
  const auto recs = records_of(f);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].first, f + ":3 (element 0)");  // the line the element starts on
  EXPECT_EQ(recs[0].second["text"], "a ] } [ { , \" \\");
  EXPECT_EQ(recs[1].first, f + ":4 (element 1)");
  EXPECT_EQ(recs[1].second["n"][1]["x"], "]");
  EXPECT_EQ(recs[2].first, f + ":5 (element 2)");
  EXPECT_EQ(recs[2].second["text"], "c\"]");
  // Keys stay in file order (a template iterating a dict sees them as written).
  EXPECT_EQ(recs[1].second.begin().key(), "text");
  EXPECT_EQ(std::next(recs[1].second.begin()).key(), "n");

  // One object is one record, pretty-printed or not; objects one after another (JSON Lines named .json) too.
  write_bytes(f, "{\n  \"text\": \"x\"\n}\n");
  ASSERT_EQ(records_of(f).size(), 1u);
  write_bytes(f, "{\"text\": \"x\"}\n{\"text\": \"y\"}\n\n{\"text\": \"z\"}");
  const auto lines = records_of(f);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2].first, f + ":4");
  write_bytes(f, "\xEF\xBB\xBF[{\"text\": \"bom\"}]");  // a byte order mark first
  EXPECT_EQ(records_of(f).at(0).second["text"], "bom");
  write_bytes(f, " [ ] ");
  EXPECT_TRUE(records_of(f).empty());
  write_bytes(f, "");
  EXPECT_TRUE(records_of(f).empty());
}

TEST(JsonArray, MalformedArraysAreRefused) {
  TempDir dir;
  const std::string f = dir.file("t.json");
  auto err = [&](const std::string& body) {
    write_bytes(f, body);
    return error_of([&] { records_of(f); });
  };
  EXPECT_EQ(err("[{\"text\": \"a\"},\n {\"text\": \"b"),
            f + ": the file ends inside the record starting at line 2 (element 1): the JSON is truncated (an unfinished "
                "download or copy?)");
  EXPECT_NE(err("[{\"text\": \"a\"}").find("ends after element 0 (line 1), before the array's closing ']'"), std::string::npos);
  EXPECT_NE(err("[{\"text\": \"a\"},\n").find("ends after the ',' that follows element 0"), std::string::npos);
  EXPECT_NE(err("[").find("ends after the array's opening '['"), std::string::npos);
  EXPECT_EQ(err("[{\"text\": \"a\"},\n]"), f + ":2: a ',' with no element after it (element 1)");
  EXPECT_EQ(err("[{\"text\": \"a\"} {\"text\": \"b\"}]"), f + ":1: expected ',' or ']' after element 0, found '{'");
  EXPECT_EQ(err("[{\"text\": \"a\"}]\n[]"), f + ":2: '[' after the top-level array's closing ']' (a .json file holds one array)");
  EXPECT_EQ(err("\n\"text\""), f + ":2: expected a JSON array of records ('[') or JSON objects ('{'), found '\"'");
  EXPECT_EQ(err("[{\"text\": \"a\"}, 5]"), f + ":1 (element 1): the element is number, expected a JSON object (one record)");
  EXPECT_EQ(err("[{\"text\": \"a\"},\n\n {\"text\": tru}]").rfind(f + ":3 (element 1): ", 0), 0u);
}

// An element over max_record_bytes is refused by its index after about the limit of it is read:
// the rest of the file (megabytes more) is never scanned.
TEST(JsonArray, OversizedElementRefusedWithoutReadingTheRest) {
  TempDir dir;
  const std::string f = dir.file("big.json");
  const std::string small = "{\"text\": \"ok\"}";
  std::string body = "[" + small + ",\n" + small + ",\n{\"text\": \"" + std::string(100000, 'x') + "\"}";
  for (int i = 0; i < 40000; ++i) body += ",\n{\"text\": \"" + std::string(100, 'y') + "\"}";  // ~4 MB after it
  body += "]";
  write_bytes(f, body);
  JsonRecordReader r(f, 4096, "--max-record-bytes");
  nlohmann::ordered_json rec;
  std::string where;
  ASSERT_TRUE(r.next(rec, where));
  ASSERT_TRUE(r.next(rec, where));
  EXPECT_EQ(error_of([&] { r.next(rec, where); }),
            f + ":3 (element 2): a record longer than 4096 bytes (--max-record-bytes): refused before it is read whole; "
                "split it or raise --max-record-bytes");
  const int64_t before = static_cast<int64_t>(1 + 2 * (small.size() + 2));
  EXPECT_EQ(r.bytes_scanned(), before + 4096 + 1);  // the limit plus the byte that broke it
  // Through tokenize_files: the same error, no output; an element of exactly the limit loads.
  TokenizeOptions o;
  o.max_record_bytes = 4096;
  EXPECT_EQ(error_of([&] { tokenize_files({f}, o, dir.file("o.tok")); }).rfind(f + ":3 (element 2): a record longer", 0), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir.file("o.tok")));
  o.max_record_bytes = static_cast<int64_t>(small.size());
  write_bytes(f, "[" + small + ", " + small + "]");
  EXPECT_EQ(tokenize_files({f}, o, dir.file("o.tok")).documents, 2);
}

// A record that repeats a key (two "messages", two "role"s in a message) is refused by file:line
// (or element) and the key's path: which value counts would be a guess.
TEST(JsonArray, DuplicateKeysAreRefusedByLine) {
  TempDir dir;
  const std::string f = dir.file("chat.jsonl");
  write_bytes(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n"
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"messages\": []}\n");
  EXPECT_EQ(error_of([&] { records_of(f); }).rfind(f + ":2: duplicate key \"messages\"", 0), 0u);
  write_bytes(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"role\": \"assistant\"}]}\n");
  EXPECT_EQ(error_of([&] { records_of(f); }).rfind(f + ":1: duplicate key \"messages[0].role\"", 0), 0u);
  const std::string a = dir.file("chat.json");
  write_bytes(a, "[{\"text\": \"x\"},\n {\"text\": \"y\", \"text\": \"z\"}]");
  EXPECT_EQ(error_of([&] { records_of(a); }).rfind(a + ":2 (element 1): duplicate key \"text\"", 0), 0u);
}

TEST(RecordFormats, DetectedFromTheFirstRecordsKeys) {
  const std::string w = "x.jsonl:1";
  auto detect = [&](const char* json, const std::string& field = "text") {
    return detect_format(nlohmann::ordered_json::parse(json), field, w);
  };
  EXPECT_EQ(detect(R"({"messages": [], "text": "t"})"), InputFormat::kChat);
  EXPECT_EQ(detect(R"({"id": 1, "conversations": []})"), InputFormat::kShareGpt);
  EXPECT_EQ(detect(R"({"instruction": "i", "input": "", "output": "o"})"), InputFormat::kAlpaca);
  EXPECT_EQ(detect(R"({"prompt": "p", "completion": "c"})"), InputFormat::kPromptCompletion);
  EXPECT_EQ(detect(R"({"prompt": [], "completion": []})"), InputFormat::kPromptCompletion);
  EXPECT_EQ(detect(R"({"text": "t"})"), InputFormat::kJsonl);
  EXPECT_EQ(detect(R"({"body": "t"})", "body"), InputFormat::kJsonl);
  EXPECT_EQ(error_of([&] { detect(R"({"instruction": "i", "response": "r"})"); }),
            "x.jsonl:1: cannot tell the format from the first record's keys (\"instruction\", \"response\"): known are "
            "chat (\"messages\"), sharegpt (\"conversations\"), alpaca (\"instruction\" + \"output\"), prompt_completion "
            "(\"prompt\" + \"completion\") and jsonl (\"text\", set by --field); name one with --format");
  EXPECT_NE(error_of([&] { detect("{}"); }).find("keys (none)"), std::string::npos);

  // --format auto through tokenize_files: the choice is reported per file, text by extension.
  TempDir dir;
  write_bytes(dir.file("a.json"), R"([{"instruction": "i", "output": "o"}])");
  write_bytes(dir.file("p.jsonl"), R"({"prompt": "p", "completion": "c"})");
  write_bytes(dir.file("t.jsonl"), R"({"text": "t"})");
  write_bytes(dir.file("n.txt"), R"({"prompt": "p", "completion": "c"})");
  TokenizeOptions o;
  std::vector<std::string> said;
  o.on_format = [&](const std::string& path, InputFormat format, const std::string& how) {
    said.push_back(std::filesystem::path(path).filename().string() + " " + input_format_name(format) + " " + how);
  };
  const TokenizeStats st =
      tokenize_files({dir.file("a.json"), dir.file("p.jsonl"), dir.file("t.jsonl"), dir.file("n.txt")}, o, dir.file("o.tok"));
  EXPECT_EQ(said, (std::vector<std::string>{"a.json alpaca detected from the first record's keys",
                                            "p.jsonl prompt_completion detected from the first record's keys",
                                            "t.jsonl jsonl detected from the first record's keys",
                                            "n.txt text not .jsonl / .json"}));
  EXPECT_EQ(st.documents, 4);
  EXPECT_EQ(st.targets, (1 + 1) + (1 + 1) + (1 + 1 + 1) + (34 + 2));  // o+EOS, c+EOS, BOS+t+EOS, the text file
  // A chat-like format found without --tokenizer: refused naming the file and the format.
  write_bytes(dir.file("s.jsonl"), R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]})");
  EXPECT_EQ(error_of([&] { tokenize_files({dir.file("s.jsonl")}, {}, dir.file("s.tok")); }),
            dir.file("s.jsonl") + ": format sharegpt is rendered by a chat template: give --tokenizer, a model folder "
                                  "with tokenizer.json and a chat template");
  o.format = InputFormat::kShareGpt;
  EXPECT_NE(error_of([&] { tokenize_files({dir.file("s.jsonl")}, o, dir.file("s.tok")); }).find("--format sharegpt needs --tokenizer"),
            std::string::npos);
  EXPECT_EQ(parse_input_format("sharegpt"), InputFormat::kShareGpt);
  EXPECT_EQ(parse_input_format("prompt_completion"), InputFormat::kPromptCompletion);
  EXPECT_NE(error_of([] { parse_input_format("openai"); }).find("expected one of auto, text, jsonl, alpaca, chat, sharegpt, prompt_completion"),
            std::string::npos);
}

// TRL's prompt-completion: BOS + prompt as context, the completion and EOS trained, token by token.
TEST(RecordFormats, PromptCompletionMasksThePrompt) {
  TempDir dir;
  const std::string in = dir.file("pc.json"), out = dir.file("pc.tok");
  write_bytes(in, R"([{"prompt": "Q?", "completion": "Ab"}, {"prompt": "", "completion": "z", "extra": 1}])");
  TokenizeOptions o;
  o.format = InputFormat::kPromptCompletion;
  const TokenizeStats st = tokenize_files({in}, o, out);
  constexpr uint32_t N = kTokenNoLoss, S = kTokenDocStart;
  EXPECT_EQ(read_all(out), (std::vector<uint32_t>{kByteBos | N | S, 'Q' | N, '?' | N, 'A', 'b', kByteEos,  //
                                                  kByteBos | N | S, 'z', kByteEos}));
  EXPECT_EQ(st.targets, 3 + 2);
  EXPECT_EQ(st.documents, 2);
  // Alpaca in a .json array reads the same as from JSONL.
  write_bytes(in, R"([{"instruction": "Say hi", "output": "hi"}])");
  o.format = InputFormat::kAlpaca;
  tokenize_files({in}, o, out);
  const std::vector<uint32_t> t = read_all(out);
  const std::string prompt = alpaca_prompt("Say hi", "");
  ASSERT_EQ(t.size(), 1 + prompt.size() + 2 + 1);
  EXPECT_EQ(t[prompt.size()], uint32_t{'\n'} | N);
  EXPECT_EQ(t[prompt.size() + 1], uint32_t{'h'});
}

TEST(RecordFormats, PromptCompletionErrorsNameTheField) {
  const std::string w = "d.jsonl:7";
  auto err = [&](const char* json) {
    nlohmann::ordered_json r = nlohmann::ordered_json::parse(json);
    return error_of([&] { record_sample(InputFormat::kPromptCompletion, r, "text", w); });
  };
  EXPECT_EQ(err(R"({"completion": "c"})"), w + ": no field \"prompt\" (prompt_completion records have \"prompt\" and \"completion\")");
  EXPECT_EQ(err(R"({"prompt": "p"})"), w + ": no field \"completion\" (prompt_completion records have \"prompt\" and \"completion\")");
  EXPECT_EQ(err(R"({"prompt": "p", "completion": ""})"), w + ": field \"completion\" is empty: nothing to train on");
  EXPECT_EQ(err(R"({"prompt": "p", "completion": 3})"),
            w + ": \"prompt\" is a string and \"completion\" number: expected two strings (prompt-completion) or two lists "
                "of messages (conversational prompt-completion)");
  EXPECT_EQ(err(R"({"prompt": [{"role": "user", "content": "a"}], "completion": "b"})").rfind(w + ": \"prompt\" is a list and \"completion\" a string", 0), 0u);
  EXPECT_EQ(err(R"({"prompt": [], "completion": [{"role": "assistant", "content": "b"}]})"), w + ": field \"prompt\" is an empty list of messages");
  EXPECT_EQ(err(R"({"prompt": [{"role": "user", "content": "a"}], "completion": [{"role": "user", "content": "b"}]})"),
            w + ": \"completion\" holds no assistant message: nothing to train on");
  EXPECT_EQ(err(R"({"prompt": [{"role": "user"}], "completion": [{"role": "assistant", "content": "b"}]})"),
            w + ": \"prompt\"[0] (user) has no string \"content\"");
  EXPECT_EQ(err(R"({"prompt": [{"role": "assistant", "content": "a"}], "completion": [{"role": "assistant", "content": "b"}]})"),
            w + ": \"prompt\"[0] is an assistant message: a conversation opens with a system or user message (the prompt "
                "the reply answers)");
  // A good conversational record: prompt then completion messages, the completion's replies trained.
  const std::string conversational =
      R"({"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], )"
      R"("completion": [{"role": "assistant", "content": "d"}]})";
  nlohmann::ordered_json r = nlohmann::ordered_json::parse(conversational);
  const Sample s = record_sample(InputFormat::kPromptCompletion, r, "text", w);
  EXPECT_EQ(s.kind, Sample::Kind::kChat);
  ASSERT_EQ(s.messages.size(), 4u);
  EXPECT_EQ(s.messages[3]["content"], "d");
  EXPECT_EQ(s.first_trained, 3u);
  // Without --tokenizer the conversational form is refused at its record.
  TempDir dir;
  write_bytes(dir.file("c.jsonl"), R"({"prompt": "p", "completion": "c"})" "\n" + conversational + "\n");
  EXPECT_EQ(error_of([&] { tokenize_files({dir.file("c.jsonl")}, {}, dir.file("c.tok")); }),
            dir.file("c.jsonl") + ":2: this record is rendered by a chat template: give --tokenizer, a model folder with "
                                  "tokenizer.json and a chat template");
}

TEST(RecordFormats, ShareGptRolesAndErrors) {
  for (const auto& [from, role] : std::vector<std::pair<std::string, std::string>>{
           {"human", "user"}, {"user", "user"}, {"gpt", "assistant"}, {"assistant", "assistant"}, {"model", "assistant"},
           {"system", "system"}, {"tool", "tool"}, {"function", "tool"}, {"observation", "tool"}, {"bot", ""}, {"Human", ""}})
    EXPECT_EQ(sharegpt_role(from), role) << from;
  const std::string w = "s.json:4 (element 2)";
  nlohmann::ordered_json r = nlohmann::ordered_json::parse(
      R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "H", "weight": 0},
          {"from": "gpt", "value": "G"}, {"from": "observation", "value": "O"}, {"from": "model", "value": "M"}]})");
  const Sample s = record_sample(InputFormat::kShareGpt, r, "text", w);
  EXPECT_EQ(s.kind, Sample::Kind::kChat);
  EXPECT_EQ(s.first_trained, 0u);
  EXPECT_EQ(s.messages, nlohmann::ordered_json::parse(
                            R"([{"role": "system", "content": "S"}, {"role": "user", "content": "H"},
                                {"role": "assistant", "content": "G"}, {"role": "tool", "content": "O"},
                                {"role": "assistant", "content": "M"}])"));
  // A "system" column beside the conversation opens it, unless the conversation has its own.
  nlohmann::ordered_json r2 = nlohmann::ordered_json::parse(
      R"({"system": "Be kind.", "conversations": [{"from": "human", "value": "H"}, {"from": "gpt", "value": "G"}]})");
  EXPECT_EQ(record_sample(InputFormat::kShareGpt, r2, "text", w).messages[0],
            nlohmann::ordered_json::parse(R"({"role": "system", "content": "Be kind."})"));
  nlohmann::ordered_json r3 = nlohmann::ordered_json::parse(
      R"({"system": "x", "conversations": [{"from": "system", "value": "own"}, {"from": "human", "value": "H"}, {"from": "gpt", "value": "G"}]})");
  const Sample s3 = record_sample(InputFormat::kShareGpt, r3, "text", w);
  ASSERT_EQ(s3.messages.size(), 3u);
  EXPECT_EQ(s3.messages[0]["content"], "own");

  auto err = [&](const char* json) {
    nlohmann::ordered_json rec = nlohmann::ordered_json::parse(json);
    return error_of([&] { record_sample(InputFormat::kShareGpt, rec, "text", w); });
  };
  EXPECT_EQ(err(R"({"conversations": [{"from": "human", "value": "a"}, {"from": "bot", "value": "b"}]})"),
            w + ": \"conversations\"[1]: \"from\" is \"bot\", not a ShareGPT role (known: human, user, gpt, assistant, "
                "model, system, tool, function, observation)");
  EXPECT_EQ(err(R"({"conversations": [{"from": "human", "value": "a"}, {"value": "b"}]})"),
            w + ": \"conversations\"[1] has no string \"from\"");
  EXPECT_EQ(err(R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": null}]})"),
            w + ": \"conversations\"[1] (gpt) has no string \"value\"");
  EXPECT_EQ(err(R"({"conversations": []})"), w + ": field \"conversations\" is an empty conversation: nothing to train on");
  EXPECT_EQ(err(R"({"conversations": {"from": "human"}})"),
            w + ": field \"conversations\" is object, expected a list of messages {\"from\", \"value\"}");
  EXPECT_EQ(err(R"({"messages": []})"), w + ": no field \"conversations\" (messages {\"from\", \"value\"})");
  EXPECT_EQ(err(R"({"conversations": [{"from": "human", "value": "a"}]})"),
            w + ": \"conversations\" holds no assistant message: nothing to train on");
  EXPECT_EQ(err(R"({"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "b"}]})"),
            w + ": \"conversations\"[0] is an assistant message: a conversation opens with a system or user message "
                "(the prompt the reply answers)");
  EXPECT_EQ(err(R"({"conversations": [[1]]})"),
            w + ": \"conversations\"[0] is array, expected a message object {\"from\", \"value\"}");
  EXPECT_EQ(err(R"({"system": 1, "conversations": [{"from": "human", "value": "a"}]})"),
            w + ": field \"system\" is number, expected a string (the system prompt)");
}

// --preview: the tokens decoded, the trained runs between the markers, the counts per sample; the
// walk stops after N samples and nothing is written.
TEST(RecordFormats, PreviewShowsTheTrainedSpans) {
  TempDir dir;
  const std::string in = dir.file("a.jsonl");
  write_bytes(in, "{\"instruction\": \"Say hi\", \"output\": \"hi!\"}\n\n"
                  "{\"instruction\": \"Add\", \"input\": \"2+2\", \"output\": \"4\"}\n"
                  "{\"instruction\": \"never shown\"}\n");  // a bad third record: not reached
  TokenizeOptions o;
  const std::string p1 = alpaca_prompt("Say hi", ""), p2 = alpaca_prompt("Add", "2+2");
  const std::string got = preview_files({in}, o, 2);
  EXPECT_EQ(got, "--- sample 1 (" + in + ":1): " + std::to_string(p1.size() + 5) + " tokens, 4 trained, " +
                     std::to_string(p1.size() + 1) + " masked\n<bos>" + p1 + "[[hi!<eos>]]\n" +
                     "--- sample 2 (" + in + ":3): " + std::to_string(p2.size() + 3) + " tokens, 2 trained, " +
                     std::to_string(p2.size() + 1) + " masked\n<bos>" + p2 + "[[4<eos>]]\n");
  EXPECT_NE(preview_files({in}, o, 1, PreviewMarkers{"<", ">"}).find(p1 + "<hi!<eos>>\n"), std::string::npos);
  // Text paragraphs: all trained; named by their first line.
  const std::string txt = dir.file("t.txt");
  write_bytes(txt, "one\n\ntwo\nlines\n");
  o.text_split = TextSplit::kBlankLines;
  EXPECT_EQ(preview_files({txt}, o, 5),
            "--- sample 1 (" + txt + ":1): 5 tokens, 5 trained, 0 masked\n[[<bos>one<eos>]]\n"
            "--- sample 2 (" + txt + ":3): 11 tokens, 11 trained, 0 masked\n[[<bos>two\nlines<eos>]]\n");
  EXPECT_NE(error_of([&] { preview_files({in}, o, 0); }).find("--preview"), std::string::npos);
  write_bytes(in, "\n");
  EXPECT_EQ(preview_files({in}, {}, 3), "(no samples: the inputs hold no records)\n");
}

}  // namespace
}  // namespace qshard
