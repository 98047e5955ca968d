// ReasoningParser: splits a thinking model's output into reasoning_content and content at
// <think> ... </think> (the DeepSeek-R1 / Qwen3 convention), incrementally: push() takes text as it
// streams and returns what is now known to be reasoning or content; a partial tag at the end of a
// piece is held back until the next piece decides it. When the prompt already opened the block
// (the chat template ends the generation prompt with "<think>"), the output starts inside it.
// Output with no tags at all is content.
#pragma once

#include "engine/stop_matcher.h"

#include <string>
#include <string_view>

namespace moet::server {

struct ReasoningPiece {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_inside);
  ReasoningPiece push(std::string_view text);
  ReasoningPiece finish();

 private:
  enum class State { before, inside, after };
  State state_;
  StopMatcher open_{{"<think>"}};
  StopMatcher close_{{"</think>"}};
};

// True when a rendered prompt leaves the model inside a reasoning block (ends with "<think>" and
// optional whitespace).
bool prompt_opens_reasoning(std::string_view prompt);

}  // namespace moet::server
