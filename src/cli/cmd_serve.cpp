// `moet serve MODEL_DIR`: the OpenAI-compatible server (vLLM's flag names where they exist).
// Loads the model, tokenizer and chat template, starts the engine loop and the HTTP server. On
// SIGINT/SIGTERM it drains: no new connections, running requests get --shutdown-timeout seconds,
// then remaining streams end with an error event and [DONE]; exit 0. A second signal exits at
// once (status 1). Sampling defaults come from generation_config.json.
#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/speculative_options.h"
#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "server/http_server.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <pthread.h>
#include <sys/resource.h>
#include <thread>

namespace moet::cli {
namespace {

struct ServeFlags {
  std::string model_dir;
  DeviceOptions device;
  ExpertOptions experts;
  SpeculativeOptions speculative;
  KvCacheOptions kv_cache;
  ParallelOptions parallel;
  server::ServerOptions server;
  EngineConfig engine;
  double shutdown_timeout = 30.0;
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
  // Each connection is a file descriptor: take the hard limit, and keep the cap below it.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    if (files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      setrlimit(RLIMIT_NOFILE, &files);
    }
    const size_t room = files.rlim_cur > 256 ? size_t(files.rlim_cur) - 128 : 128;
    if (flags.server.http.max_connections > room) {
      MOET_LOG_WARN("--max-connections {} lowered to {} (open-file limit {})", flags.server.http.max_connections,
                    room, size_t(files.rlim_cur));
      flags.server.http.max_connections = room;
    }
  }

  Tokenizer tokenizer = Tokenizer::from_dir(flags.model_dir);
  std::optional<ChatTemplate> chat_template;
  try {
    chat_template = ChatTemplate::from_dir(flags.model_dir);
  } catch (const Error& e) {
    MOET_LOG_WARN("no chat template ({}); /v1/chat/completions will answer 400", e.what());
  }
  flags.engine.speculative = flags.speculative.resolve();
  const bool mtp = flags.engine.speculative.method == SpeculativeConfig::Method::mtp;
  LoadedModel loaded = load_model(ModelOptions{flags.model_dir, flags.device, flags.experts, flags.kv_cache,
                                               flags.parallel},
                                  flags.engine.max_num_seqs, mtp);
  if (loaded.follower()) {  // one HTTP front end: node 0's; this node runs its ranks' part of node 0's steps
    MOET_LOG_INFO("node {} of {}: node 0 ({}) serves HTTP", flags.parallel.node_rank, flags.parallel.nnodes,
                  flags.parallel.master_addr);
    return loaded.follow();
  }
  AsyncEngine engine(*loaded.model, tokenizer, flags.engine);
  const EngineConfig& ec = engine.config();
  const std::vector<KvLayerSpec>& kv_specs = loaded.model->kv_layer_specs();
  const int64_t kv_token_bytes = kv_bytes_per_token(kv_specs);
  MOET_LOG_INFO("KV cache size: {} tokens ({} blocks of {}), {} bytes per token ({}), {:.1f} MiB; max_model_len {} "
                "({:.1f} full-length sequences)",
                ec.num_blocks * ec.block_size, ec.num_blocks, ec.block_size, kv_token_bytes,
                kv_dtype_name(kv_specs.front().dtype),
                double(ec.num_blocks * ec.block_size * kv_token_bytes) / (1 << 20),
                ec.max_model_len, double(ec.num_blocks * ec.block_size) / double(ec.max_model_len));
  MOET_LOG_INFO("engine: max_num_seqs {}, max_num_batched_tokens {}, prefix caching {}, speculative decoding {}",
                ec.max_num_seqs, ec.max_num_batched_tokens, ec.enable_prefix_caching ? "on" : "off",
                ec.speculative.enabled()
                    ? fmt::format("{} with {} drafts", speculative_method_name(ec.speculative.method),
                                  ec.speculative.num_speculative_tokens)
                    : std::string("off"));

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
  if (Fp4Tier* tier = loaded.model->experts().fp4_tier()) ctx.gate = &tier->gate();
  MOET_LOG_INFO("chat: template {}, tool-call parser {}, reasoning split {}", chat_template ? "yes" : "none",
                ctx.tool_parser ? std::string(ctx.tool_parser->start()) : "none", ctx.reasoning ? "on" : "off");

  server::HttpServer http(ctx);
  http.listen();  // throws (exit 1) when the port is taken
  int signal = 0;
  sigwait(&stop_signals, &signal);
  MOET_LOG_INFO("signal {}: draining (running requests get up to {} s; a second signal exits at once)", signal,
                flags.shutdown_timeout);
  std::atomic<bool> drained{false};
  std::thread second([&] {
    int again = 0;
    sigwait(&stop_signals, &again);
    if (drained) return;
    MOET_LOG_WARN("signal {} again: exiting now", again);
    std::_Exit(1);
  });
  http.drain(flags.shutdown_timeout);
  http.stop();
  drained = true;
  pthread_kill(second.native_handle(), SIGTERM);  // wakes the second-signal waiter
  second.join();
  MOET_LOG_INFO("shut down");
}

}  // namespace

void register_serve(CLI::App& app, Actions& actions) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* sub = app.add_subcommand("serve", "serve a model over an OpenAI-compatible HTTP API (vLLM-style flags)");
  sub->add_option("model", flags->model_dir, "model folder: config.json + *.safetensors + tokenizer files (or --model)");
  sub->add_option("--model", flags->model_dir)->group("");  // vLLM's spelling; the same option, not listed twice
  flags->device.add_to(*sub);
  flags->experts.add_to(*sub);
  flags->speculative.add_to(*sub);
  flags->kv_cache.add_to(*sub);
  flags->parallel.add_to(*sub);
  auto& s = flags->server;
  auto& e = flags->engine;
  sub->add_option("--host", s.host, "address to listen on (0.0.0.0 for every interface)")->capture_default_str();
  sub->add_option("--port", s.port, "TCP port")->capture_default_str()->check(CLI::Range(1, 65535));
  sub->add_option("--served-model-name", s.served_model_names,
                  "model name(s) clients use; the first is listed by /v1/models (default: the model path as given)");
  sub->add_option("--api-key", s.api_key,
                  "require 'Authorization: Bearer KEY' on /v1/* and /admin/* (env MOET_API_KEY)")
      ->envname("MOET_API_KEY");
  sub->add_option("--max-model-len", e.max_model_len,
                  "context length: prompt + output tokens (0 = the model's, lowered to what the KV cache budget "
                  "holds); refused when the KV pool cannot hold one sequence of it")
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
  sub->add_flag_callback("--enable-prefix-caching", [flags] { flags->engine.enable_prefix_caching = true; },
                         "reuse the KV blocks of shared prompt prefixes (the default)");
  sub->add_flag_callback("--no-enable-prefix-caching", [flags] { flags->engine.enable_prefix_caching = false; },
                         "turn prefix caching off");
  sub->add_option("--max-request-bytes", s.max_request_bytes,
                  "largest accepted request body, Content-Length or chunked; larger ones get 413")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--max-header-bytes", s.http.max_header_bytes,
                  "largest request line + headers; larger ones get 431")
      ->capture_default_str()->check(CLI::Range(size_t(1024), size_t(1) << 30));
  sub->add_option("--header-timeout", s.http.header_timeout,
                  "seconds a request may take from its first byte to the end of its headers (then the connection "
                  "is closed)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--body-timeout", s.http.body_timeout, "seconds a request body may take to arrive after its headers")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--keep-alive-timeout", s.http.idle_timeout,
                  "seconds an idle keep-alive connection is kept open between requests")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--write-timeout", s.http.write_timeout,
                  "seconds one response write may take before the client is dropped as gone")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--max-connections", s.http.max_connections,
                  "most open connections; over it the oldest idle or still-reading one is closed (requests already "
                  "read are never dropped for it)")
      ->capture_default_str()->check(CLI::Range(size_t(1), size_t(1) << 20));
  sub->add_option("--shutdown-timeout", flags->shutdown_timeout,
                  "on SIGTERM/SIGINT, seconds running requests may take to finish before their streams are ended")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--allowed-origins", s.allowed_origins,
                  "CORS: origins (e.g. http://localhost:3000, or *) whose browser requests are allowed; default none")
      ->delimiter(',');
  sub->add_option("--tool-call-parser", s.tool_call_parser,
                  "tool-call format: auto (from the chat template), none, hermes (= qwen3), deepseek_v3, glm45 (= "
                  "glm47: GLM-4.5 to GLM-5), deepseek_v4, deepseek_v32")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "hermes", "qwen3", "qwen2_5", "deepseek_v3", "deepseek_v31", "glm45",
                             "glm47", "deepseek_v4", "deepseek_v32"}));
  sub->add_flag_callback("--enable-auto-tool-choice", [] {},
                         "accepted for vLLM compatibility: tool calls are parsed whenever a request has tools");
  sub->add_option("--reasoning-parser", s.reasoning_parser,
                  "split <think>...</think> into reasoning_content: auto (when the tokenizer has </think>), none, "
                  "deepseek_r1, qwen3, glm45, deepseek_v4 (all the same split)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "deepseek_r1", "qwen3", "glm45", "deepseek_v4"}));
  actions[sub] = [flags] {
    if (flags->model_dir.empty()) fail("serve: the model folder is required (moet serve MODEL_DIR)");
    run(*flags);
  };
}

}  // namespace moet::cli
