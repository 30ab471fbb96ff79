// The listening socket of barata serve, where cpp-httplib needs help
// (src/server/server.cpp). Internal to barata_server.
#pragma once

#include <string>

namespace barata::net {

// listen() again with SOMAXCONN on the socket listening on `port`.
void raise_backlog(int port);
// "" when host:port can be bound, else why not.
std::string port_in_use(const std::string& host, int port);

}  // namespace barata::net
