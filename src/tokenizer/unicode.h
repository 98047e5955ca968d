// UTF-8 and Unicode helpers for the tokenizer: decoding/encoding code points, lossy repair of
// invalid UTF-8 (each maximal ill-formed subpart becomes one U+FFFD, exactly like Rust's
// String::from_utf8_lossy and Python's errors="replace"), GPT-2's byte<->unicode table used by
// byte-level BPE, and Unicode normalization forms through utf8proc. All functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moet::tok {

// Length in bytes of the valid UTF-8 sequence starting at s[i], or 0 if it is ill-formed.
// For an ill-formed sequence, *bad_len receives the length of its maximal ill-formed subpart.
size_t utf8_valid_len(std::string_view s, size_t i, size_t* bad_len = nullptr);
bool utf8_is_valid(std::string_view s);
// Replaces every maximal ill-formed subpart with U+FFFD.
std::string utf8_lossy(std::string_view s);
// Decodes the (valid) code point at s[i] and advances i.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t cp);
// True when the string ends with U+FFFD (the detokenizer holds such text back).
bool utf8_ends_with_replacement(std::string_view s);

// GPT-2 bytes_to_unicode: the printable code point standing for byte b.
char32_t byte_to_unicode(uint8_t b);
// Inverse mapping of a whole token string; nullopt when a character is not in the table.
std::optional<std::string> unicode_to_bytes(std::string_view token);
// Byte string -> its byte-level (GPT-2) spelling.
std::string bytes_to_unicode_string(std::string_view bytes);

enum class NormalForm { nfc, nfd, nfkc, nfkd };
std::string unicode_normalize(std::string_view s, NormalForm form);
std::string unicode_lowercase(std::string_view s);

}  // namespace moet::tok
