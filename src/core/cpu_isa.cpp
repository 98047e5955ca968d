// CPU feature detection for kernel dispatch (see cpu_isa.h).
#include "core/cpu_isa.h"

#include "core/error.h"

#include <cpuid.h>
#include <cstdint>

namespace moet {
namespace {

// XCR0 (read with XGETBV where CPUID says the OS has enabled it): which register state the OS saves.
uint64_t os_saved_state() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_OSXSAVE)) return 0;
  uint32_t low = 0, high = 0;
  __asm__("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return uint64_t(high) << 32 | low;
}

}  // namespace

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

bool cpu_supports_avx512() {
  static const bool supported = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const unsigned needed = bit_AVX512F | bit_AVX512BW | bit_AVX512DQ | bit_AVX512VL;
    // XCR0 bits 1-2 (SSE, AVX), 5-7 (opmask, upper halves of ZMM0-15, ZMM16-31).
    constexpr uint64_t kZmmState = 0xe6;
    return cpu_supports_avx2() && (ebx & needed) == needed && (os_saved_state() & kZmmState) == kZmmState;
  }();
  return supported;
}

bool cpu_supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::portable: return true;
    case CpuIsa::avx2: return cpu_supports_avx2();
    case CpuIsa::avx512: return cpu_supports_avx512();
  }
  return false;
}

CpuIsa cpu_isa_best() {
  return cpu_supports_avx2() ? CpuIsa::avx2 : CpuIsa::portable;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::portable: return "portable";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
  }
  return "?";
}

CpuIsa cpu_isa_parse(std::string_view name) {
  if (name == "auto") return cpu_isa_best();
  for (const CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512}) {
    if (name != cpu_isa_name(isa)) continue;
    if (!cpu_supports(isa))
      fail("cpu isa {}: this CPU lacks it ({}; the best it has is {})", name,
           isa == CpuIsa::avx512 ? "AVX-512 F, BW, DQ and VL with ZMM state enabled by the OS"
                                 : "AVX2, FMA and F16C",
           cpu_isa_name(cpu_isa_best()));
    return isa;
  }
  fail("cpu isa {}: not one of auto, portable, avx2, avx512", name);
}

}  // namespace moet
