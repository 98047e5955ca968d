// The chat page served at / (static files compiled into the binary from src/server/static/).
#pragma once

#include "server/http_types.h"

#include <string>

namespace moet::server {

// Answers a GET of one of the page's files ("/" is index.html); false for any other path.
bool serve_static_file(const std::string& path, HttpExchange& exchange);

}  // namespace moet::server
