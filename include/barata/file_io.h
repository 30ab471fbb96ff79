// Reading files that a user names: only regular files (a FIFO or a device
// would block or never end), opened without blocking, and every read bounded.
#pragma once

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace barata {

// Default bound for a text file a user names (a prompt, a JSON config).
inline constexpr size_t kMaxTextFileBytes = size_t{256} << 20;

// Opens path without blocking (O_NONBLOCK, so a FIFO cannot hang the open),
// checks that it is a regular file, and returns its descriptor in blocking
// mode. Throws barata::Error naming path and what on any failure.
int open_regular_file(const std::filesystem::path& path, std::string_view what);

// The whole of a regular file, at most max_bytes; larger is an error that
// names the path, the size and the bound.
std::string read_regular_file(const std::filesystem::path& path, std::string_view what,
                              size_t max_bytes = kMaxTextFileBytes);

// Everything from a stream (standard input), at most max_bytes; more is an
// error naming `what` and the bound (so `< /dev/zero` ends).
std::string read_stream_bounded(std::FILE* f, std::string_view what,
                                size_t max_bytes = kMaxTextFileBytes);

// Bytes from an untrusted source (a file's strings) made safe for one error
// or log line: printable ASCII and valid UTF-8 kept; NUL, control characters
// (newline, ESC, ...), DEL and invalid bytes written as \n, \t, \xNN; the
// result is cut at max_chars (npos: never) with "..." appended.
std::string printable(std::string_view bytes, size_t max_chars = 200);

}  // namespace barata
