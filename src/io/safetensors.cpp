// safetensors reader (mmap + full header validation) and a small writer (see safetensors.h).
#include "io/safetensors.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>

namespace moet {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::vector<int64_t> parse_shape(const nlohmann::json& entry, const std::string& where) {
  const auto it = entry.find("shape");
  MOET_CHECK(it != entry.end() && it->is_array(), "{}: missing or non-array 'shape'", where);
  std::vector<int64_t> shape;
  for (const auto& dim : *it) {
    MOET_CHECK(dim.is_number_integer() && dim.get<int64_t>() >= 0,
               "{}: shape entries must be non-negative integers", where);
    shape.push_back(dim.get<int64_t>());
  }
  return shape;
}

HostTensor parse_entry(const std::string& name, const nlohmann::json& entry, const uint8_t* data,
                       uint64_t data_bytes, const std::string& file) {
  const std::string where = fmt::format("{}: tensor '{}'", file, name);
  MOET_CHECK(entry.is_object(), "{}: header entry is not an object", where);
  const auto dtype_it = entry.find("dtype");
  MOET_CHECK(dtype_it != entry.end() && dtype_it->is_string(), "{}: missing 'dtype'", where);
  DType dtype;
  MOET_CHECK(dtype_parse(dtype_it->get<std::string>(), &dtype), "{}: unsupported dtype '{}'",
             where, dtype_it->get<std::string>());
  HostTensor info{name, dtype, parse_shape(entry, where), nullptr, 0, file};
  const auto offsets = entry.find("data_offsets");
  MOET_CHECK(offsets != entry.end() && offsets->is_array() && offsets->size() == 2 &&
                 (*offsets)[0].is_number_unsigned() && (*offsets)[1].is_number_unsigned(),
             "{}: 'data_offsets' must be two non-negative integers", where);
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  MOET_CHECK(begin <= end, "{}: data_offsets begin {} > end {}", where, begin, end);
  MOET_CHECK(end <= data_bytes,
             "{}: data_offsets end {} points past the end of the data ({} bytes): file truncated?",
             where, end, data_bytes);
  uint64_t expected = dtype_size(dtype);
  for (int64_t dim : info.shape) {
    MOET_CHECK(dim == 0 || expected <= UINT64_MAX / uint64_t(dim), "{}: shape overflows", where);
    expected *= uint64_t(dim);
  }
  MOET_CHECK(expected == end - begin, "{}: shape {} x {} needs {} bytes but data_offsets span {}",
             where, info.shape_text(), dtype_name(dtype), expected, end - begin);
  info.data = data + begin;
  info.bytes = size_t(end - begin);
  return info;
}

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string file = path.string();
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  MOET_CHECK(fd >= 0, "{}: cannot open: {}", file, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat: {}", file, std::strerror(errno));
  }
  const uint64_t file_bytes = uint64_t(st.st_size);
  std::unique_ptr<SafetensorsFile> result(new SafetensorsFile());
  result->path_ = path;
  if (file_bytes > 0) {
    void* mapping = mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    MOET_CHECK(mapping != MAP_FAILED, "{}: mmap failed: {}", file, std::strerror(errno));
    result->mapping_ = mapping;
    result->mapping_bytes_ = file_bytes;
  } else {
    ::close(fd);
  }
  MOET_CHECK(file_bytes >= 8, "{}: {} bytes is too short for a safetensors file", file, file_bytes);
  const auto* bytes = static_cast<const uint8_t*>(result->mapping_);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes, 8);  // little-endian host assumed (x86-64, aarch64)
  MOET_CHECK(header_bytes <= kMaxHeaderBytes && header_bytes <= file_bytes - 8,
             "{}: header length {} exceeds the file ({} bytes): truncated or not safetensors",
             file, header_bytes, file_bytes);
  result->header_.assign(reinterpret_cast<const char*>(bytes + 8), size_t(header_bytes));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(result->header_);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: header is not valid JSON: {}", file, e.what());
  }
  MOET_CHECK(header.is_object(), "{}: header is not a JSON object", file);
  const uint8_t* data = bytes + 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    result->tensors_.push_back(parse_entry(name, entry, data, data_bytes, file));
  }
  std::vector<const HostTensor*> by_offset;
  for (const auto& info : result->tensors_) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const HostTensor* a, const HostTensor* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const HostTensor* prev = by_offset[i - 1];
    MOET_CHECK(prev->data + prev->bytes <= by_offset[i]->data, "{}: tensors '{}' and '{}' overlap",
               file, prev->name, by_offset[i]->name);
  }
  return result;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

void safetensors_write(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& tensor : tensors) {
    header[tensor.name] = {{"dtype", std::string(dtype_name(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  MOET_CHECK(out.good(), "{}: cannot create", path.string());
  const uint64_t header_bytes = text.size();
  out.write(reinterpret_cast<const char*>(&header_bytes), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& tensor : tensors)
    out.write(reinterpret_cast<const char*>(tensor.bytes.data()), std::streamsize(tensor.bytes.size()));
  MOET_CHECK(out.good(), "{}: write failed", path.string());
}

}  // namespace moet
