// The CPU kernel path the C++ test suites run (included as "../cpu_isa_env.h"): the best this CPU
// has, the level MOET_CPU_ISA names (as cli's --cpu-isa), or the portable one when
// MOET_CPU_SCALAR=1 (the *_scalar_paths CTest entries run whole suites that way). A test binary
// is an edge like the CLI: it reads the environment and passes the choice down; the kernels never
// read it. Tests that run every level take them from kCpuIsas and skip those this CPU lacks.
#pragma once

#include "core/cpu_isa.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <string>

namespace moet {

inline CpuIsa test_cpu_isa() {
  const char* scalar = std::getenv("MOET_CPU_SCALAR");
  if (scalar != nullptr && std::strcmp(scalar, "0") != 0) return CpuIsa::portable;
  const char* named = std::getenv("MOET_CPU_ISA");
  return named != nullptr ? cpu_isa_parse(named) : cpu_isa_best();
}

inline constexpr std::array kCpuIsas{CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512};

// For GTEST_SKIP: why `isa` cannot run here ("" where it can).
inline std::string cpu_isa_missing(CpuIsa isa) {
  return cpu_supports(isa) ? "" : std::string("this CPU lacks the ") + cpu_isa_name(isa) + " level";
}

}  // namespace moet
