#include "echelon/net/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>

namespace echelon::net {

std::string HostOf(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return host_port;
  const size_t bracket = host_port.rfind(']');
  if (bracket != std::string::npos && bracket > colon) return host_port;  // "[::1]": no port
  return host_port.substr(0, colon);
}

std::string PeerHost(const std::string& peer) {
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (peer.rfind(scheme, 0) == 0) return HostOf(peer.substr(5));
  }
  return peer;  // unix sockets and others: the whole string
}

namespace {

// 16 bytes of an IP literal (an IPv4 address as its IPv4-mapped IPv6 form), or nothing.
std::optional<std::array<unsigned char, 16>> IpBytes(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::array<unsigned char, 16> out{};
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    out[10] = out[11] = 0xff;
    std::memcpy(out.data() + 12, &v4, 4);
    return out;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    std::memcpy(out.data(), &v6, 16);
    return out;
  }
  return std::nullopt;
}

}  // namespace

bool SameIp(const std::string& a, const std::string& b) {
  const auto x = IpBytes(a), y = IpBytes(b);
  return x && y && *x == *y;
}

bool IsIpLiteral(const std::string& host) { return IpBytes(host).has_value(); }

bool AdvertisesOwnHost(const std::string& grpc_peer, const std::string& advertised, const std::vector<std::string>& also) {
  const std::string host = HostOf(advertised);
  if (SameIp(host, PeerHost(grpc_peer))) return true;
  return std::any_of(also.begin(), also.end(), [&](const std::string& h) { return SameIp(host, h); });
}

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::";
}

namespace {

// getaddrinfo for HOST:PORT (brackets around an IPv6 host removed; no port: `default_port`).
int Resolve(const std::string& host_port, int socktype, const char* default_port, addrinfo** found,
            std::string* host_out) {
  std::string host = HostOf(host_port);
  const std::string port = host_port.size() > host.size() + 1 ? host_port.substr(host.size() + 1) : default_port;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = socktype;
  *host_out = host;
  return ::getaddrinfo(host.c_str(), port.c_str(), &hints, found);
}

}  // namespace

bool TcpReachable(const std::string& host_port, double timeout_s) {
  std::string host;
  addrinfo* found = nullptr;
  if (Resolve(host_port, SOCK_STREAM, "", &found, &host) != 0) return false;
  bool reached = false;
  for (addrinfo* a = found; a != nullptr && !reached; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      reached = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      reached = ::poll(&p, 1, static_cast<int>(timeout_s * 1000)) == 1 &&
                ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return reached;
}

Result<std::string> LocalAddressToward(const std::string& host_port) {
  std::string host;
  addrinfo* found = nullptr;
  if (int rc = Resolve(host_port, SOCK_DGRAM, "9", &found, &host); rc != 0)
    return Status(StatusCode::kUnavailable, "cannot resolve " + host + ": " + ::gai_strerror(rc));
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      if (local.ss_family == AF_INET) {
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&local)->sin_addr, buf, sizeof buf);
        out = buf;
      } else if (local.ss_family == AF_INET6) {
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr, buf, sizeof buf);
        out = std::string("[") + buf + "]";
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (out.empty()) return Status(StatusCode::kUnavailable, "no local address reaches " + host_port);
  return out;
}

}  // namespace echelon::net
