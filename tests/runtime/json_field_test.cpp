// JsonField (runtime/json_field.h): each read checks its type, and each refusal names the file and
// the value's path in the document.
#include "runtime/json_field.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/test_util.h"
#include "runtime/error.h"
#include "runtime/input_file.h"

namespace qshard {
namespace {

using testing_util::error_of;

const nlohmann::json kDoc = nlohmann::json::parse(R"({
  "model": {"vocab": {"a b": 0, "c": 1}, "merges": ["a b", 7], "n": 3, "big": 18446744073709551615,
            "f": 1.5, "flag": true, "none": null, "s": "text"}
})");

TEST(JsonField, PathsNameEveryStep) {
  const JsonField root(kDoc, "dir/tokenizer.json");
  EXPECT_EQ(root.path(), "");
  EXPECT_EQ(root.where(), "dir/tokenizer.json");
  const JsonField m = root.at("model");
  EXPECT_EQ(m.path(), "model");
  EXPECT_EQ(m.at("vocab").at("a b").path(), R"(model.vocab["a b"])");
  EXPECT_EQ(m.at("vocab").entry("c").path(), R"(model.vocab["c"])");
  EXPECT_EQ(m.at("merges").elements()[1].path(), "model.merges[1]");
  EXPECT_EQ(m.at("merges").elements()[1].where(), "dir/tokenizer.json: model.merges[1]");
  const auto members = m.at("vocab").members();
  ASSERT_EQ(members.size(), 2u);
  EXPECT_EQ(members[0].second.path(), R"(model.vocab["a b"])");
}

TEST(JsonField, MissingAndMistypedValuesAreNamed) {
  const JsonField m = JsonField(kDoc, "t.json").at("model");
  EXPECT_EQ(error_of([&] { JsonField(kDoc, "t.json").at("nope", "an object"); }), "t.json: nope: missing (expected an object)");
  EXPECT_EQ(error_of([&] { m.at("none"); }), "t.json: model.none: missing (expected a value)");  // null is unset
  EXPECT_EQ(error_of([&] { m.at("n").string(); }), "t.json: model.n: expected a string, got 3");
  EXPECT_EQ(error_of([&] { m.at("s").boolean(); }), R"(t.json: model.s: expected true or false, got "text")");
  EXPECT_EQ(error_of([&] { m.at("f").integer(); }), "t.json: model.f: expected an integer, got 1.5");
  EXPECT_EQ(error_of([&] { m.at("n").integer(4, 9); }), "t.json: model.n: expected an integer from 4 to 9, got 3");
  EXPECT_EQ(error_of([&] { m.at("n").integer(4); }), "t.json: model.n: expected an integer >= 4, got 3");
  EXPECT_EQ(error_of([&] { m.at("big").integer(); }), "t.json: model.big: expected an integer, got 18446744073709551615");
  EXPECT_EQ(error_of([&] { m.at("flag").number(); }), "t.json: model.flag: expected a finite number, got true");
  EXPECT_EQ(error_of([&] { m.at("merges").object(); }), R"(t.json: model.merges: expected an object, got ["a b",7])");
  EXPECT_EQ(error_of([&] { m.at("vocab").elements(); }), R"(t.json: model.vocab: expected an array, got {"a b":0,"c":1})");
  EXPECT_EQ(error_of([&] { m.at("s").at("x"); }), R"(t.json: model.s: expected an object, got "text")");
  EXPECT_EQ(error_of([&] { m.at("merges").elements()[1].string(); }), "t.json: model.merges[1]: expected a string, got 7");
  EXPECT_EQ(error_of([&] { m.at("vocab").entry("zz"); }), R"(t.json: model.vocab["zz"]: missing (expected a value))");
  EXPECT_EQ(error_of([&] { m.at("n").fail("is odd"); }), "t.json: model.n: is odd");
  const nlohmann::json inf = {{"x", HUGE_VAL}};  // a program's value (the parse refuses 1e999)
  EXPECT_EQ(error_of([&] { JsonField(inf, "t.json").at("x").number(); }), "t.json: x: expected a finite number, got null");
}

// A syntax error names the file, the line and the column, without nlohmann's tag.
TEST(JsonField, SyntaxErrorsNameTheFileWithoutTheLibraryTag) {
  const std::string e = error_of([] { parse_json_input("{\"a\": ", "dir/generation_config.json"); });
  EXPECT_EQ(e.rfind("dir/generation_config.json: not valid JSON (parse error at line 1, column 7: syntax error", 0), 0u) << e;
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
}

TEST(JsonField, OptionalMembersTakeTheDefaultWhenAbsentOrNull) {
  const JsonField m = JsonField(kDoc, "t.json").at("model");
  EXPECT_EQ(m.string_or("missing", "d"), "d");
  EXPECT_EQ(m.string_or("none", "d"), "d");
  EXPECT_EQ(m.string_or("s", "d"), "text");
  EXPECT_EQ(m.bool_or("flag", false), true);
  EXPECT_EQ(m.integer_or("n", 0, 0, 10), 3);
  EXPECT_EQ(m.number_or("f", 0), 1.5);
  EXPECT_EQ(m.number_or("n", 0), 3.0);
  EXPECT_FALSE(m.find("none").has_value());
  EXPECT_FALSE(m.has("none"));
  EXPECT_TRUE(m.has("s"));
  EXPECT_EQ(error_of([&] { m.bool_or("s", false); }), R"(t.json: model.s: expected true or false, got "text")");
  EXPECT_EQ(error_of([&] { m.integer_or("n", 0, 5, 6); }), "t.json: model.n: expected an integer from 5 to 6, got 3");
  // A long value is cut in the message (on a character boundary).
  const nlohmann::json long_doc = {{"k", std::string(100, 'x') + "\xC3\xA9"}};
  const std::string e = error_of([&] { JsonField(long_doc, "t.json").at("k").integer(); });
  EXPECT_NE(e.find("xxx..."), std::string::npos) << e;
  EXPECT_LT(e.size(), 120u) << e;
  // The ordered document reads the same.
  const nlohmann::ordered_json od = nlohmann::ordered_json::parse(R"({"b": 1, "a": [true]})");
  EXPECT_EQ(error_of([&] { OrderedJsonField(od, "o.json").at("a").elements()[0].string(); }),
            "o.json: a[0]: expected a string, got true");
}

}  // namespace
}  // namespace qshard
