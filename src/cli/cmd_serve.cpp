// `moet serve MODEL_DIR`: the OpenAI-compatible server (vLLM's flag names where they exist).
// Loads the model, tokenizer and chat template, starts the engine loop and the HTTP server, and
// shuts down cleanly on SIGINT/SIGTERM. Sampling defaults come from generation_config.json.
#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "server/http_server.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <pthread.h>
#include <thread>

namespace moet::cli {
namespace {

struct ServeFlags {
  std::string model_dir;
  DeviceOptions device;
  ExpertOptions experts;
  server::ServerOptions server;
  EngineConfig engine;
};

// temperature/top_p/top_k/min_p/repetition_penalty from the model's generation_config.json.
SamplingParams sampling_defaults(const std::string& dir) {
  SamplingParams s;
  s.temperature = 1.0f;  // OpenAI's default
  const auto path = std::filesystem::path(dir) / "generation_config.json";
  if (!std::filesystem::exists(path)) return s;
  const nlohmann::json g = nlohmann::json::parse(std::ifstream(path), nullptr, false);
  if (!g.is_object()) return s;
  if (g.value("do_sample", true) == false) s.temperature = 0.0f;
  s.temperature = g.value("temperature", s.temperature);
  s.top_p = g.value("top_p", s.top_p);
  s.top_k = g.value("top_k", s.top_k);
  s.min_p = g.value("min_p", s.min_p);
  s.repetition_penalty = g.value("repetition_penalty", s.repetition_penalty);
  return s;
}

void run(ServeFlags flags) {
  // Block the stop signals in every thread; one thread waits for them and stops the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the server

  Tokenizer tokenizer = Tokenizer::from_dir(flags.model_dir);
  std::optional<ChatTemplate> chat_template;
  try {
    chat_template = ChatTemplate::from_dir(flags.model_dir);
  } catch (const Error& e) {
    MOET_LOG_WARN("no chat template ({}); /v1/chat/completions will answer 400", e.what());
  }
  LoadedModel loaded = load_model(ModelOptions{flags.model_dir, flags.device, flags.experts}, flags.engine.max_num_seqs);
  AsyncEngine engine(*loaded.model, tokenizer, flags.engine);
  const EngineConfig& ec = engine.config();
  MOET_LOG_INFO("engine: max_model_len {}, max_num_seqs {}, max_num_batched_tokens {}, {} KV blocks of {} tokens "
                "({:.1f} MiB), prefix caching {}",
                ec.max_model_len, ec.max_num_seqs, ec.max_num_batched_tokens, ec.num_blocks, ec.block_size,
                double(ec.num_blocks * ec.block_size * kv_bytes_per_token(loaded.model->kv_layer_specs())) / (1 << 20),
                ec.enable_prefix_caching ? "on" : "off");

  if (flags.server.served_model_names.empty())
    flags.server.served_model_names = {std::filesystem::path(flags.model_dir).lexically_normal().string()};
  flags.server.default_sampling = sampling_defaults(flags.model_dir);
  const std::string template_source = chat_template ? chat_template->source() : std::string();
  const std::string& rp = flags.server.reasoning_parser;
  const bool reasoning = rp == "auto" ? tokenizer.token_to_id("</think>").has_value() : rp != "none";
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  server::ServerContext ctx{engine,
                            tokenizer,
                            chat_template,
                            flags.server,
                            server::tool_parser_create(flags.server.tool_call_parser, template_source),
                            reasoning,
                            tokenizer.info().eos_ids,
                            now,
                            {}};
  MOET_LOG_INFO("chat: template {}, tool-call parser {}, reasoning split {}", chat_template ? "yes" : "none",
                ctx.tool_parser ? std::string(ctx.tool_parser->start()) : "none", ctx.reasoning ? "on" : "off");

  server::HttpServer http(ctx);
  std::thread waiter([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    MOET_LOG_INFO("signal {}: shutting down", signal);
    http.stop();
  });
  try {
    http.serve();
  } catch (...) {
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    throw;
  }
  pthread_kill(waiter.native_handle(), SIGTERM);  // wakes the waiter when serve() ended another way
  waiter.join();
}

}  // namespace

void register_serve(CLI::App& app, Actions& actions) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* sub = app.add_subcommand("serve", "serve a model over an OpenAI-compatible HTTP API (vLLM-style flags)");
  sub->add_option("model,--model", flags->model_dir, "model folder: config.json + *.safetensors + tokenizer files")
      ->required();
  flags->device.add_to(*sub);
  flags->experts.add_to(*sub);
  auto& s = flags->server;
  auto& e = flags->engine;
  sub->add_option("--host", s.host, "address to listen on (0.0.0.0 for every interface)")->capture_default_str();
  sub->add_option("--port", s.port, "TCP port")->capture_default_str()->check(CLI::Range(1, 65535));
  sub->add_option("--served-model-name", s.served_model_names,
                  "model name(s) clients use; the first is listed by /v1/models (default: the model path as given)");
  sub->add_option("--api-key", s.api_key, "require 'Authorization: Bearer KEY' on /v1/* (env MOET_API_KEY)")
      ->envname("MOET_API_KEY");
  sub->add_option("--max-model-len", e.max_model_len, "context length: prompt + output tokens (0 = the model's)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-num-seqs", e.max_num_seqs, "most requests in the running batch (others wait)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--max-num-batched-tokens", e.max_num_batched_tokens,
                  "token budget of one engine step (long prompts are prefilled in chunks of at most this)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--block-size", e.block_size, "KV cache block size in tokens (the prefix-cache granularity)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--num-kv-blocks", e.num_blocks,
                  "KV cache blocks (0 = room for max-num-seqs full-length sequences within --kv-cache-memory-bytes)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--kv-cache-memory-bytes", e.kv_cache_bytes, "memory budget of the automatic KV block count")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", e.enable_prefix_caching,
                "reuse the KV blocks of shared prompt prefixes (default on)");
  sub->add_option("--max-request-bytes", s.max_request_bytes, "largest accepted request body; larger ones get 413")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--tool-call-parser", s.tool_call_parser,
                  "tool-call format: auto (from the chat template), none, hermes (= qwen3), deepseek_v3")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "hermes", "qwen3", "qwen2_5", "deepseek_v3", "deepseek_v31"}));
  sub->add_flag_callback("--enable-auto-tool-choice", [] {},
                         "accepted for vLLM compatibility: tool calls are parsed whenever a request has tools");
  sub->add_option("--reasoning-parser", s.reasoning_parser,
                  "split <think>...</think> into reasoning_content: auto (when the tokenizer has </think>), none, "
                  "deepseek_r1, qwen3")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "deepseek_r1", "qwen3"}));
  actions[sub] = [flags] { run(*flags); };
}

}  // namespace moet::cli
