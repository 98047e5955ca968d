// The chat page served at / : static files compiled into the binary from src/server/static/
// (embed_static.cmake writes their bytes into static_files_data.cpp at build time).
#pragma once

#include "server/http_types.h"

#include <cstddef>
#include <string>

namespace moet::server {

struct EmbeddedFile {
  const char* path;  // "/index.html"
  const unsigned char* data;
  size_t size;
};
extern const EmbeddedFile kEmbeddedFiles[];
extern const size_t kEmbeddedFileCount;

// Answers a GET of one of the page's files ("/" is /index.html); false for any other path.
bool serve_static_file(const std::string& path, HttpExchange& exchange);

}  // namespace moet::server
