// The CPU kernel path the C++ test suites run (included as "../cpu_isa_env.h"): the best this CPU
// has, or the portable one when MOET_CPU_SCALAR=1 (the *_scalar_paths CTest entries run whole
// suites that way). A test binary is an edge like the CLI: it reads the environment and passes
// the choice down; the kernels never read it.
#pragma once

#include "core/cpu_isa.h"

#include <cstdlib>
#include <cstring>

namespace moet {

inline CpuIsa test_cpu_isa() {
  const char* scalar = std::getenv("MOET_CPU_SCALAR");
  return scalar != nullptr && std::strcmp(scalar, "0") != 0 ? CpuIsa::portable : cpu_isa_best();
}

}  // namespace moet
