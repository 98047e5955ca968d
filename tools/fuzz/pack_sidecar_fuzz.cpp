// libFuzzer target: arbitrary bytes as a pack sidecar (experts-<format>-rank<r>of<w>.json).
// Reading must give a PackSpec or a moet::Error naming the file; a spec that reads back must
// survive a write/read round trip unchanged (its checksum covers its canonical body).
#include "core/error.h"
#include "fuzz_util.h"
#include "io/pack_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const moet::PackSpec spec = moet::pack_sidecar_read(moet::fuzz::scratch_file(moet::fuzz::input(data, size), ".json"));
    const std::string again = moet::pack_sidecar_json(spec).dump();
    const moet::PackSpec round = moet::pack_sidecar_read(moet::fuzz::scratch_file(again, ".json"));
    moet::fuzz::check(moet::pack_sidecar_json(round).dump() == again, "sidecar round trip changed the spec");
  } catch (const moet::Error&) {
  }
  return 0;
}
