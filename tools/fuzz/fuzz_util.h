// Shared by the libFuzzer targets: the input as a string, and a per-process scratch file for
// loaders that read from a path (the safetensors header, the pack sidecar).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace moet::fuzz {

inline std::string input(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

// Writes bytes to this process's scratch file (under TMPDIR) and returns its path.
inline std::filesystem::path scratch_file(const std::string& bytes, const char* suffix) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("moet_fuzz_" + std::to_string(::getpid()) + suffix);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  return path;
}

// Aborts (so libFuzzer reports the input) when a property does not hold.
inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace moet::fuzz
