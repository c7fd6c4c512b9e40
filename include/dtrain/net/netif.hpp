#pragma once
// Network interfaces: which local address to listen on and advertise, and names for the logs.

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain::detail::netif {

struct interface_address {
  std::string name;
  std::string address;  // IPv4, dotted
};

inline std::vector<interface_address> list() {
  std::vector<interface_address> out;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    out.push_back({i->ifa_name, text});
  }
  freeifaddrs(all);
  return out;
}

/// The IPv4 address of interface `name`. @throws dtrain::error listing the interfaces there are
inline std::string address_of(const std::string& name) {
  std::string names;
  for (const auto& i : list()) {
    if (i.name == name) return i.address;
    names += (names.empty() ? "" : ", ") + i.name + " (" + i.address + ")";
  }
  throw error(errc::invalid_argument, "dtrain: DTRAIN_IFNAME=" + name +
                                          " is not an IPv4 interface of this host; it has " + names);
}

/// The interface that holds `address`, or "?" when none does (a NAT or a hostname alias).
inline std::string name_of(const std::string& address) {
  for (const auto& i : list()) {
    if (i.address == address) return i.name;
  }
  return "?";
}

/// The local address the kernel would use to reach `host` (resolved), found by connecting a UDP
/// socket, which sends nothing. Empty when `host` cannot be resolved or reached.
inline std::string source_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return {};
  std::string out;
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
      out = text;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

}  // namespace dtrain::detail::netif
