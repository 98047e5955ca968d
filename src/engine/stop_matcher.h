// StopMatcher: finds stop strings in streamed text that arrives in arbitrary pieces (one token's
// text at a time), so a stop string split over several tokens is still found. push() returns the
// text that is safe to emit: everything except a suffix that could still grow into a stop string
// (at most longest-stop - 1 bytes are held back). When a stop string appears, the text before it is
// emitted, the stop string and everything after it are dropped (OpenAI semantics), and stopped()
// becomes true. finish() returns the held-back text when generation ends for another reason.
// Pieces are expected to end on UTF-8 character boundaries (IncrementalDetokenizer guarantees it);
// the held-back suffix then also starts on one, because stop strings are valid UTF-8.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moet {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  std::string push(std::string_view piece);
  std::string finish();
  bool stopped() const { return stopped_; }
  // The stop string that matched (empty until stopped()).
  const std::string& matched() const { return matched_; }
  // The text that followed the stop string in the input seen so far (for splitters that continue
  // after a marker rather than stopping).
  const std::string& tail() const { return tail_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
  std::string tail_;
};

}  // namespace moet
