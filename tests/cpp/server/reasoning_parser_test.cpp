// ReasoningParser: <think> blocks split from content whole or streamed in arbitrary pieces (tags
// split across pieces), prompts that already opened the block, and output without tags.
#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

namespace moet::server {
namespace {

ReasoningPiece feed(ReasoningParser& p, const std::string& text, size_t piece) {
  ReasoningPiece total;
  for (size_t i = 0; i < text.size(); i += piece) {
    const ReasoningPiece r = p.push(text.substr(i, piece));
    total.reasoning += r.reasoning;
    total.content += r.content;
  }
  const ReasoningPiece r = p.finish();
  total.reasoning += r.reasoning;
  total.content += r.content;
  return total;
}

TEST(ReasoningParser, SplitsWholeAndStreamedAlike) {
  const std::string text = "<think>Let me think.</think>The answer is 4.";
  for (size_t piece : {1, 2, 3, 5, 100}) {
    ReasoningParser p(false);
    const ReasoningPiece r = feed(p, text, piece);
    EXPECT_EQ(r.reasoning, "Let me think.") << piece;
    EXPECT_EQ(r.content, "The answer is 4.") << piece;
  }
}

TEST(ReasoningParser, PromptOpenedTheBlock) {
  ReasoningParser p(true);
  const ReasoningPiece r = feed(p, "hmm</think>ok", 2);
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "ok");
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

TEST(ReasoningParser, NoTagsIsContentAndUnclosedIsReasoning) {
  ReasoningParser plain(false);
  const ReasoningPiece a = feed(plain, "just <thin text", 3);
  EXPECT_EQ(a.content, "just <thin text");
  EXPECT_EQ(a.reasoning, "");
  ReasoningParser unclosed(false);
  const ReasoningPiece b = feed(unclosed, "<think>still going</thi", 4);
  EXPECT_EQ(b.reasoning, "still going</thi");
  EXPECT_EQ(b.content, "");
}

}  // namespace
}  // namespace moet::server
