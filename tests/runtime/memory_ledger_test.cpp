// The memory ledger: lines add up by place, a name added twice adds up, zero lines stay out, and
// the measured figure gives the unaccounted rest; the text and the JSON carry every line.
#include <gtest/gtest.h>

#include "runtime/memory_ledger.h"

namespace qshard {
namespace {

TEST(MemoryLedger, LinesAddUpAndTheRestIsUnaccounted) {
  MemoryLedger l;
  l.add("base shards", 3000, MemoryPlace::kDevice);
  l.add("root unit shards", 2000, MemoryPlace::kDevice);
  l.add("base shards", 500, MemoryPlace::kDevice);
  l.add("offloaded", 700, MemoryPlace::kPinnedHost);
  l.add("nothing", 0, MemoryPlace::kDevice);
  ASSERT_EQ(l.lines().size(), 3u);
  EXPECT_EQ(l.lines()[0].bytes, 3500u);
  EXPECT_EQ(l.total(MemoryPlace::kDevice), 5500u);
  EXPECT_EQ(l.total(MemoryPlace::kPinnedHost), 700u);
  EXPECT_FALSE(l.unaccounted().has_value());
  l.set_measured(6000);
  EXPECT_EQ(*l.unaccounted(), 500);
  l.set_measured(5000);
  EXPECT_EQ(*l.unaccounted(), -500);
  const std::string text = l.describe();
  for (const char* part : {"base shards", "root unit shards", "pinned host", "offloaded", "unaccounted"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " missing from: " << text;
  const nlohmann::json j = l.to_json();
  EXPECT_EQ(j["device"].size(), 2u);
  EXPECT_EQ(j["pinned_host"][0]["bytes"], 700u);
  EXPECT_EQ(j["unaccounted"], -500);
}

}  // namespace
}  // namespace qshard
