// Pack readers (see pack_reader.h).
#include "io/pack_reader.h"

#include "core/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace moet {
namespace {

// The largest piece one reader thread reads at a time (a multiple of kPackAlign, so O_DIRECT pieces
// stay aligned): a batch of a few 5-12 MB rows then still spreads over every thread.
constexpr uint64_t kReadPiece = uint64_t(1) << 20;

std::vector<IoRequest> in_pieces(const std::vector<IoRequest>& requests) {
  std::vector<IoRequest> pieces;
  for (const IoRequest& r : requests)
    for (uint64_t done = 0; done < r.bytes; done += kReadPiece)
      pieces.push_back({r.offset + done, std::min(kReadPiece, r.bytes - done), r.dst + done});
  return pieces;
}

}  // namespace

const char* pack_io_name(PackIo io) {
  switch (io) {
    case PackIo::pread: return "pread";
    case PackIo::direct: return "direct";
    case PackIo::uring: return "uring";
  }
  return "?";
}

std::unique_ptr<PackReader> PackReader::open(const PackPaths& paths, const PackSpec& expected,
                                             PackIo io, int threads) {
  const std::string reason = pack_check(paths, expected);
  MOET_CHECK(reason.empty(), "pack {} is not usable: {} (rebuild it with `moet pack`)",
             paths.pack.string(), reason);
  return std::unique_ptr<PackReader>(new PackReader(paths, expected, io, threads));
}

PackReader::PackReader(const PackPaths& paths, const PackSpec& spec, PackIo io, int threads)
    : spec_(spec), stride_(spec.layout().stride), io_(io), path_(paths.pack.string()) {
  const int flags = O_RDONLY | O_CLOEXEC | (io == PackIo::direct ? O_DIRECT : 0);
  fd_ = ::open(path_.c_str(), flags);
  if (fd_ < 0 && io == PackIo::direct && errno == EINVAL)
    fail("{}: O_DIRECT refused by this file system", path_);
  MOET_CHECK(fd_ >= 0, "{}: cannot open: {}", path_, std::strerror(errno));
  if (io == PackIo::uring) {
    try {
      uring_ = std::make_unique<UringReader>(fd_, 64);
    } catch (...) {
      ::close(fd_);
      throw;
    }
  } else {
    pool_ = std::make_unique<ThreadPool>(threads);
  }
}

PackReader::~PackReader() {
  uring_.reset();
  if (fd_ >= 0) ::close(fd_);
}

void PackReader::read(std::span<const PackRead> reads) {
  std::vector<IoRequest> requests;
  requests.reserve(reads.size());
  for (const PackRead& r : reads) {
    const int64_t local = r.expert - spec_.expert_begin();
    MOET_CHECK(r.layer >= 0 && r.layer < spec_.n_layers && local >= 0 && local < spec_.expert_count(),
               "{}: (layer {}, expert {}) is not in this pack", path_, r.layer, r.expert);
    if (io_ == PackIo::direct)
      MOET_CHECK(reinterpret_cast<uintptr_t>(r.dst) % kPackAlign == 0,
                 "{}: O_DIRECT reads need {}-byte aligned buffers", path_, kPackAlign);
    requests.push_back({spec_.row_offset(r.layer, local), stride_, r.dst});
  }
  if (io_ == PackIo::uring) {
    uring_->read(requests);
    return;
  }
  if (io_ == PackIo::pread) {
    for (const IoRequest& r : requests) ::posix_fadvise(fd_, off_t(r.offset), off_t(r.bytes), POSIX_FADV_WILLNEED);
  }
  const std::vector<IoRequest> pieces = in_pieces(requests);
  pool_->parallel_for(pieces.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) pread_full(fd_, pieces[i].dst, pieces[i].bytes, pieces[i].offset, path_.c_str());
  });
}

}  // namespace moet
