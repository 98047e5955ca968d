// io_uring batch reads (see pack_uring.h); without liburing the constructor throws.
#include "io/pack_uring.h"

#include "core/error.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#ifdef MOET_HAVE_LIBURING
#include <liburing.h>
#endif

namespace moet {

void pread_full(int fd, uint8_t* dst, uint64_t bytes, uint64_t offset, const char* what) {
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, dst, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    MOET_CHECK(n >= 0, "{}: read at offset {} failed: {}", what, offset, std::strerror(errno));
    MOET_CHECK(n > 0, "{}: unexpected end of file at offset {}", what, offset);
    dst += n;
    bytes -= uint64_t(n);
    offset += uint64_t(n);
  }
}

#ifdef MOET_HAVE_LIBURING

struct UringReader::Ring {
  io_uring ring;
  unsigned depth;
};

UringReader::UringReader(int fd, unsigned depth) : ring_(std::make_unique<Ring>()), fd_(fd) {
  ring_->depth = depth;
  const int rc = io_uring_queue_init(depth, &ring_->ring, 0);
  if (rc < 0) {
    ring_.reset();
    fail("io_uring unavailable: io_uring_queue_init: {}", std::strerror(-rc));
  }
}

UringReader::~UringReader() {
  if (ring_) io_uring_queue_exit(&ring_->ring);
}

void UringReader::read(const std::vector<IoRequest>& requests) {
  size_t next = 0, done = 0;
  std::vector<int64_t> results(requests.size(), 0);
  unsigned in_flight = 0;
  while (done < requests.size()) {
    while (next < requests.size() && in_flight < ring_->depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
      if (!sqe) break;
      const IoRequest& r = requests[next];
      io_uring_prep_read(sqe, fd_, r.dst, unsigned(r.bytes), r.offset);
      io_uring_sqe_set_data64(sqe, next);
      ++next;
      ++in_flight;
    }
    const int submitted = io_uring_submit(&ring_->ring);
    MOET_CHECK(submitted >= 0, "io_uring_submit: {}", std::strerror(-submitted));
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(&ring_->ring, &cqe);
    MOET_CHECK(rc == 0, "io_uring_wait_cqe: {}", std::strerror(-rc));
    do {
      const uint64_t index = io_uring_cqe_get_data64(cqe);
      results[index] = cqe->res;
      io_uring_cqe_seen(&ring_->ring, cqe);
      --in_flight;
      ++done;
    } while (io_uring_peek_cqe(&ring_->ring, &cqe) == 0);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const IoRequest& r = requests[i];
    MOET_CHECK(results[i] >= 0, "io_uring read at offset {}: {}", r.offset, std::strerror(int(-results[i])));
    const uint64_t got = uint64_t(results[i]);
    if (got < r.bytes) pread_full(fd_, r.dst + got, r.bytes - got, r.offset + got, "io_uring short read");
  }
}

#else

struct UringReader::Ring {};
UringReader::UringReader(int fd, unsigned) : fd_(fd) { fail("io_uring unavailable: moet was built without liburing"); }
UringReader::~UringReader() = default;
void UringReader::read(const std::vector<IoRequest>&) {}

#endif

}  // namespace moet
