// UTF-8 helpers, GPT-2 byte-level table and utf8proc normalization (see unicode.h).
#include "tokenizer/unicode.h"

#include "core/error.h"

#include <utf8proc.h>

#include <array>
#include <cstdlib>

namespace moet::tok {

size_t utf8_valid_len(std::string_view s, size_t i, size_t* bad_len) {
  const auto at = [&](size_t k) -> int { return i + k < s.size() ? uint8_t(s[i + k]) : -1; };
  const int b0 = at(0);
  size_t bad = 1;
  size_t width = 0;
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) width = 2;
  else if (b0 >= 0xE0 && b0 <= 0xEF) width = 3;
  else if (b0 >= 0xF0 && b0 <= 0xF4) width = 4;
  if (width != 0) {
    int lo = 0x80, hi = 0xBF;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
    const int b1 = at(1);
    if (b1 >= lo && b1 <= hi) {
      size_t k = 2;
      while (k < width && at(k) >= 0x80 && at(k) <= 0xBF) ++k;
      if (k == width) return width;
      bad = k;
    }
  }
  if (bad_len) *bad_len = bad;
  return 0;
}

bool utf8_is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_valid_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t bad = 0;
    const size_t n = utf8_valid_len(s, i, &bad);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  const uint8_t b0 = s[i];
  if (b0 < 0x80) return s[i++];
  const size_t n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool utf8_ends_with_replacement(std::string_view s) {
  return s.size() >= 3 && s.substr(s.size() - 3) == "\xEF\xBF\xBD";
}

namespace {

// Every mapped code point is below 512, so the inverse is a flat array (-1: not a byte).
struct ByteTable {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};
  ByteTable() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_cp[b] = printable ? char32_t(b) : char32_t(256 + extra++);
      to_byte[to_cp[b]] = int16_t(b);
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return byte_table().to_cp[b]; }

std::optional<std::string> unicode_to_bytes(std::string_view token) {
  const auto& table = byte_table().to_byte;
  std::string out;
  for (size_t i = 0; i < token.size();) {
    if (utf8_valid_len(token, i) == 0) return std::nullopt;
    const char32_t cp = utf8_next(token, i);
    if (cp >= table.size() || table[cp] < 0) return std::nullopt;
    out.push_back(char(table[cp]));
  }
  return out;
}

std::string bytes_to_unicode_string(std::string_view bytes) {
  std::string out;
  for (char c : bytes) utf8_append(out, byte_to_unicode(uint8_t(c)));
  return out;
}

std::string unicode_normalize(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::nfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::nfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::nfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::nfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              utf8proc_ssize_t(s.size()), &dst, utf8proc_option_t(options));
  if (n < 0) fail("unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(dst), size_t(n));
  std::free(dst);
  return out;
}

std::string unicode_lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) utf8_append(out, char32_t(utf8proc_tolower(utf8_next(s, i))));
  return out;
}

}  // namespace moet::tok
