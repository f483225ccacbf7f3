// Numbers from a user (runtime/numbers.h): each bad form - empty, junk before or after, a
// fraction or exponent where an integer is wanted, hex, out of the type's range, NaN, infinity,
// below or above the range, the open lower end - is an InputError naming the flag, the value and
// the range; good forms parse to their value. Also QSHARD_COLLECTIVE_TIMEOUT_S's parse
// (runtime/failure.h): 0 = off, [1, 86400] else, 0.001 refused.
#include "runtime/numbers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "runtime/error.h"
#include "runtime/failure.h"

namespace qshard {
namespace {

// The message of the InputError `f` throws ("" when it throws none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Numbers, IntGoodForms) {
  EXPECT_EQ(parse_int("--n", "0", 0, 10), 0);
  EXPECT_EQ(parse_int("--n", "10", 0, 10), 10);
  EXPECT_EQ(parse_int("--n", "-1", -1, 10), -1);
  EXPECT_EQ(parse_int("--n", "007", 0, 10), 7);
  EXPECT_EQ(parse_int("--seed", "9223372036854775807", 0, INT64_MAX), INT64_MAX);
}

TEST(Numbers, IntBadFormsNameFlagValueAndRange) {
  for (const char* bad : {"", "abc", "1.5", "1e12", "0x10", " 5", "5 ", "5x", "--5", "+", "-"}) {
    const std::string msg = error_of([&] { parse_int("--max-new-tokens", bad, 0, 1000); });
    std::printf("'%s' -> %s\n", bad, msg.c_str());
    EXPECT_NE(msg.find("--max-new-tokens '" + std::string(bad) + "'"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("expected an integer in [0, 1000]"), std::string::npos) << bad << ": " << msg;
  }
  EXPECT_NE(error_of([] { parse_int("--n", "9223372036854775808", 0, 10); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([] { parse_int("--n", "11", 0, 10); }), "");
  EXPECT_NE(error_of([] { parse_int("--n", "-1", 0, 10); }), "");
  EXPECT_EQ(error_of([] { parse_int("--n", "-1", 0, 10); }), "--n '-1': expected an integer in [0, 10]");
  EXPECT_NE(error_of([] { parse_int("--n", "1.5", 0, 10); }).find("not an integer"), std::string::npos);
}

TEST(Numbers, DoubleGoodForms) {
  EXPECT_EQ(parse_double("--t", "0", 0, 100), 0.0);
  EXPECT_EQ(parse_double("--t", "0.7", 0, 100), 0.7);
  EXPECT_EQ(parse_double("--t", "1e2", 0, 100), 100.0);
  EXPECT_EQ(parse_double("--t", "-2.5", -3, 0), -2.5);
  EXPECT_EQ(parse_double("--p", "1", 0, 1, Bound::kOpen), 1.0);
  EXPECT_EQ(parse_double("--gb", "1e-6", 1e-6, 1e6), 1e-6);
}

TEST(Numbers, DoubleBadFormsNameFlagValueAndRange) {
  for (const char* bad : {"", "abc", "nan", "NaN", "inf", "-inf", "1e999", "0.5x", " 1", "1 ", "0x1p3", "1,5"}) {
    const std::string msg = error_of([&] { parse_double("--top-p", bad, 0, 1, Bound::kOpen); });
    std::printf("'%s' -> %s\n", bad, msg.c_str());
    EXPECT_NE(msg.find("--top-p '" + std::string(bad) + "'"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("expected a number in (0, 1]"), std::string::npos) << bad << ": " << msg;
  }
  for (const char* bad : {"nan", "inf", "-inf"})  // named as such, not only as out of range
    EXPECT_NE(error_of([&] { parse_double("--t", bad, -1e300, 1e300); }).find("not a finite number"), std::string::npos);
  EXPECT_NE(error_of([] { parse_double("--t", "1e999", 0, 1); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([] { parse_double("--p", "0", 0, 1, Bound::kOpen); }), "");  // the open end
  EXPECT_EQ(error_of([] { parse_double("--p", "0", 0, 1); }), "");                 // the closed end
  EXPECT_NE(error_of([] { parse_double("--p", "1.0000001", 0, 1); }), "");
  EXPECT_EQ(error_of([] { parse_double("--gb", "1e-12", 1e-6, 1e6); }), "--gb '1e-12': expected a number in [1e-06, 1e+06]");
}

TEST(Numbers, CheckTypedValues) {
  EXPECT_EQ(error_of([] { check_int("bench --vocab", 0, 0, 100); }), "");
  EXPECT_EQ(error_of([] { check_int("bench --vocab", -5, 0, 100); }), "bench --vocab '-5': expected an integer in [0, 100]");
  EXPECT_NE(error_of([] { check_double("--temperature", std::nan(""), 0, 100); }), "");
  EXPECT_NE(error_of([] { check_double("--temperature", INFINITY, 0, 100); }), "");
  EXPECT_NE(error_of([] { check_double("--top-p", 0.0, 0, 1, Bound::kOpen); }), "");
  EXPECT_EQ(error_of([] { check_double("--top-p", 1.0, 0, 1, Bound::kOpen); }), "");
}

TEST(Numbers, CollectiveTimeoutVariable) {
  EXPECT_EQ(parse_collective_timeout_s(nullptr), kDefaultCollectiveTimeoutS);
  EXPECT_EQ(parse_collective_timeout_s(""), kDefaultCollectiveTimeoutS);
  EXPECT_EQ(parse_collective_timeout_s("0"), 0.0);
  EXPECT_EQ(parse_collective_timeout_s("1"), 1.0);
  EXPECT_EQ(parse_collective_timeout_s("86400"), 86400.0);
  for (const char* bad : {"0.001", "0.5", "-1", "nan", "inf", "86401", "10s", "abc"}) {
    const std::string msg = error_of([&] { parse_collective_timeout_s(bad); });
    std::printf("QSHARD_COLLECTIVE_TIMEOUT_S='%s' -> %s\n", bad, msg.c_str());
    EXPECT_NE(msg.find("QSHARD_COLLECTIVE_TIMEOUT_S"), std::string::npos) << bad;
    EXPECT_NE(msg.find("'" + std::string(bad) + "'"), std::string::npos) << bad;
    EXPECT_NE(msg.find("[1, 86400] (or 0: the watchdog off)"), std::string::npos) << bad << ": " << msg;
  }
}

}  // namespace
}  // namespace qshard
