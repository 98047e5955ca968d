// io_uring batch reads (built only when liburing is found: MOET_HAVE_LIBURING). One ring per
// reader; read() submits every request, waits for all completions and finishes short reads
// with pread. Construction throws moet::Error when the kernel refuses io_uring (old kernel,
// seccomp), so callers can report it and fall back.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace moet {

struct IoRequest {
  uint64_t offset;
  uint64_t bytes;
  uint8_t* dst;
};

class UringReader {
 public:
  UringReader(int fd, unsigned depth);
  ~UringReader();
  UringReader(const UringReader&) = delete;
  UringReader& operator=(const UringReader&) = delete;
  void read(const std::vector<IoRequest>& requests);

 private:
  struct Ring;
  std::unique_ptr<Ring> ring_;
  int fd_;
};

// pread until `bytes` are read (retries EINTR and short reads); throws naming `what` on error/EOF.
void pread_full(int fd, uint8_t* dst, uint64_t bytes, uint64_t offset, const char* what);

}  // namespace moet
