// Pack building with atomic replacement and writer serialisation (see pack_writer.h).
#include "io/pack_writer.h"

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

namespace moet {
namespace {

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

void write_all(int fd, const uint8_t* data, uint64_t bytes, uint64_t offset, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, std::min<uint64_t>(bytes, 1ull << 30), off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    MOET_CHECK(n > 0, "{}: write failed: {}", path, std::strerror(errno));
    data += n;
    bytes -= uint64_t(n);
    offset += uint64_t(n);
  }
}

void sync_file(int fd, const std::string& path) {
  MOET_CHECK(::fdatasync(fd) == 0, "{}: fdatasync failed: {}", path, std::strerror(errno));
}

void sync_dir(const std::filesystem::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY));
  if (fd.fd >= 0) ::fsync(fd.fd);
}

// Holds an exclusive flock on `path` for its lifetime.
class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    MOET_CHECK(fd_.fd >= 0, "{}: cannot open lock file: {}", path.string(), std::strerror(errno));
    while (::flock(fd_.fd, LOCK_EX) != 0) {
      MOET_CHECK(errno == EINTR, "{}: flock failed: {}", path.string(), std::strerror(errno));
    }
  }

 private:
  Fd fd_;
};

void remove_dead_temps(const PackPaths& paths) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(paths.pack.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    for (const auto* base : {&paths.pack, &paths.sidecar}) {
      const std::string prefix = base->filename().string() + ".tmp.";
      if (name.rfind(prefix, 0) == 0) std::filesystem::remove(entry.path(), ec);
    }
  }
}

void build_locked(const PackPaths& paths, const PackSpec& spec, const PackRowFn& rows, bool show_progress) {
  remove_dead_temps(paths);
  const SlotLayout layout = spec.layout();
  const std::string suffix = ".tmp." + std::to_string(::getpid());
  const std::filesystem::path pack_tmp = paths.pack.string() + suffix;
  const std::filesystem::path sidecar_tmp = paths.sidecar.string() + suffix;
  {
    Fd fd(::open(pack_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    MOET_CHECK(fd.fd >= 0, "{}: cannot create: {}", pack_tmp.string(), std::strerror(errno));
    MOET_CHECK(::ftruncate(fd.fd, off_t(spec.file_bytes())) == 0, "{}: cannot size to {} bytes: {}",
               pack_tmp.string(), spec.file_bytes(), std::strerror(errno));
    const uint64_t experts = spec.layers.size() * uint64_t(spec.expert_count());
    std::optional<Progress> progress;
    if (show_progress) progress.emplace(fmt::format("pack {}", paths.pack.filename().string()),
                                        experts * layout.slot_bytes, true);
    std::vector<uint8_t> slot(layout.stride, 0);
    for (int64_t layer : spec.layers) {
      for (int64_t e = 0; e < spec.expert_count(); ++e) {
        std::fill(slot.begin(), slot.end(), uint8_t(0));
        rows(layer, spec.expert_begin() + e, slot.data());
        write_all(fd.fd, slot.data(), layout.stride, spec.row_offset(layer, e), pack_tmp.string());
        if (progress) progress->advance(layout.slot_bytes);
      }
    }
    sync_file(fd.fd, pack_tmp.string());
  }
  {
    const std::string text = pack_sidecar_json(spec).dump(2) + "\n";
    Fd fd(::open(sidecar_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    MOET_CHECK(fd.fd >= 0, "{}: cannot create: {}", sidecar_tmp.string(), std::strerror(errno));
    write_all(fd.fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), 0, sidecar_tmp.string());
    sync_file(fd.fd, sidecar_tmp.string());
  }
  std::error_code ec;
  std::filesystem::remove(paths.sidecar, ec);
  std::filesystem::rename(pack_tmp, paths.pack);
  std::filesystem::rename(sidecar_tmp, paths.sidecar);
  sync_dir(paths.pack.parent_path());
}

// The slots of a checkpoint's experts: quantized from their sources.
PackRowFn quantized_rows(const PackSpec& spec, const ExpertSourceFn& sources, ThreadPool& pool) {
  return [&spec, &sources, &pool](int64_t layer, int64_t expert, uint8_t* slot) {
    pack_quantize_slot(spec, sources(layer, expert), pool, slot);
  };
}

}  // namespace

void pack_quantize_slot(const PackSpec& spec, const ExpertSources& src, ThreadPool& pool, uint8_t* slot) {
  const SlotLayout s = spec.layout();
  const int64_t I = spec.intermediate, H = spec.hidden;
  const auto check = [&](const SourceView& v, int64_t rows, int64_t cols) {
    MOET_CHECK(v.rows == rows && v.cols == cols, "tensor {}: shape [{}, {}], expected [{}, {}]",
               v.name, v.rows, v.cols, rows, cols);
  };
  check(src.gate, I, H);
  check(src.up, I, H);
  check(src.down, H, I);
  const uint64_t half_codes = store_codes_bytes(spec.format, I, H), half_scales = store_scales_bytes(I, H);
  const auto quantize = [&](const SourceView& v, const float* importance, const W2kLdlqFactor* ldlq, uint8_t* codes,
                            uint8_t* scales) {
    quantize_into(spec.format, v, {spec.zero_mode, spec.w2_quantizer, importance, ldlq}, pool, codes, scales);
  };
  const W2kLdlqFactor* gate_up = src.gate_up_ldlq.get();
  quantize(src.gate, src.gate_up_importance, gate_up, slot + s.codes13, slot + s.scales13);
  quantize(src.up, src.gate_up_importance, gate_up, slot + s.codes13 + half_codes, slot + s.scales13 + half_scales);
  quantize(src.down, src.down_importance, src.down_ldlq.get(), slot + s.codes2, slot + s.scales2);
}

void pack_build(const PackPaths& paths, const PackSpec& spec, const ExpertSourceFn& sources,
                ThreadPool& pool, bool progress) {
  std::filesystem::create_directories(paths.pack.parent_path());
  FileLock lock(paths.lock);
  build_locked(paths, spec, quantized_rows(spec, sources, pool), progress);
}

bool pack_ensure(const PackPaths& paths, const PackSpec& spec, const ExpertSourceFn& sources,
                 ThreadPool& pool, bool progress) {
  return pack_ensure_rows(paths, spec, quantized_rows(spec, sources, pool), progress);
}

bool pack_ensure_rows(const PackPaths& paths, const PackSpec& spec, const PackRowFn& rows, bool progress) {
  if (pack_check(paths, spec).empty()) return false;
  std::filesystem::create_directories(paths.pack.parent_path());
  FileLock lock(paths.lock);
  const std::string reason = pack_check(paths, spec);
  if (reason.empty()) {
    MOET_LOG_INFO("pack {}: built by another writer meanwhile, reusing it", paths.pack.string());
    return false;
  }
  MOET_LOG_INFO("pack {} is stale ({}): rebuilding", paths.pack.string(), reason);
  build_locked(paths, spec, rows, progress);
  return true;
}

}  // namespace moet
