// cpu_has_avx2(): AVX2 + FMA + F16C present and not disabled by MOET_CPU_SCALAR.
#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace moet {

bool cpu_has_avx2() {
  static const bool enabled = [] {
    const char* force_scalar = std::getenv("MOET_CPU_SCALAR");
    if (force_scalar != nullptr && std::strcmp(force_scalar, "0") != 0) return false;
    __builtin_cpu_init();
    // F16C from CPUID (leaf 1, ECX bit 29): clang does not know __builtin_cpu_supports("f16c").
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return enabled;
}

}  // namespace moet
