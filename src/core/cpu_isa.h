// Which code path the CPU kernels take: the AVX2 builds (kernels/cpu/*_avx2.cpp, compiled with
// AVX2 + FMA + F16C) or the portable ones. The kernels never read the environment: the edge
// (cli's --cpu-portable, tests' MOET_CPU_SCALAR) picks an isa, and it is passed down with each call.
// cpu_isa_best() is the fastest the machine supports.
#pragma once

namespace moet {

enum class CpuIsa { portable, avx2 };

// AVX2 + FMA + F16C present on this CPU.
bool cpu_supports_avx2();
CpuIsa cpu_isa_best();
const char* cpu_isa_name(CpuIsa isa);

}  // namespace moet
