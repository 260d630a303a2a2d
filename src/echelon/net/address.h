// HOST:PORT helpers shared by the learner service and the broadcast.
//
//   HostOf("10.0.0.2:7700") == "10.0.0.2";   HostOf("[::1]:7700") == "[::1]"
//   ECHELON_ASSIGN_OR_RETURN(std::string ip, LocalAddressToward("learner.example.org:7700"));
#pragma once

#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::net {

// The host part of HOST:PORT (the whole string when there is no port).
std::string HostOf(const std::string& host_port);
// The host of a gRPC peer string: PeerHost("ipv4:10.0.0.2:51234") == "10.0.0.2",
// PeerHost("ipv6:[::1]:51234") == "[::1]".
std::string PeerHost(const std::string& peer);
// True when two hosts are the same IP address: brackets dropped, IPv6 text compared as
// addresses, and an IPv4-mapped IPv6 address (::ffff:10.0.0.2, how a dual-stack socket sees an
// IPv4 caller) equal to its IPv4 address. Names are never resolved: a host that is not an IP
// literal equals nothing.
bool SameIp(const std::string& a, const std::string& b);
// True for an IPv4 or IPv6 literal (brackets allowed), false for a name.
bool IsIpLiteral(const std::string& host);
// True when `advertised` (HOST:PORT, what a broadcast peer says others should dial) names the
// host the peer calls from (`grpc_peer`, ServerContext::peer()) or one of `also`: the rule that
// keeps a Hello from pointing the origin and other peers at a host of its choosing.
bool AdvertisesOwnHost(const std::string& grpc_peer, const std::string& advertised, const std::vector<std::string>& also);
// True for 0.0.0.0, [::], :: and an empty host: addresses that bind every interface.
bool IsWildcardHost(const std::string& host);
// The local IP address this machine uses to reach `host_port` (a UDP socket is connected,
// nothing is sent): what a peer on the same network should dial to reach us.
Result<std::string> LocalAddressToward(const std::string& host_port);
// True when a TCP connection to `host_port` is accepted within `timeout_s` (it is closed at
// once): the broadcast origin's check that a peer's advertised address can be dialled.
bool TcpReachable(const std::string& host_port, double timeout_s);

}  // namespace echelon::net
