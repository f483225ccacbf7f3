// `qshard tokenize --format chat` (text/byte_tokenizer.h) on a real tokenizer and template: Llama 3's
// tokenizer.json (tests/data/tokenizer) with Llama-3.1-8B-Instruct's chat template
// (tests/data/chat_template): the token file's ids are the rendered conversation's, its targets
// exactly the assistant replies through their end-of-turn token (counted and decoded), each
// conversation one document (version 3 starts), a padded dataset keeps the two apart; bad records
// are named by file:line.
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
  EXPECT_NE(err(ok + "\n" + R"({"messages": [{"role": "user", "content": "a"}]})").find(":2: no assistant"),
            std::string::npos);
  EXPECT_NE(err(ok + "\n\n" + R"({"messages": [{"role": "user"}]})").find(":3: message 0"), std::string::npos);
  EXPECT_NE(err(R"({"text": "x"})").find(":1: expected a field \"messages\""), std::string::npos);
  EXPECT_FALSE(fs::exists(out));  // nothing written on an error
  TokenizeOptions o;
  o.format = InputFormat::kChat;  // no tokenizer
  EXPECT_THROW(tokenize_files({in}, o, out), InputError);
}

}  // namespace
}  // namespace qshard
