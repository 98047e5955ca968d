// libFuzzer target: arbitrary bytes as a safetensors file. open() must either throw moet::Error
// or return tensors whose bytes lie inside the mapping (touched here, so ASan checks it) and
// match their shapes, never crash or read out of bounds.
#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto file = moet::SafetensorsFile::open(moet::fuzz::scratch_file(moet::fuzz::input(data, size), ".safetensors"));
    for (const moet::HostTensor& t : file->tensors()) {
      moet::fuzz::check(t.numel() >= 0, "negative element count");
      moet::fuzz::check(t.bytes <= size, "a tensor larger than the file");
      if (t.bytes > 0) {
        volatile uint8_t first = t.data[0], last = t.data[t.bytes - 1];
        (void)first;
        (void)last;
      }
    }
  } catch (const moet::Error&) {
  }
  return 0;
}
