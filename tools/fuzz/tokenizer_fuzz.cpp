// libFuzzer target: arbitrary bytes as text for every tokenizer family in shared/data. Checks that
// encode never crashes, that decode accepts its output, and that the incremental detokenizer's
// deltas concatenate to decode() (abort otherwise, so the fuzzer reports it).
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

std::vector<moet::Tokenizer> load_all() {
  const char* root = std::getenv("MOET_FUZZ_DATA");
  const std::string base = root ? root : "../shared/data";
  std::vector<moet::Tokenizer> out;
  for (const char* family : {"qwen3", "deepseek-v3", "mixtral", "kimi-k2", "gpt-oss"}) out.push_back(moet::Tokenizer::from_dir(base + "/" + family));
  return out;
}

const std::vector<moet::Tokenizer>* g_tokenizers = nullptr;

}  // namespace

// Loading five real tokenizers under ASan takes longer than one input's timeout, so it happens here.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_tokenizers = new std::vector<moet::Tokenizer>(load_all());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<moet::Tokenizer>& tokenizers = *g_tokenizers;
  if (size == 0) return 0;
  const moet::Tokenizer& tok = tokenizers[data[0] % tokenizers.size()];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<int32_t> ids = tok.encode(text, true);
  for (bool skip : {false, true}) {
    const std::string full = tok.decode(ids, skip);
    moet::IncrementalDetokenizer stream(tok, skip);
    std::string joined;
    for (int32_t id : ids) joined += stream.push(id);
    joined += stream.finish();
    if (joined != full) {
      std::fprintf(stderr, "detokenizer mismatch\n");
      std::abort();
    }
  }
  // Raw ids straight from the input exercise decoders on arbitrary sequences.
  std::vector<int32_t> raw;
  for (size_t i = 1; i + 3 < size; i += 4) raw.push_back(int32_t((data[i] | data[i + 1] << 8 | data[i + 2] << 16) % (tok.vocab_size() + 8)));
  moet::IncrementalDetokenizer stream(tok);
  std::string joined;
  for (int32_t id : raw) joined += stream.push(id);
  joined += stream.finish();
  if (joined != tok.decode(raw)) {
    std::fprintf(stderr, "detokenizer mismatch on raw ids\n");
    std::abort();
  }
  return 0;
}
