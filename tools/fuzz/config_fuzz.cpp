// libFuzzer target: arbitrary bytes as config.json. Parsing must end in a ModelConfig or a
// moet::Error (an unknown family, a missing or out-of-range field), never a crash or UB.
#include "core/error.h"
#include "fuzz_util.h"
#include "models/arch/arch.h"

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json config = nlohmann::json::parse(moet::fuzz::input(data, size), nullptr, false);
  if (config.is_discarded()) return 0;
  try {
    const moet::ModelConfig c = moet::model_config_parse(config);
    for (int64_t layer = 0; layer < std::min<int64_t>(c.num_hidden_layers, 4); ++layer) (void)c.moe_prefix(layer);
  } catch (const moet::Error&) {
  } catch (const nlohmann::json::exception&) {
    moet::fuzz::check(false, "a JSON type error escaped model_config_parse instead of a moet::Error");
  }
  return 0;
}
