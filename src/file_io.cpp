#include "barata/file_io.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "barata/error.h"

namespace barata {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

}  // namespace

int open_regular_file(const std::filesystem::path& path, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail("{}: cannot open the {}: {}", path.string(), what, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("{}: cannot stat the {}: {}", path.string(), what, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: the {} is {}, not a regular file", path.string(), what, kind_of(st.st_mode));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::filesystem::path& path, std::string_view what,
                              size_t max_bytes) {
  const int fd = open_regular_file(path, what);
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    fail("{}: the {} has {} bytes, more than the {} this reads", path.string(), what,
         static_cast<uint64_t>(st.st_size), max_bytes);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      fail("{}: cannot read the {}: {}", path.string(), what, std::strerror(e));
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      ::close(fd);
      fail("{}: the {} grew past the {} bytes this reads", path.string(), what, max_bytes);
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string read_stream_bounded(std::FILE* f, std::string_view what, size_t max_bytes) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const size_t n = std::fread(buf, 1, sizeof buf, f);
    if (n == 0) {
      if (std::ferror(f)) fail("cannot read {}: {}", what, std::strerror(errno));
      break;
    }
    if (out.size() + n > max_bytes)
      fail("{} holds more than {} bytes; give a smaller input", what, max_bytes);
    out.append(buf, n);
  }
  return out;
}

std::string printable(std::string_view s, size_t max_chars) {
  std::string out;
  auto hex = [&](unsigned char c) { out += fmt::format("\\x{:02x}", c); };
  size_t i = 0;
  while (i < s.size()) {
    if (out.size() >= max_chars && max_chars != std::string::npos) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n", ++i;
    } else if (c == '\t') {
      out += "\\t", ++i;
    } else if (c == '\r') {
      out += "\\r", ++i;
    } else if (c < 0x20 || c == 0x7f) {
      hex(c), ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c), ++i;
    } else {
      // Keep one whole, valid, non-overlong UTF-8 sequence; else escape a byte.
      const int len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
      bool ok = len > 0 && c < 0xf5 && i + static_cast<size_t>(len) <= s.size();
      uint32_t cp = 0;
      if (ok) {
        cp = c & (0x7f >> len);
        for (int k = 1; k < len && ok; ++k) {
          const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
          ok = (cc & 0xc0) == 0x80;
          cp = (cp << 6) | (cc & 0x3f);
        }
        ok = ok && !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
             !(cp >= 0xd800 && cp <= 0xdfff) && !(cp >= 0x80 && cp < 0xa0) && cp != 0x2028 &&
             cp != 0x2029;
      }
      if (ok) {
        out.append(s.substr(i, static_cast<size_t>(len)));
        i += static_cast<size_t>(len);
      } else {
        hex(c), ++i;
      }
    }
  }
  return out;
}

}  // namespace barata
