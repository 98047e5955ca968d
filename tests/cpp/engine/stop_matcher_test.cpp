// StopMatcher: stop strings split across pieces, held-back partial matches, earliest match wins,
// and flushing on finish.
#include "engine/stop_matcher.h"

#include <gtest/gtest.h>

namespace moet {
namespace {

std::string feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.push(p);
  return out;
}

TEST(StopMatcher, NoStopsPassesEverything) {
  StopMatcher m({});
  EXPECT_EQ(feed(m, {"a", "bc"}), "abc");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, StopAcrossPieces) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("hello S"), "hello ");  // "S" held back
  EXPECT_EQ(m.push("T"), "");
  EXPECT_EQ(m.push("OP and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(m.tail(), " and more");
  EXPECT_EQ(m.push("later"), "");
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_EQ(m.push("ART"), "START");
  EXPECT_EQ(m.push("x"), "x");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestMatchWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.push("hello world"), "hel");
  EXPECT_EQ(m.matched(), "lo w");
}

TEST(StopMatcher, FinishFlushesHeldText) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(m.push("line\n"), "line");
  EXPECT_EQ(m.finish(), "\n");
}

TEST(StopMatcher, MultiByteStop) {
  StopMatcher m({"é!"});
  EXPECT_EQ(feed(m, {"caf", "é", "!", "x"}), "caf");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace moet
