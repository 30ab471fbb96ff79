// Files written in full or not at all: the bytes go to a temporary file in
// the destination's folder, are flushed and fsync'd, and the temporary is
// renamed over the destination only when complete.
//
// The temporary is preferably unnamed (O_TMPFILE), so that nothing can be left
// behind. Where the file system lacks O_TMPFILE (or BARATA_NO_O_TMPFILE=1 is
// set in the environment, which tests use to force this path) it is a named
// file `.<name>.tmp-<pid>-XXXXXX` beside the destination, which
//   - is removed on SIGTERM, SIGINT and SIGHUP (when those have their default
//     action; the signal then takes its default action), and on any error;
//   - after a SIGKILL or a power loss, is removed by the next write of the same
//     destination: temporaries of that name whose process is gone, or which no
//     live writer holds locked (a reused pid), are swept first.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace barata {

class AtomicFile {
 public:
  // Sweeps stale temporaries of `out` and creates a new one; throws
  // barata::Error naming `out` when the folder does not take one.
  explicit AtomicFile(const std::filesystem::path& out);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  // Without commit(): the temporary is closed and removed.
  ~AtomicFile();

  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return out_; }  // the destination

  // Writes all of `bytes` at the current position (EINTR retried, a short
  // write continued); throws barata::Error naming the destination.
  void write(const void* bytes, size_t n);
  // fsync, mode 0644, rename over the destination, fsync of the folder.
  void commit();

 private:
  void discard() noexcept;

  std::filesystem::path out_, dir_;
  std::string temp_;  // the temporary's name once it has one, else ""
  int fd_ = -1;
  int lock_fd_ = -1;    // a duplicate that keeps the lock until the rename
  bool armed_ = false;  // registered with the signal handler
};

// The whole of `bytes` to `out`, atomically as above.
void write_file_atomically(const std::filesystem::path& out, std::string_view bytes);

// True when the file name `name` has the form of a temporary of `out`
// (`.<out's name>.tmp-<pid>-XXXXXX`), live or stale.
bool is_temp_name_of(const std::filesystem::path& out, const std::string& name);

}  // namespace barata
