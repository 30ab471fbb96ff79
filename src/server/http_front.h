// barata serve's connections: what cpp-httplib (Debian's 0.11) cannot do for
// a server facing hostile clients, done in front of it. Internal to
// barata_server.
//
// One I/O thread owns the listening socket and every connection that is not
// being answered. It reads each request whole (head and body) without
// blocking, under limits that a slow or hostile client cannot stretch: a
// deadline for the whole head that does not restart with each byte, one for
// the body, a cap on the head's and the body's size (chunked bodies included,
// checked while they arrive), one Content-Length that is a plain number, not
// both it and chunked, no NUL or bare control bytes in the head, and a cap on
// open connections (idle keep-alive ones are closed first to make room, then
// a new connection gets 503). Only a complete request goes to a worker
// thread, which hands its bytes to httplib's request parser and router
// (Routes::serve) and writes the response; the connection then goes back to
// the I/O thread to wait for its next request. So no number of slow clients
// holds a worker, and a fast client is answered in its usual time.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace barata::net {

struct FrontOptions {
  size_t max_body_bytes = 1 << 20;
  size_t max_head_bytes = 16 << 10;
  size_t max_target_bytes = 8 << 10;
  double head_timeout_s = 10;   // accept (or a request's first byte) to the head's end
  double body_timeout_s = 30;   // the head's end to the body's end
  double idle_timeout_s = 5;    // keep-alive: between requests
  double write_timeout_s = 30;  // one write that makes no progress
  int max_connections = 1024;
  int workers = 64;
};

// What the bytes read so far on a connection hold.
struct Framing {
  enum State { kNeedMore, kComplete, kReject } state = kNeedMore;
  size_t head_size = 0;                  // 0 until the head is complete
  size_t size = 0;                       // kComplete: this request's bytes (head and body)
  int status = 0;                        // kReject: the HTTP status
  std::string message;                   // kReject: why, printable
  bool expect_continue = false;          // the head asks for "100 Continue" before its body
  size_t expect_at = 0, expect_len = 0;  // the Expect line's bytes (the front answers it)
  bool keep_alive = true;                // HTTP/1.1 without "Connection: close"
  std::string method, target;            // once the request line is read, printable
};

// Frames the first request in `bytes` (a pure function; the fuzzer's entry).
Framing frame_request(std::string_view bytes, const FrontOptions& o);

// A JSON error body of the OpenAI shape for `message` (printable already).
std::string error_json(int status, const std::string& message, const std::string& code);

// httplib's router, reached with a request read by the front.
class Routes : public httplib::Server {
 public:
  // Parses the request in `strm`, routes it and writes the response; false
  // when writing failed. `close` asks for "Connection: close"; `closed` says
  // whether the client asked for it.
  bool serve(httplib::Stream& strm, bool close, bool& closed) {
    return process_request(strm, close, closed, nullptr);
  }
  // httplib ends a chunked response early when its own listening socket is
  // invalid ("shutting down"); the front's socket stands in for it.
  void set_running(int listen_fd) { svr_sock_ = listen_fd; }
};

class Front {
 public:
  // Called from the I/O thread for every request refused before it reached
  // the router (status, method, target, printable; method/target may be "").
  using Refused = std::function<void(int status, const std::string& method,
                                     const std::string& target, const std::string& message)>;

  Front(Routes& routes, FrontOptions o, Refused on_refused);
  ~Front();
  Front(const Front&) = delete;
  Front& operator=(const Front&) = delete;

  // Binds host:port (0: any free port) and returns the port; throws
  // barata::Error naming why it cannot.
  int bind(const std::string& host, int port, int send_buffer);
  // Starts the I/O thread and the workers.
  void start();
  // Closes the listening socket and every connection; waits for the workers
  // to finish the requests they are answering.
  void stop();
  // Open connections (for /metrics).
  int64_t connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace barata::net
