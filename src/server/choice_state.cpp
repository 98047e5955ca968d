// ChoiceState implementation (see choice_state.h).
#include "server/choice_state.h"

#include <fmt/format.h>

#include <utility>

namespace moet::server {
namespace {

Json bytes_json(const std::string& s) {
  Json bytes = Json::array();
  for (unsigned char c : s) bytes.push_back(int(c));
  return bytes;
}

// Appends the entries of `delta` (same layout) to `total`.
void append_logprobs(Json& total, const Json& delta) {
  if (delta.is_null()) return;
  if (total.is_null()) {
    total = delta;
    return;
  }
  for (const auto& [key, values] : delta.items())
    for (const Json& v : values) total[key].push_back(v);
}

}  // namespace

ChoiceState::ChoiceState(const ServerContext& ctx, const GenerationJob& job, int64_t index, std::string response_id)
    : ctx_(ctx), chat_(job.chat), index_(index), response_id_(std::move(response_id)), want_logprobs_(job.requests.front().sampling.logprobs >= 0) {
  if (job.parse_reasoning) reasoning_.emplace(job.reasoning_starts_inside);
  if (job.echo) {
    echo_ = ctx.tokenizer.decode(job.requests[size_t(index)].prompt, job.requests[size_t(index)].skip_special_tokens);
  }
  if (job.parse_tools) tool_start_.emplace(std::vector<std::string>{std::string(ctx.tool_parser->start())});
}

Json ChoiceState::logprobs_json(const RequestOutput& out) const {
  if (!want_logprobs_) return nullptr;
  auto token_text = [&](int32_t id) { return ctx_.tokenizer.decode(std::span<const int32_t>(&id, 1), false); };
  // The token's own bytes (a byte-level token may hold part of a UTF-8 character; its text
  // then shows U+FFFD, its bytes do not), as OpenAI reports them.
  auto token_bytes = [&](int32_t id) { return bytes_json(ctx_.tokenizer.token_bytes(id)); };
  if (chat_) {
    Json content = Json::array();
    for (const SampleResult& s : out.logprobs) {
      Json top = Json::array();
      for (const TokenLogprob& t : s.top)
        top.push_back({{"token", token_text(t.id)}, {"logprob", t.logprob}, {"bytes", token_bytes(t.id)}});
      content.push_back({{"token", token_text(s.token)}, {"logprob", s.logprob}, {"bytes", token_bytes(s.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  Json lp = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
             {"text_offset", Json::array()}};
  size_t offset = text_.size();
  for (const SampleResult& s : out.logprobs) {
    const std::string text = token_text(s.token);
    Json top = Json::object();
    for (const TokenLogprob& t : s.top) {
      const std::string key = token_text(t.id);
      if (!top.contains(key)) top[key] = t.logprob;  // best first: tokens that decode alike keep the best
    }
    lp["tokens"].push_back(text);
    lp["token_logprobs"].push_back(s.logprob);
    lp["top_logprobs"].push_back(top);
    lp["text_offset"].push_back(offset);
    offset += text.size();
  }
  return lp;
}

void ChoiceState::route_text(const std::string& text, ReasoningPiece& piece) {
  ReasoningPiece split = reasoning_ ? reasoning_->push(text) : ReasoningPiece{{}, text};
  if (finished_ && reasoning_) {
    const ReasoningPiece rest = reasoning_->finish();
    split.reasoning += rest.reasoning;
    split.content += rest.content;
  }
  piece.reasoning += split.reasoning;
  if (!tool_start_) {
    piece.content += split.content;
    return;
  }
  if (tool_start_->stopped()) {
    tool_text_ += split.content;
  } else {
    piece.content += tool_start_->push(split.content);
    if (tool_start_->stopped()) tool_text_ = tool_start_->matched() + tool_start_->tail();
  }
  if (finished_ && !tool_start_->stopped()) piece.content += tool_start_->finish();
}

Json ChoiceState::finish_tools(Json& delta) {
  if (!tool_start_ || tool_text_.empty()) return nullptr;
  ToolParseResult parsed = ctx_.tool_parser->parse(tool_text_);
  if (!parsed.content.empty()) {
    text_ += parsed.content;
    delta["content"] = delta.value("content", "") + parsed.content;
  }
  tool_calls_ = std::move(parsed.calls);
  return tool_calls_.empty() ? Json(nullptr) : tool_calls_json(true);
}

Json ChoiceState::tool_calls_json(bool with_index) const {
  Json calls = Json::array();
  for (size_t i = 0; i < tool_calls_.size(); ++i) {
    Json call = {{"id", fmt::format("call_{}_{}_{}", response_id_.substr(5), index_, i)},
                 {"type", "function"},
                 {"function", {{"name", tool_calls_[i].name}, {"arguments", tool_calls_[i].arguments}}}};
    if (with_index) call["index"] = i;
    calls.push_back(call);
  }
  return calls;
}

Json ChoiceState::apply(const RequestOutput& out) {
  prompt_tokens_ = out.prompt_tokens;
  completion_tokens_ = out.completion_tokens;
  cached_tokens_ = out.cached_tokens;
  finished_ = out.finished;
  if (finished_) {
    finish_reason_ = out.finish_reason;
    stop_reason_ = out.stop_reason;
  }
  const Json logprobs = logprobs_json(out);
  append_logprobs(logprobs_, logprobs);
  Json choice = {{"index", index_}, {"logprobs", logprobs}, {"finish_reason", nullptr}};
  bool send = finished_ || !logprobs.is_null();
  if (!chat_) {
    const std::string text = echo_.empty() ? out.text : std::exchange(echo_, {}) + out.text;
    text_ += text;
    choice["text"] = text;
    send = send || !text.empty();
  } else {
    ReasoningPiece piece;
    route_text(out.text, piece);
    text_ += piece.content;
    reasoning_text_ += piece.reasoning;
    Json delta = Json::object();
    if (!sent_role_) {
      delta["role"] = "assistant";
      delta["content"] = "";
      sent_role_ = send = true;
    }
    if (!piece.content.empty()) delta["content"] = piece.content;
    if (!piece.reasoning.empty()) delta["reasoning_content"] = piece.reasoning;
    if (finished_) {
      if (Json calls = finish_tools(delta); !calls.is_null()) delta["tool_calls"] = calls;
    }
    send = send || !piece.content.empty() || !piece.reasoning.empty();
    choice["delta"] = delta;
  }
  if (finished_) {
    choice["finish_reason"] = tool_calls_.empty() ? finish_reason_ : "tool_calls";
    choice["stop_reason"] = stop_reason_.empty() ? Json(nullptr) : Json(stop_reason_);
  }
  return send ? choice : Json(nullptr);
}

Json ChoiceState::final() const {
  Json choice = {{"index", index_},
                 {"logprobs", logprobs_},
                 {"finish_reason", tool_calls_.empty() ? finish_reason_ : "tool_calls"},
                 {"stop_reason", stop_reason_.empty() ? Json(nullptr) : Json(stop_reason_)}};
  if (!chat_) {
    choice["text"] = text_;
    return choice;
  }
  Json message = {{"role", "assistant"}, {"content", text_}};
  if (!reasoning_text_.empty()) message["reasoning_content"] = reasoning_text_;
  if (!tool_calls_.empty()) {
    if (text_.empty()) message["content"] = nullptr;
    message["tool_calls"] = tool_calls_json(false);
  }
  choice["message"] = message;
  return choice;
}

}  // namespace moet::server
