// `qshard tokenize --format chat` (text/byte_tokenizer.h) on a real tokenizer and template: Llama 3's
// tokenizer.json (tests/data/tokenizer) with Llama-3.1-8B-Instruct's chat template
// (tests/data/chat_template): the token file's ids are the rendered conversation's, its targets
// exactly the assistant replies through their end-of-turn token (counted and decoded), each
// conversation one document (version 3 starts), a padded dataset keeps the two apart; bad records
// are named by file:line. ShareGPT and conversational prompt_completion records (text/record_formats.h)
// go through the same path: the same tokens as the chat record they map to, the completion's
// replies the only targets; --preview's exact text on the guide's byte-per-token ChatML tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "runtime/error.h"
#include "text/byte_tokenizer.h"
#include "text/chat_template.h"
#include "text/data_loader.h"
#include "text/hf_tokenizer.h"
#include "text/token_file.h"

namespace qshard {
namespace {

namespace fs = std::filesystem;

struct Folder {
  fs::path dir = fs::temp_directory_path() / ("qshard_chat_tok_" + std::to_string(::getpid()));
  Folder() {
    fs::create_directories(dir);
    fs::copy_file(fs::path(QSHARD_TOKENIZER_DATA) / "llama3" / "tokenizer.json", dir / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(fs::path(QSHARD_CHAT_TEMPLATE_DATA) / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja",
                  dir / "chat_template.jinja", fs::copy_options::overwrite_existing);
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})";
  }
  ~Folder() { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

TEST(ChatTokenize, TargetsAreTheRepliesOnly) {
  Folder f;
  const std::string in = f.file("chat.jsonl"), out = f.file("chat.tok");
  std::ofstream(in) << R"({"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}]})"
                    << "\n\n"
                    << R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3? ü"}, {"role": "assistant", "content": "6 — naturally 😀"}]})"
                    << "\n";
  TokenizeOptions o;
  o.format = InputFormat::kChat;
  o.tokenizer = f.dir.string();
  const TokenizeStats st = tokenize_files({in}, o, out);
  EXPECT_EQ(st.documents, 2);
  const TokenFile tf = TokenFile::open(out);
  ASSERT_TRUE(tf.doc_starts());
  const HfTokenizer tok = HfTokenizer::load(f.dir.string());
  const ChatTemplate tmpl = ChatTemplate::from_model_dir(f.dir.string());
  // Per document: all ids decode to the template's text; the targets decode to the replies.
  std::vector<std::vector<uint32_t>> all(1), targets(1);
  int64_t n_targets = 0;
  for (int64_t i = 0; i < tf.size(); ++i) {
    const uint32_t t = tf[i];
    if ((t & kTokenDocStart) && i > 0) all.emplace_back(), targets.emplace_back();
    const uint32_t id = t & tf.id_bits();
    all.back().push_back(id);
    if (!(t & kTokenNoLoss)) targets.back().push_back(id), ++n_targets;
  }
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(n_targets, st.targets);
  std::ifstream lines(in);
  std::string line;
  std::vector<nlohmann::ordered_json> recs;
  while (std::getline(lines, line))
    if (!line.empty()) recs.push_back(nlohmann::ordered_json::parse(line)["messages"]);
  for (size_t d = 0; d < 2; ++d) {
    EXPECT_EQ(tok.decode(all[d]), tmpl.render(recs[d], false)) << "document " << d;
    std::string replies;
    for (const auto& m : recs[d])
      if (m["role"] == "assistant") replies += m["content"].get<std::string>() + "<|eot_id|>";
    EXPECT_EQ(tok.decode(targets[d]), replies) << "document " << d;
  }
  // The first prompt ends with the generation prompt generate --chat would send.
  const std::string gen = tmpl.render(nlohmann::ordered_json::array({recs[0][0]}), true);
  const std::vector<uint32_t> gen_ids = tok.encode(gen);
  ASSERT_LT(gen_ids.size(), all[0].size());
  EXPECT_TRUE(std::equal(gen_ids.begin(), gen_ids.end(), all[0].begin()));
  // Padded: two sequences, one per conversation.
  const PackedDataset p(tf, 256, false, Packing::kPadded);
  EXPECT_EQ(p.num_sequences(), 2);
}

TEST(ChatTokenize, BadRecordsAreNamed) {
  Folder f;
  const std::string in = f.file("bad.jsonl"), out = f.file("bad.tok");
  auto err = [&](const std::string& body) {
    std::ofstream(in) << body;
    TokenizeOptions o;
    o.format = InputFormat::kChat;
    o.tokenizer = f.dir.string();
    try {
      tokenize_files({in}, o, out);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ok = R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})";
  EXPECT_EQ(err(ok + "\n" + R"({"messages": [{"role": "user", "content": "a"}]})"),
            in + ":2: \"messages\" holds no assistant message: nothing to train on");
  EXPECT_EQ(err(ok + "\n\n" + R"({"messages": [{"role": "user"}]})"), in + ":3: \"messages\"[0] (user) has no string \"content\"");
  EXPECT_EQ(err(R"({"messages": [{"content": "a"}]})"), in + ":1: \"messages\"[0] has no string \"role\"");
  EXPECT_EQ(err(R"({"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]})"),
            in + ":1: \"messages\"[0] is an assistant message: a conversation opens with a system or user message (the "
                 "prompt the reply answers)");
  EXPECT_EQ(err(R"({"messages": []})"), in + ":1: field \"messages\" is an empty conversation: nothing to train on");
  EXPECT_EQ(err(R"({"text": "x"})"), in + ":1: no field \"messages\" (messages {\"role\", \"content\"})");
  EXPECT_FALSE(fs::exists(out));  // nothing written on an error
  TokenizeOptions o;
  o.format = InputFormat::kChat;  // no tokenizer
  EXPECT_THROW(tokenize_files({in}, o, out), InputError);
}

// The targets of each document of a token file, decoded; and all its ids.
struct Documents {
  std::vector<std::vector<uint32_t>> all, targets;
  explicit Documents(const std::string& path) {
    const TokenFile tf = TokenFile::open(path);
    for (int64_t i = 0; i < tf.size(); ++i) {
      const uint32_t t = tf[i];
      if (t & kTokenDocStart) all.emplace_back(), targets.emplace_back();
      all.back().push_back(t & tf.id_bits());
      if (!(t & kTokenNoLoss)) targets.back().push_back(t & tf.id_bits());
    }
  }
};

// A ShareGPT conversation (in a .json array, format detected) is the chat record it maps to, token
// for token and mask for mask.
TEST(ChatTokenize, ShareGptIsTheChatRecordItMapsTo) {
  Folder f;
  const std::string sg = f.file("sg.json"), chat = f.file("c.jsonl");
  std::ofstream(sg) << R"([
  {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "2+2?"},
                     {"from": "gpt", "value": "4"}, {"from": "human", "value": "And 3+3? ü"}, {"from": "gpt", "value": "6 😀"}]},
  {"system": "Answer in French.", "conversations": [{"from": "human", "value": "Hi"}, {"from": "model", "value": "Salut"}]}
])";
  std::ofstream(chat) << R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3? ü"}, {"role": "assistant", "content": "6 😀"}]})"
                      << "\n"
                      << R"({"messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Salut"}]})"
                      << "\n";
  TokenizeOptions o;
  o.tokenizer = f.dir.string();
  std::vector<std::string> said;
  o.on_format = [&](const std::string&, InputFormat format, const std::string&) { said.push_back(input_format_name(format)); };
  const TokenizeStats a = tokenize_files({sg}, o, f.file("sg.tok"));
  const TokenizeStats b = tokenize_files({chat}, o, f.file("c.tok"));
  EXPECT_EQ(said, (std::vector<std::string>{"sharegpt", "chat"}));
  EXPECT_EQ(a.documents, 2);
  EXPECT_EQ(a.targets, b.targets);
  const TokenFile ta = TokenFile::open(f.file("sg.tok")), tb = TokenFile::open(f.file("c.tok"));
  ASSERT_EQ(ta.size(), tb.size());
  for (int64_t i = 0; i < ta.size(); ++i) ASSERT_EQ(ta[i], tb[i]) << "token " << i;
  const HfTokenizer tok = HfTokenizer::load(f.dir.string());
  EXPECT_EQ(tok.decode(Documents(f.file("sg.tok")).targets[1]), "Salut<|eot_id|>");
}

// Conversational prompt/completion: the prompt's and the completion's messages rendered as one
// conversation (the same ids as the chat record of all of them); only the completion's reply is a
// target, not the assistant message inside the prompt.
TEST(ChatTokenize, ConversationalPromptCompletionTrainsTheCompletionOnly) {
  Folder f;
  const std::string pc = f.file("pc.jsonl"), chat = f.file("c.jsonl");
  const std::string prompt =
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}])";
  const std::string completion = R"([{"role": "assistant", "content": "6, I think"}])";
  std::ofstream(pc) << R"({"prompt": )" << prompt << R"(, "completion": )" << completion << "}\n";
  std::ofstream(chat) << R"({"messages": )" << prompt.substr(0, prompt.size() - 1) << ", " << completion.substr(1) << "}\n";
  TokenizeOptions o;
  o.tokenizer = f.dir.string();
  const TokenizeStats a = tokenize_files({pc}, o, f.file("pc.tok"));
  tokenize_files({chat}, o, f.file("c.tok"));
  const Documents da(f.file("pc.tok")), db(f.file("c.tok"));
  ASSERT_EQ(da.all.size(), 1u);
  EXPECT_EQ(da.all, db.all);  // the same conversation
  const HfTokenizer tok = HfTokenizer::load(f.dir.string());
  EXPECT_EQ(tok.decode(da.targets[0]), "6, I think<|eot_id|>");
  EXPECT_EQ(tok.decode(db.targets[0]), "4<|eot_id|>6, I think<|eot_id|>");
  EXPECT_EQ(a.targets, static_cast<int64_t>(da.targets[0].size()));
  // The string form on a model tokenizer: BOS + prompt (context) + completion + EOS (targets).
  std::ofstream(pc) << R"({"prompt": "Q: 2+2?\nA:", "completion": " 4"})" << "\n";
  tokenize_files({pc}, o, f.file("pc2.tok"));
  const Documents ds(f.file("pc2.tok"));
  EXPECT_EQ(tok.decode(ds.all[0]), "<|begin_of_text|>Q: 2+2?\nA: 4<|eot_id|>");
  EXPECT_EQ(tok.decode(ds.targets[0]), " 4<|eot_id|>");
}

// A template with {% generation %} blocks: the blocks are the targets (transformers'
// return_assistant_tokens_mask), and a conversational prompt/completion trains only the completion's.
TEST(ChatTokenize, GenerationBlocksAreTheTargets) {
  Folder f;
  std::ofstream(f.dir / "chat_template.jinja")
      << "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
         "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|eot_id|>{% endgeneration %}"
         "{% else %}{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
  const std::string chat = f.file("c.jsonl"), pc = f.file("pc.jsonl");
  std::ofstream(chat) << R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, )"
                      << R"({"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]})" << "\n";
  std::ofstream(pc) << R"({"prompt": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, )"
                    << R"({"role": "user", "content": "3+3?"}], "completion": [{"role": "assistant", "content": "6"}]})" << "\n";
  TokenizeOptions o;
  o.tokenizer = f.dir.string();
  tokenize_files({chat}, o, f.file("c.tok"));
  tokenize_files({pc}, o, f.file("pc.tok"));
  const Documents dc(f.file("c.tok")), dp(f.file("pc.tok"));
  EXPECT_EQ(dc.all, dp.all);
  const HfTokenizer tok = HfTokenizer::load(f.dir.string());
  EXPECT_EQ(tok.decode(dc.targets[0]), "4<|eot_id|>6<|eot_id|>");
  EXPECT_EQ(tok.decode(dp.targets[0]), "6<|eot_id|>");
}

TEST(ChatTokenize, ShareGptErrorsNameFileLineAndElement) {
  Folder f;
  const std::string in = f.file("bad.json");
  std::ofstream(in) << "[\n"
                    << R"({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},)" << "\n"
                    << R"({"conversations": [{"from": "human", "value": "a"}, {"from": "bing", "value": "b"}]}])";
  TokenizeOptions o;
  o.tokenizer = f.dir.string();
  try {
    tokenize_files({in}, o, f.file("bad.tok"));
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), in + ":3 (element 1): \"conversations\"[1]: \"from\" is \"bing\", not a ShareGPT role "
                                          "(known: human, user, gpt, assistant, model, system, tool, function, observation)");
  }
  EXPECT_FALSE(fs::exists(f.file("bad.tok")));
}

// --preview on the guide's tokenizer (every byte one token, ChatML markers, SmolLM2's template, which
// adds its default system prompt): the exact text, the reply through its end-of-turn marked, counts.
TEST(ChatTokenize, PreviewMarksTheReplies) {
  const std::string model = std::string(QSHARD_SOURCE_DIR) + "/data/guide";
  Folder f;
  const std::string in = f.file("p.jsonl");
  std::ofstream(in) << R"({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]})" << "\n"
                    << R"({"conversations": [{"from": "human", "value": "never shown"}]})" << "\n";
  TokenizeOptions o;
  o.tokenizer = model;
  const std::string system = "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face";
  const std::string context = "<|im_start|>" + system + "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  const size_t masked = 5 + system.size() + 1 + std::string("user\nHi").size() + 1 + std::string("assistant\n").size();
  EXPECT_EQ(preview_files({in}, o, 1),
            "--- sample 1 (" + in + ":1): " + std::to_string(masked + 7) + " tokens, 7 trained, " + std::to_string(masked) +
                " masked\n" + context + "[[Hello<|im_end|>\n]]\n");
}

}  // namespace
}  // namespace qshard
