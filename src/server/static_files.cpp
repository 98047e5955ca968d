// serve_static_file (see static_files.h). No page is built in yet.
#include "server/static_files.h"

namespace moet::server {

bool serve_static_file(const std::string&, HttpExchange&) { return false; }

}  // namespace moet::server
