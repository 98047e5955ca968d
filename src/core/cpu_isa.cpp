// CPU feature detection for kernel dispatch (see cpu_isa.h).
#include "core/cpu_isa.h"

namespace moet {

bool cpu_supports_avx2() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }();
  return supported;
}

CpuIsa cpu_isa_best() { return cpu_supports_avx2() ? CpuIsa::avx2 : CpuIsa::portable; }

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::avx2 ? "avx2" : "portable"; }

}  // namespace moet
