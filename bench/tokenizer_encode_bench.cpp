// Encode throughput of moet::Tokenizer (one thread) on a text file, per tokenizer family.
// Inputs come from the environment: MOET_BENCH_CORPUS (a UTF-8 text file, e.g. the 1 MB mixed
// corpus bench/tokenizer_bench.py writes) and MOET_BENCH_DATA (shared/data; default ../shared/data).
// Reports bytes/s; bench/tokenizer_bench.py runs this next to HF tokenizers and prints the ratio.
#include "tokenizer/model_files.h"
#include "tokenizer/tokenizer.h"

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <string>

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

const moet::Tokenizer& tokenizer(const std::string& family) {
  static std::map<std::string, moet::Tokenizer> loaded;
  auto it = loaded.find(family);
  if (it == loaded.end())
    it = loaded.emplace(family, moet::Tokenizer::from_dir(env_or("MOET_BENCH_DATA", "../shared/data") + "/" + family)).first;
  return it->second;
}

void encode_corpus(benchmark::State& state, const std::string& family) {
  const std::string path = env_or("MOET_BENCH_CORPUS", "");
  if (path.empty()) {
    state.SkipWithError("set MOET_BENCH_CORPUS to a text file");
    return;
  }
  const std::string text = moet::tok::read_file(path);
  const moet::Tokenizer& tok = tokenizer(family);
  size_t tokens = 0;
  for (auto _ : state) {
    const auto ids = tok.encode(text, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations() * text.size()));
  state.counters["tokens"] = double(tokens);
}

}  // namespace

BENCHMARK_CAPTURE(encode_corpus, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(encode_corpus, deepseek_v3, std::string("deepseek-v3"))->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(encode_corpus, mixtral, std::string("mixtral"))->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(encode_corpus, gpt_oss, std::string("gpt-oss"))->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(encode_corpus, kimi_k2, std::string("kimi-k2"))->Unit(benchmark::kMillisecond)->MinTime(2.0);

BENCHMARK_MAIN();
