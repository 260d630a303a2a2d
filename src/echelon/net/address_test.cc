#include "echelon/net/address.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

namespace echelon::net {
namespace {

TEST(AddressTest, HostOfAndWildcards) {
  EXPECT_EQ(HostOf("10.0.0.2:7700"), "10.0.0.2");
  EXPECT_EQ(HostOf("[::1]:7700"), "[::1]");
  EXPECT_EQ(PeerHost("ipv4:10.0.0.2:51234"), "10.0.0.2");
  EXPECT_EQ(PeerHost("ipv6:[::1]:51234"), "[::1]");
  EXPECT_EQ(PeerHost("unix:/tmp/s"), "unix:/tmp/s");
  EXPECT_EQ(HostOf("[::1]"), "[::1]");
  EXPECT_EQ(HostOf("host"), "host");
  EXPECT_TRUE(IsWildcardHost("0.0.0.0"));
  EXPECT_TRUE(IsWildcardHost(""));
  EXPECT_FALSE(IsWildcardHost("127.0.0.1"));
}

TEST(AddressTest, SameIpComparesAddressesNotSpellings) {
  EXPECT_TRUE(SameIp("10.0.0.2", "10.0.0.2"));
  EXPECT_TRUE(SameIp("[::ffff:10.0.0.2]", "10.0.0.2"));  // a dual-stack socket's IPv4 caller
  EXPECT_TRUE(SameIp("[::1]", "0:0:0:0:0:0:0:1"));
  EXPECT_FALSE(SameIp("10.0.0.2", "10.0.0.3"));
  EXPECT_FALSE(SameIp("[::1]", "127.0.0.1"));
  EXPECT_FALSE(SameIp("localhost", "localhost"));  // names are never resolved
  EXPECT_FALSE(SameIp("", ""));
}

// A listening socket is reachable; the same port once closed is not, and the answer comes at
// once (connection refused), not after the timeout.
TEST(AddressTest, TcpReachableTellsAListeningPortFromAClosedOne) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  EXPECT_TRUE(TcpReachable(address, 2.0));
  ::close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(TcpReachable(address, 5.0));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_FALSE(TcpReachable("127.0.0.1", 1.0));  // no port
}

}  // namespace
}  // namespace echelon::net
