// Generation responses (see generation.h).
#include "server/generation.h"

#include "core/log.h"
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

void respond_blocking(Response& r, httplib::Response& res) {
  Json ignored;
  while (!r.done()) r.next(ignored);
  Json body = r.envelope(r.job.chat ? "chat.completion" : "text_completion");
  body["choices"] = Json::array();
  for (const ChoiceState& c : r.choices) body["choices"].push_back(c.final());
  body["usage"] = r.usage();
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void respond_streaming(std::shared_ptr<Response> r, httplib::Response& res) {
  const char* object = r->job.chat ? "chat.completion.chunk" : "text_completion";
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [r, object](size_t, httplib::DataSink& sink) {
        if (r->done()) {
          if (r->job.include_usage) {
            Json chunk = r->envelope(object);
            chunk["choices"] = Json::array();
            chunk["usage"] = r->usage();
            const std::string data = sse(chunk);
            if (!sink.write(data.data(), data.size())) return false;
          }
          const std::string done = "data: [DONE]\n\n";
          if (!sink.write(done.data(), done.size())) return false;
          sink.done();
          return true;
        }
        Json choice;
        if (!r->next(choice)) return sink.is_writable();  // nothing yet; give up if the client left
        if (choice.is_null()) return true;
        Json chunk = r->envelope(object);
        chunk["choices"] = Json::array({choice});
        if (r->job.include_usage) chunk["usage"] = nullptr;
        const std::string data = sse(chunk);
        return sink.write(data.data(), data.size());
      },
      [r](bool success) {
        if (success && r->done()) return;
        MOET_LOG_INFO("{}: client disconnected; aborting its unfinished requests", r->id);
        r->abort_unfinished();
      });
}

}  // namespace

void respond_generation(ServerContext& ctx, GenerationJob job, httplib::Response& res) {
  auto response = std::make_shared<Response>(ctx, std::move(job));
  if (response->job.stream) {
    respond_streaming(response, res);
  } else {
    respond_blocking(*response, res);
  }
}

}  // namespace moet::server
