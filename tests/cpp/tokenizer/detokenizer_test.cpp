// Property test for the incremental detokenizer on every tokenizer family: for random id
// sequences (biased towards byte tokens, special tokens and multi-byte characters), the deltas
// concatenate to decode(all ids), with and without skip_special_tokens, and no delta ends in the
// middle of a UTF-8 character.
#include "tokenizer/detokenizer.h"
#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

#include <random>

namespace {

const std::string kData = std::string(MOET_SOURCE_DIR) + "/../shared/data";

class DetokenizerProperty : public ::testing::TestWithParam<const char*> {};

TEST_P(DetokenizerProperty, DeltasConcatenateToDecode) {
  const auto tok = moet::Tokenizer::from_dir(kData + "/" + GetParam());
  const auto text_ids = tok.encode("Hello 世界! 👩‍👩‍👧 ça va? <think>x</think>\n\n  code(){}", false);
  std::mt19937 rng(42);
  const int32_t vocab = int32_t(tok.vocab_size());
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids;
    const int n = 1 + int(rng() % 48);
    for (int i = 0; i < n; ++i) {
      const int kind = int(rng() % 4);
      if (kind == 0) ids.push_back(int32_t(rng() % 300));  // byte and <0xNN> tokens
      else if (kind == 1) ids.push_back(text_ids[rng() % text_ids.size()]);
      else if (kind == 2) ids.push_back(vocab - 1 - int32_t(rng() % 300));  // added/special tokens
      else ids.push_back(int32_t(rng() % uint32_t(vocab)));
    }
    for (bool skip : {false, true}) {
      moet::IncrementalDetokenizer stream(tok, skip);
      std::string joined;
      for (int32_t id : ids) {
        const std::string delta = stream.push(id);
        EXPECT_TRUE(moet::tok::utf8_is_valid(delta));
        joined += delta;
      }
      joined += stream.finish();
      ASSERT_EQ(joined, tok.decode(ids, skip)) << GetParam() << " trial " << trial;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DetokenizerProperty,
                         ::testing::Values("qwen3", "deepseek-v3", "mixtral", "gpt-oss", "kimi-k2"));

}  // namespace
