// UTF-8 and JSON-nesting checks of bytes from a client (barata serve).
// Internal to barata_server. Client bytes become text for a message, a log
// line or a label through barata::printable (barata/file_io.h), the one
// escaping function of the project.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace barata::net {

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
