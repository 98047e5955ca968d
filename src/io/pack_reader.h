// Reading expert slots from a pack file. open() accepts only a pack that pack_check passes
// against the caller's expectation and otherwise throws a moet::Error saying why (stale,
// truncated, corrupt sidecar), so a stale pack is never used. read() fetches a batch of slots,
// each `stride` bytes, into caller buffers with one of three back ends:
//   pread   a pool of threads doing buffered preads of pieces of at most 1 MiB, so a batch of a few
//           rows keeps every thread busy (default; POSIX_FADV_WILLNEED hints first)
//   direct  the same through an O_DIRECT descriptor (buffers and stride 4 KiB aligned)
//   uring   one io_uring submission of the whole batch (when built with liburing)
// A reader is used by one thread at a time (its thread pool runs one batch at a time).
#pragma once

#include "core/thread_pool.h"
#include "io/pack_format.h"
#include "io/pack_uring.h"

#include <memory>
#include <span>

namespace moet {

enum class PackIo { pread, direct, uring };
const char* pack_io_name(PackIo io);

struct PackRead {
  int64_t layer;
  int64_t expert;  // global expert index (must be in the rank's range)
  uint8_t* dst;    // stride bytes
};

class PackReader {
 public:
  // Throws when the pack is stale or unreadable, or when `io` cannot be set up here (the message
  // says which: O_DIRECT refused by the file system, io_uring refused by the kernel).
  static std::unique_ptr<PackReader> open(const PackPaths& paths, const PackSpec& expected,
                                          PackIo io = PackIo::pread, int threads = 8);
  ~PackReader();
  PackReader(const PackReader&) = delete;
  PackReader& operator=(const PackReader&) = delete;

  const PackSpec& spec() const { return spec_; }
  uint64_t stride() const { return stride_; }
  PackIo io() const { return io_; }
  void read(std::span<const PackRead> reads);

 private:
  PackReader(const PackPaths& paths, const PackSpec& spec, PackIo io, int threads);

  PackSpec spec_;
  uint64_t stride_;
  PackIo io_;
  std::string path_;
  int fd_ = -1;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<UringReader> uring_;
};

}  // namespace moet
