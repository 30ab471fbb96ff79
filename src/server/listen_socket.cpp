// barata serve's listening socket (listen_socket.h).
#include "listen_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/core.h>
#include <spdlog/spdlog.h>

namespace barata::net {

// Debian's compiled cpp-httplib (0.11) listens with a backlog of 5: in a
// burst of more new connections the rest wait for their client's SYN retry,
// a second later. listen() again on the bound socket raises it; httplib does
// not hand out the socket, so it is found by its port.
void raise_backlog(int port) {
  for (int fd = 0; fd < 65536; ++fd) {
    int accepting = 0;
    socklen_t len = sizeof accepting;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0) {
      if (errno == EBADF && fd > 1024) break;
      continue;
    }
    if (!accepting) continue;
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) != 0) continue;
    int p = -1;
    if (ss.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    if (p == port) {
      if (::listen(fd, SOMAXCONN) != 0) spdlog::warn("serve: cannot raise the listen backlog");
      return;
    }
  }
}

// httplib's failed bind says nothing of why: a plain bind first names it.
// "" when the port is free, else why not.
std::string port_in_use(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    return fmt::format("cannot resolve the address '{}'", host);
  std::string why;
  const int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd >= 0) {
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0)
      why = errno == EADDRINUSE ? std::string("the port is in use") : std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  return why;
}

}  // namespace barata::net
