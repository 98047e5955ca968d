// libFuzzer target: arbitrary bytes as the body of /v1/chat/completions or /v1/completions (the
// first byte picks), parsed into engine requests against models/tiny with a Hermes tool format
// and the reasoning split on. This covers the JSON -> sampling-parameters path, messages and
// tools, tool_choice, and structured output (response_format / guided_* compiled into grammars).
// Every outcome must be a job whose requests the engine accepts, or an ApiError with a 4xx status
// whose body is OpenAI's error JSON; nothing else may escape, crash or trip a sanitizer.
#include "backend/cpu/cpu_backend.h"
#include "engine/async_engine.h"
#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "server/api_error.h"
#include "server/openai_request.h"

namespace {

struct World {
  moet::Checkpoint checkpoint = moet::Checkpoint::open(MOET_SOURCE_DIR "/models/tiny");
  std::unique_ptr<moet::Backend> backend = moet::cpu_backend_create({1});
  std::unique_ptr<moet::Model> model =
      moet::model_load(checkpoint, *backend, nullptr, moet::ModelLoadOptions{moet::ExpertMode::native});
  moet::Tokenizer tokenizer = moet::Tokenizer::from_dir(MOET_SOURCE_DIR "/models/tiny");
  moet::EngineConfig config = [] {
    moet::EngineConfig c;
    c.max_model_len = 1024;
    c.max_num_seqs = 4;
    return c;
  }();
  moet::AsyncEngine engine{*model, tokenizer, config};
  moet::server::ServerContext ctx{engine,
                                  tokenizer,
                                  moet::ChatTemplate::from_dir(MOET_SOURCE_DIR "/models/tiny"),
                                  {},
                                  moet::server::tool_parser_create("hermes", ""),
                                  true,
                                  tokenizer.info().eos_ids,
                                  0,
                                  {}};
  World() { ctx.options.served_model_names = {"tiny"}; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World();  // never destroyed: the engine thread runs until exit
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const auto body = moet::server::Json::parse(moet::fuzz::input(data + 1, size - 1), nullptr, false);
  if (body.is_discarded()) return 0;
  try {
    const moet::server::GenerationJob job = chat ? moet::server::parse_chat_request(body, world->ctx)
                                                 : moet::server::parse_completion_request(body, world->ctx);
    moet::fuzz::check(!job.requests.empty(), "a job without requests");
    for (const moet::RequestParams& p : job.requests) world->engine.validate(p);  // throws if it slipped through
  } catch (const moet::server::ApiError& e) {
    moet::fuzz::check(e.status() >= 400 && e.status() < 500, "an ApiError that is not a 4xx");
    moet::fuzz::check(e.body()["error"]["message"].is_string(), "an error body without a message");
  } catch (const moet::Error&) {
    // Validation below the server (template errors are ApiErrors already): answered as a 400.
  }
  return 0;
}
