// barata serve's connections (http_front.h). HTTP/1.1 message framing as
// RFC 9112 defines it (sections 2-7): the request line, header fields, and a
// body framed by one Content-Length or by the chunked transfer coding.
#include "http_front.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "barata/error.h"
#include "barata/file_io.h"
#include "openai_request.h"
#include "safe_text.h"

namespace barata::net {

namespace {

using Clock = std::chrono::steady_clock;

bool is_tchar(unsigned char c) {  // RFC 9110 5.6.2
  if (std::isalnum(c)) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A control byte a head may not hold (HTAB is allowed in field values).
bool bad_head_byte(unsigned char c) {
  return (c < 0x20 && c != '\t') || c == 0x7F;
}

Framing reject(Framing f, int status, std::string message) {
  f.state = Framing::kReject;
  f.status = status;
  f.message = std::move(message);
  return f;
}

// The line at b[from..]: its end (the '\n') or npos.
size_t line_end(std::string_view b, size_t from) {
  return b.find('\n', from);
}

std::string_view strip_cr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

// The body after the head at b[at..]: chunked. Sets f.size when complete.
Framing frame_chunked(std::string_view b, size_t at, Framing f, const FrontOptions& o) {
  size_t total = 0;
  for (;;) {
    const size_t nl = line_end(b, at);
    if (nl == std::string_view::npos) {
      if (b.size() - at > 1024) return reject(f, 400, "a chunk-size line is over 1024 bytes");
      return f;
    }
    const std::string_view line = strip_cr(b.substr(at, nl - at));
    size_t digits = 0;
    uint64_t size = 0;
    while (digits < line.size() && std::isxdigit(static_cast<unsigned char>(line[digits]))) {
      if (digits == 15) return reject(f, 413, "a chunk size has more than 15 hex digits");
      const char h = static_cast<char>(std::tolower(static_cast<unsigned char>(line[digits])));
      size = size * 16 + static_cast<uint64_t>(h <= '9' ? h - '0' : h - 'a' + 10);
      ++digits;
    }
    const std::string_view rest = trim(line.substr(digits));
    if (digits == 0 || (!rest.empty() && rest.front() != ';'))
      return reject(
          f, 400, fmt::format("a chunk-size line is not a hex number: '{}'", printable(line, 40)));
    for (unsigned char c : rest)
      if (bad_head_byte(c)) return reject(f, 400, "a chunk extension holds a control byte");
    total += size;
    if (total > o.max_body_bytes)
      return reject(f, 413, fmt::format("the request body exceeds {} bytes", o.max_body_bytes));
    at = nl + 1;
    if (size == 0) {
      // Trailer fields, then an empty line.
      size_t trailer_bytes = 0;
      for (;;) {
        const size_t e = line_end(b, at);
        if (e == std::string_view::npos) {
          if (b.size() - at > 4096) return reject(f, 431, "the trailer is over 4096 bytes");
          return f;
        }
        const std::string_view t = strip_cr(b.substr(at, e - at));
        trailer_bytes += e + 1 - at;
        if (trailer_bytes > 4096) return reject(f, 431, "the trailer is over 4096 bytes");
        for (unsigned char c : t)
          if (bad_head_byte(c)) return reject(f, 400, "a trailer field holds a control byte");
        at = e + 1;
        if (t.empty()) {
          f.state = Framing::kComplete;
          f.size = at;
          return f;
        }
      }
    }
    if (b.size() - at < size + 1) return f;  // the data and at least its '\n'
    at += size;
    if (b[at] == '\n') {
      at += 1;
    } else if (b[at] == '\r') {
      if (b.size() - at < 2) return f;
      if (b[at + 1] != '\n') return reject(f, 400, "a chunk's data is not followed by CRLF");
      at += 2;
    } else {
      return reject(f, 400, "a chunk's data is longer than its size");
    }
  }
}

}  // namespace

Framing frame_request(std::string_view b, const FrontOptions& o) {
  Framing f;
  size_t at = 0;
  bool request_line = true;
  bool http10 = false, chunked = false, have_host = false;
  int n_length = 0, n_fields = 0;
  uint64_t length = 0;
  std::string te;
  for (;;) {
    const size_t nl = line_end(b, at);
    const size_t end = nl == std::string_view::npos ? b.size() : nl;
    const std::string_view line = strip_cr(b.substr(at, end - at));
    // Control bytes are refused as soon as they arrive, before the line ends.
    for (size_t i = 0; i < line.size(); ++i) {
      const auto c = static_cast<unsigned char>(line[i]);
      if (bad_head_byte(c) || (request_line && c == '\t'))
        return reject(f, 400,
                      fmt::format("the request head holds the control byte 0x{:02X} at offset {}",
                                  c, at + i));
      if (c == '\r' && i + 1 < line.size())
        return reject(f, 400, "the request head holds a CR that does not end a line");
    }
    if (request_line && line.size() > o.max_target_bytes + 32)
      return reject(f, 414, fmt::format("the request line is over {} bytes", o.max_target_bytes));
    if (end > o.max_head_bytes)
      return reject(f, 431, fmt::format("the request head is over {} bytes", o.max_head_bytes));
    if (nl == std::string_view::npos) return f;  // the line is not complete yet
    const size_t line_start = at;
    at = nl + 1;
    if (request_line) {
      // method SP request-target SP HTTP-version
      const size_t s1 = line.find(' ');
      const size_t s2 = s1 == std::string_view::npos ? s1 : line.find(' ', s1 + 1);
      if (s2 == std::string_view::npos || line.find(' ', s2 + 1) != std::string_view::npos)
        return reject(f, 400,
                      fmt::format("the request line '{}' is not 'METHOD TARGET VERSION'",
                                  printable(line, 80)));
      const std::string_view method = line.substr(0, s1);
      const std::string_view target = line.substr(s1 + 1, s2 - s1 - 1);
      const std::string_view version = line.substr(s2 + 1);
      f.method = printable(method, 32);
      f.target = printable(target, 200);
      if (method.empty() || method.size() > 32 ||
          !std::all_of(method.begin(), method.end(),
                       [](char c) { return is_tchar(static_cast<unsigned char>(c)); }))
        return reject(f, 400, fmt::format("the method '{}' is not an HTTP token", f.method));
      static constexpr std::string_view kMethods[] = {
          "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT"};
      if (std::find(std::begin(kMethods), std::end(kMethods), method) == std::end(kMethods))
        return reject(f, 501, fmt::format("the method '{}' is not supported", f.method));
      if (target.empty()) return reject(f, 400, "the request target is empty");
      if (target.size() > o.max_target_bytes)
        return reject(f, 414,
                      fmt::format("the request target is over {} bytes", o.max_target_bytes));
      for (unsigned char c : target)
        if (c <= 0x20 || c >= 0x7F)
          return reject(f, 400,
                        fmt::format("the request target '{}' holds a byte that is not "
                                    "printable ASCII (0x{:02X})",
                                    f.target, c));
      if (target.front() != '/' && target != "*")
        return reject(f, 400,
                      fmt::format("the request target '{}' does not start with '/'", f.target));
      if (version == "HTTP/1.0") {
        http10 = true;
        f.keep_alive = false;
      } else if (version != "HTTP/1.1") {
        return reject(f, version.substr(0, 5) == "HTTP/" ? 505 : 400,
                      fmt::format("the HTTP version '{}' is not HTTP/1.1 or HTTP/1.0",
                                  printable(version, 20)));
      }
      request_line = false;
      continue;
    }
    if (line.empty()) break;  // the head's end
    if (line.front() == ' ' || line.front() == '\t')
      return reject(f, 400, "a header line starts with whitespace (obsolete line folding)");
    const size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    if (colon == std::string_view::npos || name.empty() ||
        !std::all_of(name.begin(), name.end(),
                     [](char c) { return is_tchar(static_cast<unsigned char>(c)); }))
      return reject(f, 400,
                    fmt::format("the header line '{}' is not 'Name: value'", printable(line, 60)));
    if (++n_fields > 100) return reject(f, 431, "the request has over 100 header fields");
    const std::string_view value = trim(line.substr(colon + 1));
    if (iequals(name, "Content-Length")) {
      if (++n_length > 1) return reject(f, 400, "the request has more than one Content-Length");
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return reject(f, 400,
                      fmt::format("Content-Length '{}' is not a non-negative number of "
                                  "at most 18 digits",
                                  printable(value, 40)));
      length = std::stoull(std::string(value));
    } else if (iequals(name, "Transfer-Encoding")) {
      if (!te.empty()) return reject(f, 400, "the request has more than one Transfer-Encoding");
      te = std::string(value);
      if (te.empty()) te = " ";
    } else if (iequals(name, "Host")) {
      if (have_host) return reject(f, 400, "the request has more than one Host header");
      have_host = true;
    } else if (iequals(name, "Connection")) {
      // A comma-separated list of options.
      std::string_view rest = value;
      while (!rest.empty()) {
        const size_t comma = rest.find(',');
        const std::string_view opt = trim(rest.substr(0, comma));
        if (iequals(opt, "close")) f.keep_alive = false;
        if (iequals(opt, "keep-alive") && http10) f.keep_alive = true;
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      }
    } else if (iequals(name, "Expect")) {
      if (!iequals(value, "100-continue"))
        return reject(
            f, 417,
            fmt::format("Expect '{}' is not supported (only 100-continue)", printable(value, 40)));
      f.expect_continue = !http10;
      f.expect_at = line_start;
      f.expect_len = at - line_start;
    }
  }
  f.head_size = at;
  if (!http10 && !have_host) return reject(f, 400, "an HTTP/1.1 request without a Host header");
  if (!te.empty()) {
    if (n_length > 0)
      return reject(f, 400, "the request has both Content-Length and Transfer-Encoding");
    if (http10) return reject(f, 400, "Transfer-Encoding in an HTTP/1.0 request");
    if (!iequals(te, "chunked"))
      return reject(
          f, 501,
          fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", printable(te, 40)));
    chunked = true;
  }
  if (length > o.max_body_bytes)
    return reject(f, 413, fmt::format("the request body exceeds {} bytes", o.max_body_bytes));
  if (chunked) {
    f = frame_chunked(b, at, std::move(f), o);
    if (f.state == Framing::kComplete) f.expect_continue = false;
    return f;
  }
  if (b.size() - at >= length) {
    f.state = Framing::kComplete;
    f.size = at + static_cast<size_t>(length);
    f.expect_continue = false;
  }
  return f;
}

std::string error_json(int status, const std::string& message, const std::string& code) {
  const char* type = status == 429   ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  return openai::error_body({status, message, type, "", code})
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

const char* reason(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 414:
      return "URI Too Long";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

std::string response_bytes(int status, const std::string& body, bool close) {
  return fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{}", status,
      reason(status), body.size(), close ? "Connection: close\r\n" : "", body);
}

// A connection the front owns between requests.
struct Conn {
  int fd = -1;
  std::string buf;  // bytes read and not yet answered
  std::string peer_ip, local_ip;
  int peer_port = 0, local_port = 0;
  enum State { kHead, kBody, kIdle, kBusy } state = kHead;
  Clock::time_point since;  // the head's start, the body's start, or idle since
  bool sent_continue = false;
  std::list<Conn*>::iterator idle_pos;  // in Impl::idle while kIdle
};

void set_nonblocking(int fd) {
  const int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

// Writes all of `data` to a non-blocking socket, waiting up to `timeout_s`
// for each step of progress. False when the peer is gone or too slow.
bool write_all(int fd, const char* data, size_t n, double timeout_s) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, static_cast<int>(timeout_s * 1000));
      if (r <= 0 || (p.revents & (POLLERR | POLLHUP))) return false;
      continue;
    }
    return false;
  }
  return true;
}

// One request's bytes for httplib to read; writes go to the socket.
class ConnStream : public httplib::Stream {
 public:
  ConnStream(const Conn& c, std::string_view request, double write_timeout_s)
      : c_(c), data_(request), write_timeout_s_(write_timeout_s) {}
  bool is_readable() const override { return pos_ < data_.size(); }
  bool is_writable() const override {
    if (failed_) return false;
    pollfd p{c_.fd, POLLOUT | POLLRDHUP, 0};
    const int r = ::poll(&p, 1, static_cast<int>(write_timeout_s_ * 1000));
    return r > 0 && (p.revents & POLLOUT) && !(p.revents & (POLLERR | POLLHUP | POLLRDHUP));
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, data_.size() - pos_);
    std::memcpy(ptr, data_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (failed_ || !write_all(c_.fd, ptr, size, write_timeout_s_)) {
      failed_ = true;
      return -1;
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.peer_ip;
    port = c_.peer_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.local_ip;
    port = c_.local_port;
  }
  socket_t socket() const override { return c_.fd; }
  bool failed() const { return failed_; }

 private:
  const Conn& c_;
  std::string_view data_;
  size_t pos_ = 0;
  double write_timeout_s_;
  bool failed_ = false;
};

void ip_and_port(const sockaddr_storage& ss, std::string& ip, int& port) {
  char host[NI_MAXHOST] = "", serv[NI_MAXSERV] = "";
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), sizeof ss, host, sizeof host, serv,
                  sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

}  // namespace

struct Front::Impl {
  Routes& routes;
  FrontOptions o;
  Refused on_refused;
  int listen_fd = -1, epoll_fd = -1, wake_fd = -1;
  std::thread io;
  std::vector<std::thread> workers;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> n_conns{0};

  // I/O thread only.
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  std::list<Conn*> idle;  // kIdle connections, oldest first

  // Between the threads.
  std::mutex m;
  std::condition_variable cv;
  struct Task {
    std::unique_ptr<Conn> c;
    Framing f;       // the request at the front of c->buf (f.size bytes)
    int status = 0;  // a refusal to write instead (then the connection closes)
    std::string body;
  };
  std::deque<Task> tasks;                       // for the workers
  std::vector<std::unique_ptr<Conn>> returned;  // back to the I/O thread
  bool workers_stop = false;

  Impl(Routes& r, FrontOptions opts, Refused cb)
      : routes(r), o(std::move(opts)), on_refused(std::move(cb)) {}

  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wake_fd, &one, sizeof one);
  }

  void watch(Conn& c) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = c.fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c.fd, &ev);
  }

  void close_conn(int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    Conn& c = *it->second;
    if (c.state == Conn::kIdle) idle.erase(c.idle_pos);
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    conns.erase(it);
    --n_conns;
  }

  // Hands a connection to a worker: a request to answer, or a refusal to
  // write before it closes.
  void hand_over(int fd, Framing f, int status, std::string body) {
    auto it = conns.find(fd);
    Conn& c = *it->second;
    if (c.state == Conn::kIdle) idle.erase(c.idle_pos);
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    c.state = Conn::kBusy;
    std::unique_ptr<Conn> owned = std::move(it->second);
    conns.erase(it);
    {
      std::lock_guard<std::mutex> l(m);
      tasks.push_back({std::move(owned), std::move(f), status, std::move(body)});
    }
    cv.notify_one();
  }

  void refuse(int fd, int status, const std::string& method, const std::string& target,
              const std::string& message) {
    if (on_refused) on_refused(status, method, target, message);
    hand_over(fd, Framing{}, status, error_json(status, message, ""));
  }

  // Frames what a connection has read: hands a complete request over,
  // refuses a bad one, or waits for more.
  void advance(int fd) {
    Conn& c = *conns.at(fd);
    if (c.buf.empty()) return;
    // RFC 9112 2.2: empty lines before a request line are ignored.
    size_t lead = 0;
    while (lead < c.buf.size() && lead < 8 && (c.buf[lead] == '\r' || c.buf[lead] == '\n')) ++lead;
    if (lead > 0) c.buf.erase(0, lead);
    if (c.buf.empty()) return;
    if (c.state == Conn::kIdle) {
      idle.erase(c.idle_pos);
      c.state = Conn::kHead;
      c.since = Clock::now();
    }
    const Framing f = frame_request(c.buf, o);
    if (f.state == Framing::kReject) {
      refuse(fd, f.status, f.method, f.target, f.message);
      return;
    }
    if (f.state == Framing::kComplete) {
      hand_over(fd, f, 0, "");
      return;
    }
    if (f.head_size > 0 && c.state == Conn::kHead) {
      c.state = Conn::kBody;
      c.since = Clock::now();
    }
    if (f.expect_continue && !c.sent_continue) {
      c.sent_continue = true;
      const std::string cont = "HTTP/1.1 100 Continue\r\n\r\n";
      [[maybe_unused]] ssize_t w = ::send(fd, cont.data(), cont.size(), MSG_NOSIGNAL);
    }
  }

  void on_readable(int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    Conn& c = *it->second;
    char chunk[65536];
    for (;;) {
      const ssize_t r = ::recv(fd, chunk, sizeof chunk, 0);
      if (r > 0) {
        c.buf.append(chunk, static_cast<size_t>(r));
        // Far more than any request may hold: stop reading and let the
        // framing refuse it.
        if (c.buf.size() > o.max_head_bytes + o.max_body_bytes + (64 << 10)) break;
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // The peer closed (or failed): a partial request is dropped.
      close_conn(fd);
      return;
    }
    advance(fd);
  }

  void on_accept() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t sl = sizeof ss;
      const int fd =
          ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE)
          spdlog::warn("serve: out of file descriptors; {} connections open", n_conns.load());
        return;
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (n_conns >= o.max_connections && !idle.empty()) close_conn(idle.front()->fd);
      if (n_conns >= o.max_connections) {
        const std::string msg = fmt::format(
            "the server holds {} connections, its limit (--max-connections); retry later",
            o.max_connections);
        if (on_refused) on_refused(503, "", "", msg);
        const std::string bytes =
            response_bytes(503, error_json(503, msg, "too_many_connections"), true);
        [[maybe_unused]] ssize_t w = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        ::shutdown(fd, SHUT_WR);
        ::close(fd);
        continue;
      }
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->since = Clock::now();
      c->state = Conn::kHead;
      ip_and_port(ss, c->peer_ip, c->peer_port);
      sockaddr_storage ls{};
      socklen_t ll = sizeof ls;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&ls), &ll) == 0)
        ip_and_port(ls, c->local_ip, c->local_port);
      watch(*c);
      conns.emplace(fd, std::move(c));
      ++n_conns;
    }
  }

  void take_returned() {
    std::vector<std::unique_ptr<Conn>> back;
    {
      std::lock_guard<std::mutex> l(m);
      back.swap(returned);
    }
    for (auto& c : back) {
      const int fd = c->fd;
      c->state = Conn::kIdle;
      c->since = Clock::now();
      c->sent_continue = false;
      Conn& ref = *c;
      conns.emplace(fd, std::move(c));
      ref.idle_pos = idle.insert(idle.end(), &ref);
      watch(ref);
      advance(fd);  // a pipelined request may be here already
    }
  }

  void sweep() {
    const auto now = Clock::now();
    std::vector<std::pair<int, int>> expired;  // fd, status (0: close quietly)
    for (auto& [fd, c] : conns) {
      const double s = std::chrono::duration<double>(now - c->since).count();
      if (c->state == Conn::kIdle && s > o.idle_timeout_s) expired.push_back({fd, 0});
      if (c->state == Conn::kHead && s > o.head_timeout_s)
        expired.push_back({fd, c->buf.empty() ? 0 : 408});
      if (c->state == Conn::kBody && s > o.body_timeout_s) expired.push_back({fd, 408});
    }
    for (auto [fd, status] : expired) {
      if (status == 0) {
        close_conn(fd);
        continue;
      }
      const Conn& c = *conns.at(fd);
      const Framing f = frame_request(c.buf, o);
      refuse(fd, 408, f.method, f.target,
             c.state == Conn::kHead
                 ? fmt::format("the request head did not arrive within {} s", o.head_timeout_s)
                 : fmt::format("the request body did not arrive within {} s", o.body_timeout_s));
    }
  }

  void io_loop() {
    epoll_event evs[256];
    auto last_sweep = Clock::now();
    while (!stopping) {
      const int n = epoll_wait(epoll_fd, evs, 256, 100);
      for (int i = 0; i < n; ++i) {
        const int fd = evs[i].data.fd;
        if (fd == listen_fd) {
          on_accept();
        } else if (fd == wake_fd) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(wake_fd, &v, sizeof v);
        } else {
          on_readable(fd);
        }
      }
      take_returned();
      if (Clock::now() - last_sweep > std::chrono::milliseconds(100)) {
        sweep();
        last_sweep = Clock::now();
      }
    }
    std::vector<int> fds;
    for (auto& [fd, c] : conns) fds.push_back(fd);
    for (int fd : fds) close_conn(fd);
  }

  void answer(Task& t) {
    Conn& c = *t.c;
    bool keep = false;
    if (t.status != 0) {
      // A refusal: written, then the rest of what the client sends is read
      // and dropped for a moment, so that its close is not a reset that
      // loses the answer.
      const std::string bytes = response_bytes(t.status, t.body, true);
      if (write_all(c.fd, bytes.data(), bytes.size(), 5)) {
        ::shutdown(c.fd, SHUT_WR);
        char sink[16384];
        size_t drained = 0;
        const auto t0 = Clock::now();
        while (drained < (4u << 20) && Clock::now() - t0 < std::chrono::seconds(1)) {
          pollfd p{c.fd, POLLIN, 0};
          if (::poll(&p, 1, 200) <= 0) break;
          const ssize_t r = ::recv(c.fd, sink, sizeof sink, 0);
          if (r <= 0) break;
          drained += static_cast<size_t>(r);
        }
      }
    } else {
      // Framed once, by the I/O thread (advance).
      const Framing& f = t.f;
      std::string request = c.buf.substr(0, f.size);
      c.buf.erase(0, f.size);
      // The front answered "Expect: 100-continue" itself; httplib would again.
      if (f.expect_len > 0) request.erase(f.expect_at, f.expect_len);
      ConnStream s(c, request, o.write_timeout_s);
      bool closed = false;
      bool ok = false;
      const bool close = stopping.load();
      try {
        ok = routes.serve(s, close, closed);
      } catch (const std::exception& e) {
        // The router's handlers catch their own errors; this is a last resort.
        spdlog::error("serve: an uncaught error answering a request: {}", printable(e.what()));
        const std::string bytes = response_bytes(500, error_json(500, "internal error", ""), true);
        write_all(c.fd, bytes.data(), bytes.size(), 5);
      }
      // The framing's view of keep-alive agrees with httplib's for the
      // requests it lets through; both are asked.
      keep = ok && !closed && !close && !s.failed() && f.keep_alive;
    }
    if (!keep) {
      ::close(c.fd);
      --n_conns;
      return;
    }
    {
      std::lock_guard<std::mutex> l(m);
      returned.push_back(std::move(t.c));
    }
    wake();
  }

  void worker_loop() {
    for (;;) {
      Task t;
      {
        std::unique_lock<std::mutex> l(m);
        cv.wait(l, [&] { return workers_stop || !tasks.empty(); });
        if (tasks.empty()) return;
        t = std::move(tasks.front());
        tasks.pop_front();
      }
      answer(t);
    }
  }
};

Front::Front(Routes& routes, FrontOptions o, Refused on_refused)
    : impl_(std::make_unique<Impl>(routes, std::move(o), std::move(on_refused))) {}

Front::~Front() {
  stop();
}

int Front::bind(const std::string& host, int port, int send_buffer) {
  Impl& m = *impl_;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    fail("serve: cannot listen on {}:{}: cannot resolve the address '{}'", host, port, host);
  std::string why;
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    // SO_REUSEADDR (restart over TIME_WAIT), not SO_REUSEPORT: a second
    // server must not share the port.
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (send_buffer > 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof send_buffer);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      why = errno == EADDRINUSE ? std::string("the port is in use") : std::strerror(errno);
      ::close(fd);
      continue;
    }
    m.listen_fd = fd;
    break;
  }
  freeaddrinfo(res);
  if (m.listen_fd < 0) fail("serve: cannot listen on {}:{}: {}", host, port, why);
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getsockname(m.listen_fd, reinterpret_cast<sockaddr*>(&ss), &sl);
  std::string ip;
  int bound = port;
  ip_and_port(ss, ip, bound);
  return bound;
}

void Front::start() {
  Impl& m = *impl_;
  if (m.listen_fd < 0) fail("internal: Front::start before bind");
  m.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  m.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m.epoll_fd < 0 || m.wake_fd < 0) fail("serve: epoll/eventfd: {}", std::strerror(errno));
  for (int fd : {m.listen_fd, m.wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }
  m.routes.set_running(m.listen_fd);
  for (int i = 0; i < std::max(1, m.o.workers); ++i)
    m.workers.emplace_back([&m] { m.worker_loop(); });
  m.io = std::thread([&m] { m.io_loop(); });
}

void Front::stop() {
  Impl& m = *impl_;
  m.stopping = true;
  m.routes.set_running(-1);  // streams still being written end
  if (m.io.joinable()) {
    m.wake();
    m.io.join();
  }
  {
    std::lock_guard<std::mutex> l(m.m);
    m.workers_stop = true;
  }
  m.cv.notify_all();
  for (std::thread& t : m.workers)
    if (t.joinable()) t.join();
  m.workers.clear();
  for (auto& c : m.returned) ::close(c->fd);
  m.returned.clear();
  for (int* fd : {&m.listen_fd, &m.epoll_fd, &m.wake_fd})
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
}

int64_t Front::connections() const {
  return impl_->n_conns.load();
}

}  // namespace barata::net
