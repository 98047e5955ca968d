// Which code path the CPU kernels take: the portable one, the AVX2 builds (kernels/cpu/*_avx2.cpp,
// compiled with AVX2 + FMA + F16C) or the AVX-512 builds (kernels/cpu/*_avx512.cpp, compiled with
// AVX-512 F/BW/DQ/VL besides). The levels are nested: avx512 is chosen only where avx2 is there too,
// and a kernel without an AVX-512 version runs its AVX2 one at that level (cpu_isa_has_avx2).
// The kernels never read the environment: the edge (cli's --cpu-isa / --cpu-portable, tests'
// MOET_CPU_ISA / MOET_CPU_SCALAR) picks an isa, and it is passed down with each call.
// cpu_isa_best() is avx2 where the CPU has it: the avx512 level (the W2 products only; the same bits
// as avx2) was measured slower on the only AVX-512 CPU measured so far, an AMD Zen 4, which splits
// 512-bit operations into two 256-bit halves (bench/results/experts_host_avx512_cpu_dev.txt); it is
// chosen by name until a CPU with full-width units measures it faster.
#pragma once

#include <string_view>

namespace moet {

enum class CpuIsa { portable, avx2, avx512 };

// AVX2 + FMA + F16C present on this CPU.
bool cpu_supports_avx2();
// AVX2 as above, AVX-512 F + BW + DQ + VL on this CPU, and the OS saving the ZMM and mask state.
bool cpu_supports_avx512();
bool cpu_supports(CpuIsa isa);
CpuIsa cpu_isa_best();
const char* cpu_isa_name(CpuIsa isa);

// Whether kernels run their AVX2 builds (or better) at this level.
constexpr bool cpu_isa_has_avx2(CpuIsa isa) { return isa != CpuIsa::portable; }

// The level a flag names: "auto" (cpu_isa_best()), "portable", "avx2" or "avx512"; throws
// moet::Error for another name or a level this CPU lacks.
CpuIsa cpu_isa_parse(std::string_view name);

}  // namespace moet
