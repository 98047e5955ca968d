// StopMatcher implementation (see stop_matcher.h).
#include "engine/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace moet {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::push(std::string_view piece) {
  if (stopped_) return {};
  pending_.append(piece);
  if (stops_.empty()) return std::exchange(pending_, {});
  // The earliest stop string occurrence wins (it ends the text soonest).
  size_t first = std::string::npos;
  for (const auto& stop : stops_) {
    const size_t at = pending_.find(stop);
    if (at < first) {
      first = at;
      matched_ = stop;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    tail_ = pending_.substr(first + matched_.size());
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, pending_.size()); n > hold; --n) {
      if (std::string_view(pending_).substr(pending_.size() - n) == std::string_view(stop).substr(0, n)) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::finish() { return std::exchange(pending_, {}); }

}  // namespace moet
