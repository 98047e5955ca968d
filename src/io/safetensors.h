// safetensors files, memory-mapped and validated. A file is an 8-byte little-endian header
// length N, N bytes of JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__"}),
// then the data. open() checks every field before any tensor is handed out: known dtype,
// non-negative shape, begin <= end inside the file, no two tensors overlapping, and
// product(shape) * dtype size == end - begin. Every error names the file and the tensor.
#pragma once

#include "core/dtype.h"
#include "core/host_tensor.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace moet {

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws moet::Error naming the file (and tensor) on any fault.
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<HostTensor>& tensors() const { return tensors_; }
  const std::string& header_json() const { return header_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  SafetensorsFile() = default;

  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  std::string header_;
  std::vector<HostTensor> tensors_;
};

// Writes tensors to a safetensors file (used by tests and tools that convert checkpoints).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
// `metadata` (optional) becomes the header's "__metadata__" object of string values.
void safetensors_write(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace moet
