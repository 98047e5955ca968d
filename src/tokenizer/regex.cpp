// PCRE2 wrapper (see regex.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include "core/error.h"
#include "tokenizer/unicode.h"

#include <pcre2.h>

namespace moet::tok {

namespace {

// One JIT stack per thread, grown to 8 MiB so long whitespace runs never hit the limit.
pcre2_jit_stack* thread_jit_stack() {
  struct Holder {
    pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    ~Holder() { pcre2_jit_stack_free(stack); }
  };
  thread_local Holder holder;
  return holder.stack;
}

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset,
                                   nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("regex /{}/ does not compile at offset {}: {}", pattern, offset,
         reinterpret_cast<const char*>(message));
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::for_each_match(std::string_view subject,
                           const std::function<void(size_t, size_t)>& on_match) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  if (jit_) pcre2_jit_stack_assign(context, nullptr, thread_jit_stack());
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  int rc = 0;
  while (start <= subject.size()) {
    rc = jit_ ? pcre2_jit_match(code, text, subject.size(), start, 0, data, context)
              : pcre2_match(code, text, subject.size(), start, PCRE2_NO_UTF_CHECK, data, context);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      on_match(begin, end);
      start = end;
    } else {
      if (begin >= subject.size()) break;
      size_t next = begin;
      utf8_next(subject, next);
      start = next;
    }
  }
  pcre2_match_context_free(context);
  pcre2_match_data_free(data);
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) fail("regex /{}/ failed to match (pcre2 error {})", pattern_, rc);
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace moet::tok
