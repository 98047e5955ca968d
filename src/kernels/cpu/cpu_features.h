// Runtime CPU feature checks for kernel dispatch. MOET_CPU_SCALAR=1 forces the portable code
// paths (tests use it to compare the vectorised kernels with the scalar ones).
#pragma once

namespace moet {

bool cpu_has_avx2();

}  // namespace moet
