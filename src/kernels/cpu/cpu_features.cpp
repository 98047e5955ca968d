// cpu_has_avx2(): AVX2 + FMA + F16C present and not disabled by MOET_CPU_SCALAR.
#include "kernels/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace moet {

bool cpu_has_avx2() {
  static const bool enabled = [] {
    const char* force_scalar = std::getenv("MOET_CPU_SCALAR");
    if (force_scalar != nullptr && std::strcmp(force_scalar, "0") != 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return enabled;
}

}  // namespace moet
