// ReasoningParser implementation (see reasoning_parser.h).
#include "server/reasoning_parser.h"

namespace moet::server {

ReasoningParser::ReasoningParser(bool starts_inside) : state_(starts_inside ? State::inside : State::before) {}

ReasoningPiece ReasoningParser::push(std::string_view text) {
  ReasoningPiece piece;
  std::string rest(text);
  while (true) {
    if (state_ == State::before) {
      piece.content += open_.push(rest);
      if (!open_.stopped()) break;
      state_ = State::inside;
      rest = open_.tail();
    } else if (state_ == State::inside) {
      piece.reasoning += close_.push(rest);
      if (!close_.stopped()) break;
      state_ = State::after;
      rest = close_.tail();
    } else {
      piece.content += rest;
      break;
    }
  }
  return piece;
}

ReasoningPiece ReasoningParser::finish() {
  ReasoningPiece piece;
  if (state_ == State::before) piece.content = open_.finish();
  if (state_ == State::inside) piece.reasoning = close_.finish();
  return piece;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  while (!prompt.empty() && (prompt.back() == '\n' || prompt.back() == ' ')) prompt.remove_suffix(1);
  return prompt.ends_with("<think>");
}

}  // namespace moet::server
