// bench_ops() (see bench_ops.h).
#include "backend/bench_ops.h"

namespace moet {

BenchOps& bench_ops(Backend& backend) {
  auto* ops = dynamic_cast<BenchOps*>(&backend);
  MOET_CHECK(ops != nullptr, "backend {} has no benchmark operations", backend.name());
  return *ops;
}

}  // namespace moet
