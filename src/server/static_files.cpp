// serve_static_file (see static_files.h): the content type from the extension, and headers that
// keep the page from being framed or sniffed.
#include "server/static_files.h"

namespace moet::server {
namespace {

std::string content_type(const std::string& path) {
  if (path.ends_with(".html")) return "text/html; charset=utf-8";
  if (path.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (path.ends_with(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

}  // namespace

bool serve_static_file(const std::string& path, HttpExchange& exchange) {
  const std::string wanted = path == "/" ? "/index.html" : path;
  for (size_t i = 0; i < kEmbeddedFileCount; ++i) {
    const EmbeddedFile& f = kEmbeddedFiles[i];
    if (wanted != f.path) continue;
    exchange.respond({200, content_type(wanted), std::string(reinterpret_cast<const char*>(f.data), f.size),
                      {{"Cache-Control", "no-cache"},
                       {"X-Content-Type-Options", "nosniff"},
                       {"Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"}}});
    return true;
  }
  return false;
}

}  // namespace moet::server
