// AtomicFile: a temporary beside the destination (unnamed when the file
// system allows), renamed into place only when complete; named temporaries
// are removed on SIGTERM/SIGINT/SIGHUP and swept by the next write after a
// SIGKILL.
#include "barata/atomic_file.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "barata/error.h"

namespace barata {
namespace {

namespace fs = std::filesystem;

// ---- removal on a terminating signal (async-signal-safe) ---------------------
//
// One named temporary at a time is registered (the CLI writes one file at a
// time); a second concurrent write simply goes unregistered.

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};
constexpr size_t kNSignals = sizeof kSignals / sizeof kSignals[0];
char g_path[4096];
volatile std::sig_atomic_t g_armed = 0;
std::atomic<bool> g_slot{false};
bool g_installed[kNSignals];

extern "C" void remove_temp_and_reraise(int sig) {
  if (g_armed) ::unlink(g_path);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);  // blocked while this handler runs: delivered, with the default action, on return
}

// Registers `path`; false when another write holds the slot or the path is
// too long for the buffer.
bool arm(const std::string& path) {
  if (path.size() >= sizeof g_path) return false;
  bool expected = false;
  if (!g_slot.compare_exchange_strong(expected, true)) return false;
  std::memcpy(g_path, path.c_str(), path.size() + 1);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  g_armed = 1;
  for (size_t i = 0; i < kNSignals; ++i) {
    struct sigaction old {};
    g_installed[i] = false;
    if (::sigaction(kSignals[i], nullptr, &old) != 0) continue;
    // A signal the program ignores (nohup) or handles itself keeps its disposition.
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_handler = remove_temp_and_reraise;
    sigemptyset(&sa.sa_mask);
    for (int s : kSignals) sigaddset(&sa.sa_mask, s);
    g_installed[i] = ::sigaction(kSignals[i], &sa, nullptr) == 0;
  }
  return true;
}

void disarm() {
  for (size_t i = 0; i < kNSignals; ++i) {
    if (!g_installed[i]) continue;
    struct sigaction cur {};
    if (::sigaction(kSignals[i], nullptr, &cur) == 0 && cur.sa_handler == remove_temp_and_reraise) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      ::sigaction(kSignals[i], &dfl, nullptr);
    }
    g_installed[i] = false;
  }
  g_armed = 0;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  g_slot.store(false);
}

// ---- names and the sweep ---------------------------------------------------------

std::string temp_prefix(const fs::path& out) {
  return "." + out.filename().string() + ".tmp-";
}

// The pid in a temporary's name, or -1 when `name` is not one of `out`'s.
long temp_pid(const fs::path& out, const std::string& name) {
  const std::string prefix = temp_prefix(out);
  if (name.rfind(prefix, 0) != 0) return -1;
  const std::string rest = name.substr(prefix.size());  // <pid>-XXXXXX
  const size_t dash = rest.find('-');
  if (dash == 0 || dash == std::string::npos || dash > 10 || rest.size() != dash + 7) return -1;
  long pid = 0;
  for (size_t i = 0; i < dash; ++i) {
    if (rest[i] < '0' || rest[i] > '9') return -1;
    pid = pid * 10 + (rest[i] - '0');
  }
  return pid > 0 ? pid : -1;
}

// Removes temporaries of `out` left by writers that are gone: their process
// is dead, or it lives (a reused pid) but holds no lock on the file.
void sweep(const fs::path& dir, const fs::path& out) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return;
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    const long pid = temp_pid(out, name);
    if (pid < 0) continue;
    const std::string path = e.path().string();
    bool stale = ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    if (!stale) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) continue;
      struct stat st {};
      stale = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
      // Unlinked while still locked: a writer that checks its link count
      // after locking never finds its file gone from under it.
      if (stale) ::unlink(path.c_str());
      ::close(fd);
      continue;
    }
    ::unlink(path.c_str());
  }
}

bool tmpfile_disabled() {
  const char* v = std::getenv("BARATA_NO_O_TMPFILE");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

bool is_temp_name_of(const std::filesystem::path& out, const std::string& name) {
  return temp_pid(out, name) > 0;
}

AtomicFile::AtomicFile(const fs::path& out) : out_(out) {
  // The rename would replace whatever is at `out`: a device (/dev/null, as
  // root), a FIFO or a socket would become a regular file. Only a regular
  // file (or nothing) may be replaced.
  if (struct stat st{}; ::stat(out.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail("{}: the output exists and is {}; barata replaces only regular files", out.string(),
         S_ISDIR(st.st_mode)    ? "a directory"
         : S_ISFIFO(st.st_mode) ? "a FIFO"
         : S_ISCHR(st.st_mode)  ? "a character device"
         : S_ISBLK(st.st_mode)  ? "a block device"
                                : "not a plain file");
  dir_ = out.has_parent_path() ? out.parent_path() : fs::path(".");
  sweep(dir_, out_);
  // Preferably an unnamed file (O_TMPFILE): a crash or a kill while writing
  // leaves nothing behind. It gets a name only once complete, for the rename.
  if (!tmpfile_disabled()) fd_ = ::open(dir_.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  if (fd_ >= 0) {
    ::flock(fd_, LOCK_EX | LOCK_NB);  // held from creation, for the sweep of other writers
    return;
  }
  const std::string prefix = (dir_ / temp_prefix(out_)).string() + std::to_string(::getpid());
  for (int attempt = 0;; ++attempt) {
    std::string tmpl = prefix + "-XXXXXX";
    fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd_ < 0)
      fail("{}: cannot create a temporary file in {}: {}", out_.string(), dir_.string(),
           std::strerror(errno));
    struct stat st {};
    // Locked, and still linked (a sweep between mkostemp and flock may have
    // taken it for a stale one).
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd_, &st) == 0 && st.st_nlink > 0) {
      temp_ = std::move(tmpl);
      break;
    }
    ::close(fd_);
    fd_ = -1;
    if (attempt > 100) fail("{}: cannot lock a temporary file in {}", out_.string(), dir_.string());
  }
  armed_ = arm(temp_);
}

AtomicFile::~AtomicFile() {
  discard();
}

void AtomicFile::discard() noexcept {
  if (!temp_.empty()) ::unlink(temp_.c_str());
  if (armed_) disarm();
  armed_ = false;
  temp_.clear();
  if (fd_ >= 0) ::close(fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
  fd_ = lock_fd_ = -1;
}

void AtomicFile::write(const void* bytes, size_t n) {
  if (fd_ < 0) fail("{}: write after the file was finished", out_.string());
  const auto* p = static_cast<const uint8_t*>(bytes);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("{}: write failed: {}", out_.string(), std::strerror(errno));
    }
    if (w == 0) fail("{}: write failed: no progress", out_.string());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) fail("{}: the file was already finished", out_.string());
  try {
    if (::fsync(fd_) != 0) fail("{}: fsync failed: {}", out_.string(), std::strerror(errno));
    if (::fchmod(fd_, 0644) != 0) fail("{}: chmod failed: {}", out_.string(), std::strerror(errno));
    if (temp_.empty()) {  // unnamed: link it under a temporary name
      const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
      const std::string prefix = (dir_ / temp_prefix(out_)).string() + std::to_string(::getpid());
      for (int attempt = 0; temp_.empty(); ++attempt) {
        static const char kHex[] = "0123456789abcdef";
        uint64_t r = (static_cast<uint64_t>(::getpid()) << 20) ^
                     static_cast<uint64_t>(std::hash<std::string>{}(proc)) ^
                     (static_cast<uint64_t>(attempt) * 0x9E3779B97F4A7C15ull);
        std::string name = prefix + "-";
        for (int i = 0; i < 6; ++i, r >>= 4) name += kHex[r & 15];
        if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) {
          temp_ = name;
          armed_ = arm(temp_);
        } else if (errno != EEXIST || attempt > 100) {
          fail("{}: cannot link the finished file into {}: {}", out_.string(), dir_.string(),
               std::strerror(errno));
        }
      }
    }
    lock_fd_ = ::dup(fd_);  // the lock lives on with the duplicate until after the rename
    const int fd = fd_;
    fd_ = -1;  // close() releases the descriptor even when it reports an error
    if (::close(fd) != 0) fail("{}: close failed: {}", out_.string(), std::strerror(errno));
    if (::rename(temp_.c_str(), out_.c_str()) != 0)
      fail("{}: cannot rename the finished file into place: {}", out_.string(),
           std::strerror(errno));
  } catch (...) {
    discard();
    throw;
  }
  temp_.clear();  // it is the destination now
  discard();
  // Make the rename itself durable.
  if (const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomically(const std::filesystem::path& out, std::string_view bytes) {
  AtomicFile f(out);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

}  // namespace barata
