// The CPU kernel levels a flag can name (core/cpu_isa.h): auto is the best this CPU has, each level
// is accepted exactly where the CPU has it (with a message naming what is missing otherwise), the
// levels are nested, and other names are refused.
#include "core/cpu_isa.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace moet {

TEST(CpuIsa, AutoIsTheBestThisCpuHas) { EXPECT_EQ(cpu_isa_parse("auto"), cpu_isa_best()); }

TEST(CpuIsa, ALevelIsAcceptedExactlyWhereTheCpuHasIt) {
  for (const CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512}) {
    if (cpu_supports(isa)) {
      EXPECT_EQ(cpu_isa_parse(cpu_isa_name(isa)), isa);
    } else {
      try {
        cpu_isa_parse(cpu_isa_name(isa));
        ADD_FAILURE() << cpu_isa_name(isa) << " accepted on a CPU without it";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("this CPU lacks it"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_TRUE(cpu_supports(cpu_isa_best()));
}

TEST(CpuIsa, LevelsAreNested) {
  EXPECT_TRUE(!cpu_supports_avx512() || cpu_supports_avx2());
  EXPECT_FALSE(cpu_isa_has_avx2(CpuIsa::portable));
  EXPECT_TRUE(cpu_isa_has_avx2(CpuIsa::avx2));
  EXPECT_TRUE(cpu_isa_has_avx2(CpuIsa::avx512));
}

TEST(CpuIsa, OtherNamesAreRefused) {
  EXPECT_THROW(cpu_isa_parse("sse4"), Error);
  EXPECT_THROW(cpu_isa_parse(""), Error);
}

}  // namespace moet
