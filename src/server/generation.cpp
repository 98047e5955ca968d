// Generation responses (see generation.h).
#include "server/generation.h"

#include "core/log.h"
#include "server/api_error.h"
#include "server/choice_state.h"

#include <chrono>
#include <random>

namespace moet::server {
namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string new_response_id(bool chat) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", rng());
}

// The state of one response, shared by the handler and (when streaming) the content provider.
struct Response {
  ServerContext& ctx;
  GenerationJob job;
  std::string id;
  int64_t created;
  double start;
  std::shared_ptr<OutputStream> stream;
  std::vector<ChoiceState> choices;
  std::vector<double> last_token_time;
  size_t finished = 0;
  bool aborted = false;

  Response(ServerContext& c, GenerationJob j)
      : ctx(c), job(std::move(j)), id(new_response_id(job.chat)),
        created(std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count()),
        start(steady_seconds()) {
    for (size_t i = 0; i < job.requests.size(); ++i) choices.emplace_back(ctx, job, int64_t(i), id);
    last_token_time.assign(job.requests.size(), 0.0);
    stream = ctx.engine.submit(job.requests);
  }

  bool done() const { return finished == choices.size(); }

  // Waits for the next delta and applies it; returns the streaming choice JSON (may be null).
  // False when nothing arrived within the timeout.
  bool next(Json& choice_json) {
    RequestOutput out;
    if (!stream->next(out, 0.5)) return false;
    const size_t i = size_t(out.index);
    if (!out.token_ids.empty()) {
      if (last_token_time[i] == 0.0) ctx.metrics.first_token(out.time - start);
      else ctx.metrics.inter_token(out.time - last_token_time[i]);
      last_token_time[i] = out.time;
    }
    choice_json = choices[i].apply(out);
    if (out.finished) {
      ++finished;
      const std::string reason = choice_json.is_null() ? out.finish_reason : choice_json["finish_reason"].get<std::string>();
      ctx.metrics.request_finished(reason, out.prompt_tokens, out.completion_tokens, out.time - start);
    }
    return true;
  }

  void abort_unfinished() {
    if (aborted) return;
    aborted = true;
    for (size_t i = 0; i < choices.size(); ++i) {
      if (choices[i].finished()) continue;
      ctx.engine.abort(stream->ids()[i]);
      ctx.metrics.request_finished("abort", choices[i].prompt_tokens(), choices[i].completion_tokens(),
                                   steady_seconds() - start);
    }
  }

  Json envelope(const char* object) const {
    return {{"id", id}, {"object", object}, {"created", created}, {"model", job.model}};
  }

  Json usage() const {
    int64_t prompt = 0, completion = 0, cached = 0;
    for (size_t i = 0; i < choices.size(); ++i) {
      completion += choices[i].completion_tokens();
      if (int64_t(i) % job.n == 0) {  // a prompt counts once however many samples it has
        prompt += choices[i].prompt_tokens();
        cached += choices[i].cached_tokens();
      }
    }
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }
};

std::string sse(const Json& data) { return "data: " + data.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n"; }

constexpr char kShutdownMessage[] = "the server is shutting down; the request was cut short";

void respond_blocking(Response& r, HttpExchange& ex) {
  Json ignored;
  while (!r.done()) {
    if (ex.client_gone()) {
      MOET_LOG_INFO("{}: client disconnected; aborting its unfinished requests", r.id);
      r.abort_unfinished();
      return;
    }
    if (ex.must_stop()) {
      r.abort_unfinished();
      ex.respond({503, "application/json", api_error_body(503, kShutdownMessage).dump(), {}});
      return;
    }
    r.next(ignored);
  }
  Json body = r.envelope(r.job.chat ? "chat.completion" : "text_completion");
  body["choices"] = Json::array();
  for (const ChoiceState& c : r.choices) body["choices"].push_back(c.final());
  body["usage"] = r.usage();
  ex.respond({200, "application/json", body.dump(-1, ' ', false, Json::error_handler_t::replace), {}});
}

// Ends a stream cut short by the shutdown: a final chunk per unfinished choice (finish_reason
// "abort"), an error event, [DONE].
void end_stream_for_shutdown(Response& r, HttpExchange& ex, const char* object) {
  Json chunk = r.envelope(object);
  chunk["choices"] = Json::array();
  for (size_t i = 0; i < r.choices.size(); ++i) {
    if (r.choices[i].finished()) continue;
    Json choice = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", "abort"}};
    if (r.job.chat) choice["delta"] = Json::object();
    else choice["text"] = "";
    chunk["choices"].push_back(choice);
  }
  r.abort_unfinished();
  const std::string error = sse(api_error_body(503, kShutdownMessage, {}, "server_shutdown"));
  if (ex.write(sse(chunk)) && ex.write(error)) ex.write("data: [DONE]\n\n");
  ex.end_stream();
}

void respond_streaming(Response& r, HttpExchange& ex) {
  const char* object = r.job.chat ? "chat.completion.chunk" : "text_completion";
  if (!ex.start_stream("text/event-stream", {{"Cache-Control", "no-cache"}})) {
    r.abort_unfinished();
    return;
  }
  while (!r.done()) {
    if (ex.must_stop()) return end_stream_for_shutdown(r, ex, object);
    Json choice;
    if (!ex.client_gone() && (!r.next(choice) || choice.is_null())) continue;
    Json chunk = r.envelope(object);
    chunk["choices"] = Json::array({choice});
    if (r.job.include_usage) chunk["usage"] = nullptr;
    if (ex.client_gone() || !ex.write(sse(chunk))) {
      MOET_LOG_INFO("{}: client disconnected; aborting its unfinished requests", r.id);
      r.abort_unfinished();
      return;
    }
  }
  if (r.job.include_usage) {
    Json chunk = r.envelope(object);
    chunk["choices"] = Json::array();
    chunk["usage"] = r.usage();
    if (!ex.write(sse(chunk))) return;
  }
  if (ex.write("data: [DONE]\n\n")) ex.end_stream();
}

}  // namespace

void respond_generation(ServerContext& ctx, GenerationJob job, HttpExchange& exchange) {
  Response response(ctx, std::move(job));
  if (response.job.stream) {
    respond_streaming(response, exchange);
  } else {
    respond_blocking(response, exchange);
  }
}

}  // namespace moet::server
