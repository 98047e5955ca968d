// A fresh directory under /tmp for one test, removed with everything in it when the test ends
// (included as "../temp_dir.h").
#pragma once

#include <stdlib.h>

#include <filesystem>

namespace moet {

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/moet-test-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace moet
