// Checks shared by the Communicator implementations (see communicator.h).
#include "backend/communicator.h"

#include "core/error.h"

namespace moet {

void communicator_check(const char* op, const Tensor& in, const Tensor& out, int64_t in_parts, int64_t out_parts) {
  MOET_CHECK(in.dtype == out.dtype, "{}: input {} and output {} differ in dtype", op, dtype_name(in.dtype),
             dtype_name(out.dtype));
  MOET_CHECK(in_parts > 0 && out_parts > 0 && in.numel() % in_parts == 0 && out.numel() % out_parts == 0 &&
                 in.numel() / in_parts == out.numel() / out_parts,
             "{}: {} input elements in {} parts do not match {} output elements in {} parts", op, in.numel(),
             in_parts, out.numel(), out_parts);
}

}  // namespace moet
