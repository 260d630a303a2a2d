#include "echelon/net/uplink_pacer.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "echelon/net/broadcast_protocol.h"

namespace echelon::net {
namespace {

// A FIFO uplink as a home router has: `capacity` bytes/s, a queue of up to `queue_seconds`
// (what overflows is dropped), a base RTT, and the sender's TCP offering twice the capacity
// whenever the pacer lets it (a bulk upload always has more to send).
struct FifoUplink {
  double capacity = 12.5e6;
  double queue_seconds = 0.5;
  double queue_bytes = 0;
  double foreign_delay = 0;  // delay on the ACK path that is not this uplink's queue
  std::mt19937 rng{7};

  // One tick of dt seconds at `pace` (0: unpaced); the sample the pacer's sampler would read.
  UplinkSample Tick(double dt, double pace) {
    const double offered = 2 * capacity;
    const double input = pace > 0 ? std::min(pace, offered) : offered;
    const double sent = std::min(capacity * dt, queue_bytes + input * dt);
    queue_bytes = std::min(queue_bytes + input * dt - sent, capacity * queue_seconds);
    UplinkSample s;
    s.dt = dt;
    s.acked_bytes = static_cast<uint64_t>(sent);
    const double jitter = std::uniform_real_distribution<double>(0, 0.003)(rng);  // RTT samples jitter
    s.queue_delay_s = queue_bytes / capacity + foreign_delay + jitter;
    s.rtt_s = 0.04 + *s.queue_delay_s;
    s.held_back = pace > 0 && pace < offered;
    return s;
  }
};

struct LinkRun {
  double mean_pace = 0;      // over the window, bytes/s
  double mean_acked = 0;     // bytes/s
  double median_delay = 0;   // seconds
  double last_pace = 0;
};

// Runs the controller on the link from `from` to `to` seconds (the link runs from 0) and
// returns figures over that window.
LinkRun Drive(UplinkController* c, FifoUplink* link, double* now, double to, double from) {
  constexpr double kDt = UplinkRule::kSampleSeconds;
  LinkRun r;
  std::vector<double> delays;
  double paces = 0;
  double acked = 0;
  int n = 0;
  for (; *now < to; *now += kDt) {
    const UplinkSample s = link->Tick(kDt, c->pace_bps());
    c->Step(s);
    if (*now < from) continue;
    delays.push_back(*s.queue_delay_s);
    paces += c->pace_bps();
    acked += static_cast<double>(s.acked_bytes) / kDt;
    ++n;
  }
  std::sort(delays.begin(), delays.end());
  r.mean_pace = paces / n;
  r.mean_acked = acked / n;
  r.median_delay = delays[delays.size() / 2];
  r.last_pace = c->pace_bps();
  return r;
}

TEST(UplinkControllerTest, FindsAFifoUplinksRateAndKeepsItsQueueUnderTheTarget) {
  for (double queue_seconds : {0.05, 0.5}) {
    SCOPED_TRACE(queue_seconds);
    FifoUplink link;
    link.queue_seconds = queue_seconds;
    UplinkController c;
    double now = 0;
    EXPECT_EQ(c.pace_bps(), 0);  // unpaced until the uplink is seen full
    const LinkRun settled = Drive(&c, &link, &now, 20, 5);
    EXPECT_NEAR(c.capacity_bps(), link.capacity, 0.1 * link.capacity);
    EXPECT_GE(settled.mean_acked, 0.9 * link.capacity);  // the uplink stays busy
    EXPECT_LE(settled.mean_pace, 1.02 * link.capacity);
    EXPECT_LE(settled.median_delay, UplinkRule::kTargetDelaySeconds);

    // The household starts uploading: 40% of the uplink is gone. The pace follows within 2 s.
    link.capacity *= 0.6;
    Drive(&c, &link, &now, 22, 20);
    const LinkRun shared = Drive(&c, &link, &now, 30, 22);
    EXPECT_LE(shared.mean_pace, 0.65 * 12.5e6);
    EXPECT_GE(shared.mean_acked, 0.9 * link.capacity);
    EXPECT_LE(shared.median_delay, UplinkRule::kTargetDelaySeconds);

    // ... and stops: the pace probes back up to the whole uplink within 3 s.
    link.capacity = 12.5e6;
    Drive(&c, &link, &now, 33, 30);
    const LinkRun freed = Drive(&c, &link, &now, 40, 33);
    EXPECT_GE(freed.mean_acked, 0.88 * link.capacity);
    EXPECT_LE(freed.median_delay, UplinkRule::kTargetDelaySeconds);
  }
}

// A delay that is not this node's queue (its receivers' queues on the ACK path) cuts the pace
// no lower than kFloorShare of what the uplink was seen to carry.
TEST(UplinkControllerTest, ADelayOnTheAckPathCannotThrottleItToNothing) {
  FifoUplink link;
  UplinkController c;
  double now = 0;
  Drive(&c, &link, &now, 10, 5);
  link.foreign_delay = 0.08;
  const LinkRun throttled = Drive(&c, &link, &now, 30, 15);
  EXPECT_GE(throttled.mean_pace, UplinkRule::kFloorShare * 12.5e6 * 0.9);
  EXPECT_LE(throttled.mean_pace, 12.5e6);
}

TEST(UplinkControllerTest, ADeclaredRateIsPacedAtItsFractionAndNeverEstimated) {
  UplinkController c(10e6);
  EXPECT_TRUE(c.declared());
  EXPECT_DOUBLE_EQ(c.pace_bps(), kUploadPaceFraction * 10e6);
  FifoUplink link;
  link.capacity = 5e6;  // wrong, and it still wins
  double now = 0;
  Drive(&c, &link, &now, 5, 0);
  EXPECT_DOUBLE_EQ(c.pace_bps(), kUploadPaceFraction * 10e6);
}

// An idle uplink (nothing in flight) or one the pacer never held back teaches nothing.
TEST(UplinkControllerTest, NothingInFlightOrNothingHeldBackLeavesThePace) {
  UplinkController c;
  UplinkSample idle;
  idle.dt = 0.05;
  for (int i = 0; i < 100; ++i) c.Step(idle);
  EXPECT_EQ(c.pace_bps(), 0);
  FifoUplink link;
  double now = 0;
  Drive(&c, &link, &now, 5, 0);
  const double pace = c.pace_bps();
  ASSERT_GT(pace, 0);
  UplinkSample app_limited;
  app_limited.dt = 0.05;
  app_limited.acked_bytes = 1000;
  app_limited.queue_delay_s = 0.0;
  for (int i = 0; i < 100; ++i) c.Step(app_limited);
  EXPECT_DOUBLE_EQ(c.pace_bps(), pace);
}

TEST(DelayHistogramTest, QuantilesAreWithinHalfABin) {
  DelayHistogram h;
  EXPECT_FALSE(h.Quantile(0.5).has_value());
  for (int i = 1; i <= 100; ++i) h.Add(i * 0.001);  // 1..100 ms
  EXPECT_NEAR(*h.Quantile(0.5), 0.050, 0.0005);
  EXPECT_NEAR(*h.Quantile(0.99), 0.099, 0.0005);
  h.Add(30.0);  // beyond the last bin: counted there
  EXPECT_EQ(h.count(), 101u);
  EXPECT_GE(*h.Quantile(1.0), 1.99);
}

TEST(UplinkSummaryJsonTest, UnknownFiguresAreNull) {
  UplinkSummary s;
  EXPECT_EQ(UplinkSummaryJson(s),
            "{\"declared_mbps\":null,\"estimated_mbps\":null,\"pace_mbps\":null,"
            "\"queue_delay_ms\":{\"p50\":null,\"p99\":null},\"delay_samples\":0}");
  s.estimated_bps = 12.5e6;
  s.pace_bps = 11e6;
  s.queue_delay_p50_s = 0.0042;
  s.queue_delay_p99_s = 0.0311;
  s.delay_samples = 9;
  EXPECT_EQ(UplinkSummaryJson(s),
            "{\"declared_mbps\":null,\"estimated_mbps\":100.00,\"pace_mbps\":88.00,"
            "\"queue_delay_ms\":{\"p50\":4.2,\"p99\":31.1},\"delay_samples\":9}");
}

// The sampler reads the sockets a server accepted on its port, from the kernel: the bytes the
// peer acknowledged, and nothing of the listener or of sockets on other ports.
TEST(ServedSocketsTest, ReadsTheAcceptedConnectionsOfAPortFromTcpInfo) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  EXPECT_TRUE(ServedSockets(port).empty());  // the listener is not a served connection

  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int served = accept(listener, nullptr, nullptr);
  ASSERT_GE(served, 0);
  constexpr size_t kBytes = 1 << 20;
  std::thread reader([client] {
    std::vector<char> buf(1 << 16);
    size_t got = 0;
    while (got < kBytes) {
      const ssize_t n = read(client, buf.data(), buf.size());
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
  });
  const std::string data(kBytes, 'x');
  size_t sent = 0;
  while (sent < kBytes) {
    const ssize_t n = write(served, data.data() + sent, kBytes - sent);
    ASSERT_GT(n, 0);
    sent += static_cast<size_t>(n);
  }
  reader.join();
  std::vector<ServedSocket> sockets;
  for (int i = 0; i < 100; ++i) {  // the last ACKs may lag the reader by a moment
    sockets = ServedSockets(port);
    if (sockets.size() == 1 && sockets[0].bytes_acked >= kBytes && sockets[0].unacked == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(sockets.size(), 1u);
  EXPECT_GE(sockets[0].bytes_acked, kBytes);
  EXPECT_LE(sockets[0].bytes_acked, kBytes + 1);  // the handshake may count one
  EXPECT_EQ(sockets[0].remote_host, "127.0.0.1");
  EXPECT_GT(sockets[0].rtt_s, 0);
  EXPECT_LE(sockets[0].min_rtt_s, sockets[0].rtt_s);
  EXPECT_EQ(sockets[0].unacked, 0u);
  close(client);
  close(served);
  close(listener);
}

}  // namespace
}  // namespace echelon::net
