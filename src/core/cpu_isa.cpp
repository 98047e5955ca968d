// CPU feature detection for kernel dispatch (see cpu_isa.h).
#include "core/cpu_isa.h"

#include <cpuid.h>

namespace moet {

bool cpu_supports_avx2() {
  static const bool supported = [] {
    __builtin_cpu_init();
    // F16C from CPUID (leaf 1, ECX bit 29): clang does not know __builtin_cpu_supports("f16c").
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return supported;
}

CpuIsa cpu_isa_best() { return cpu_supports_avx2() ? CpuIsa::avx2 : CpuIsa::portable; }

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::avx2 ? "avx2" : "portable"; }

}  // namespace moet
