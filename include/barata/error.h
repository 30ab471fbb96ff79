// Errors carried to the CLI boundary, which prints one line and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace barata {

// Any failure caused by user input (a file, a flag, a key). The message is one
// line that names what and where; the CLI prints it after "error: ".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace barata
