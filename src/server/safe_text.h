// The one place where bytes from a client become text for an error message,
// a log line or a metric label (barata serve). Internal to barata_server.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace barata::net {

// `bytes` as valid, printable UTF-8 of at most about `max_bytes` bytes: valid
// UTF-8 passes (code points at and above U+00A0, and printable ASCII); control
// characters, invalid or overlong sequences and surrogates become \xNN escapes;
// a longer input is cut at a character boundary and ends with "...(N bytes)".
// Never throws; the result is safe in JSON (once escaped), a log and a label.
std::string printable(std::string_view bytes, size_t max_bytes = 200);

// The length of the valid UTF-8 sequence at s[0] (1..4), or 0 when it is not
// one (invalid lead, truncated, overlong, surrogate, above U+10FFFF).
size_t utf8_sequence(std::string_view s);

// True when the whole string is valid UTF-8.
bool valid_utf8(std::string_view s);

// The deepest nesting of arrays and objects in JSON text (strings skipped,
// so brackets inside them do not count), stopping early once it passes
// `limit`. An iterative scan: no recursion depends on the input.
size_t json_depth(std::string_view text, size_t limit);

}  // namespace barata::net
