// UTF-8 helpers shared by the tokenizer, the streaming decoder and the output parsers.
// Invalid input is replaced the way Rust's String::from_utf8_lossy (and so HF `tokenizers`)
// does it: every maximal ill-formed subpart becomes one U+FFFD.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv41::text::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence starting at s[i], 0 when s[i..] starts with an ill-formed
// subpart, or -1 when s[i..] is a proper prefix of a well-formed sequence cut off by the end.
// When 0 is returned, *bad_len receives the length of the maximal ill-formed subpart.
int sequence_length(std::string_view s, size_t i, size_t* bad_len);

// Lossy conversion of arbitrary bytes into valid UTF-8.
std::string decode_lossy(std::string_view bytes);

// True when the whole string is well-formed UTF-8.
bool is_valid(std::string_view s);

// Number of leading bytes of s that form complete characters, leaving a trailing incomplete
// (but still completable) sequence out. Ill-formed bytes count as complete (they are final).
size_t complete_prefix(std::string_view s);

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
uint32_t next_code_point(std::string_view s, size_t& i);

// Appends the UTF-8 encoding of cp.
void append(std::string& out, uint32_t cp);

// Number of code points in valid UTF-8 text.
size_t count_code_points(std::string_view s);

// Unicode White_Space property (what Rust's char::is_whitespace tests).
bool is_white_space(uint32_t cp);

}  // namespace dsv41::text::utf8
