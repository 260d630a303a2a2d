// UplinkPacer: how fast a broadcast node serves, found from its own sockets. A node behind a
// home router uploads into a FIFO queue of tens to hundreds of milliseconds; once its uploads
// fill that queue, the acknowledgements of everything it downloads (and every control message
// it sends) wait behind them. The pacer finds the uplink's capacity and its queueing delay from
// TCP_INFO on the sockets the node serves from, and lets what the node serves leave no faster
// than a rate that keeps that queue under a small target delay. A declared rate wins: the node
// is then paced to kUploadPaceFraction of it and nothing is estimated.
//
//   UplinkPacer pacer(UplinkPacerOptions{});     // adaptive; or {.declared_bps = 12.5e6}
//   pacer.Watch(port);                           // the port the ChunkSource serves on
//   size_t n = pacer.Pace(left);                 // the next piece's size, once it may leave
//   UplinkSummary s = pacer.Summary();           // for the JSON summary
//
// The rule (UplinkRule holds its constants), after LEDBAT (RFC 6817: a target queueing delay,
// the delay over a remembered base as the signal) and BBR (the delivery rate while a queue
// stands is the bottleneck's rate):
// - every kSampleSeconds the served TCP sockets are read; the queueing delay is, over the
//   sockets with data in flight, the least smoothed RTT over its remote host's base RTT (the
//   least RTT ever seen to that host): the other sockets' delays are at least this node's
//   own queue, and the least of them is the one least inflated by a receiver's queue on the
//   acknowledgement path;
// - unpaced until the first queue above target: that queue means the uplink is full, and the
//   rate its sockets were acknowledged at (over kRateWindowSeconds) is its capacity; the pace
//   starts below it;
// - a queue above target: the pace is cut by a share that grows with the excess (kDrainShare
//   at twice the target and above), at most once per RTT, until the queue drains; never below
//   kFloorShare of the capacity seen lately: a delay that is not this node's queue (a
//   receiver's, on the path of the acknowledgements) shows as a queue while the uplink carries
//   just the pace, and must not throttle it to nothing. The capacity is the upper quartile of
//   the delivery rates (TCP_INFO's, or the acknowledged rate where higher) seen while the node's
//   own queue stood (the uplink carried less than the pace), or the most it carried whole with
//   no queue;
// - a queue under target while the pace held pieces back (nothing in flight counts as no
//   queue): the pace grows by up to kGrowthPerSecond, in proportion to how far under target,
//   to at most kProbeShare times the capacity seen, so it finds the uplink's rate and the
//   capacity the household's traffic frees;
// - no pieces held back: the pace stays (an idle node learns nothing about its uplink).
//
// Thread contract: Pace and Summary from any thread; one sampler thread (Watch) owns the
// controller state, published under mu_.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace echelon::net {

// The constants of the rule above, with their reasons.
struct UplinkRule {
  // Sockets are read this often. TCP's smoothed RTT follows every acknowledgement, so a
  // 50 ms period sees a queue build within a chunk's time (1 MiB at 100 Mbit/s: 84 ms).
  static constexpr double kSampleSeconds = 0.05;
  // The queueing delay the pace aims to stay under. The acknowledgements of a node's downloads
  // and its control messages wait this long at most; small against the 50-500 ms of a home
  // router's queue, above the few milliseconds RTT samples jitter by on a loaded host.
  static constexpr double kTargetDelaySeconds = 0.015;
  // The acknowledged rate is taken over this window (ten samples: ACKs arrive in bursts).
  static constexpr double kRateWindowSeconds = 0.5;
  // With the queue at twice the target the pace is cut by this share; the share grows linearly
  // from 0 at the target and is capped there.
  static constexpr double kDrainShare = 0.15;
  // A pace is cut at most once per this long (or one smoothed RTT, the longer): a cut shows in
  // the RTT only after the queue has drained by it.
  static constexpr double kCutHoldSeconds = 0.1;
  // Growth of the pace per second with an empty queue while pieces are held back: from 80% of
  // capacity back to it in under a second.
  static constexpr double kGrowthPerSecond = 0.3;
  // The pace grows to at most this many times the capacity seen: enough to find more (its
  // queue then shows it), not so far that a sender whose TCP keeps the queue short itself (BBR)
  // reports a pace it never needed.
  static constexpr double kProbeShare = 1.25;
  // An acknowledged rate this share under the pace (or more) is the uplink's capacity; closer,
  // it is the pace.
  static constexpr double kPaceMatch = 0.03;
  // The pace never falls under this share of the highest capacity seen over the last
  // kCapacityMemorySeconds (or the last one seen, if older), nor under kMinPaceBps.
  static constexpr double kFloorShare = 0.5;
  static constexpr double kCapacityMemorySeconds = 10.0;
  static constexpr double kMinPaceBps = 64e3;
  // A paced piece leaves as one burst; at the pace it lasts about this long (a few ms: well
  // under the target), in pieces of at least kMinPieceBytes.
  static constexpr double kBurstSeconds = 0.002;
  static constexpr size_t kMinPieceBytes = 16u << 10;
};

// One control step's inputs: what the sockets said over the last dt seconds.
struct UplinkSample {
  double dt = 0;                            // seconds since the previous step
  uint64_t acked_bytes = 0;                 // acknowledged over dt, all served sockets
  std::optional<double> queue_delay_s;      // none: no served socket had data in flight
  std::optional<double> rtt_s;              // the smoothed RTT of the socket the delay came from
  double delivery_bps = 0;                  // the kernel's delivery rate over the sockets in flight
  bool held_back = false;                   // the pacer made a piece wait during dt
};

// The rule, on its own (UplinkPacer feeds it from the sockets; tests from a model link).
class UplinkController {
 public:
  // pace false: the capacity is estimated (from the queue its unpaced sending builds) and the
  // pace stays 0.
  explicit UplinkController(double declared_bps = 0, bool pace = true);
  void Step(const UplinkSample& s);
  double pace_bps() const { return pace_bps_; }         // 0: not paced (yet)
  // The uplink's estimated capacity over the last kCapacityMemorySeconds (or the last one seen,
  // if older): the upper quartile of the delivery rates seen while its own queue stood (single
  // rate samples scatter both ways, more of them low: a transfer's start, a receiver's stall),
  // or the highest rate it carried whole with no queue, whichever is more; 0: none seen yet.
  double capacity_bps() const;
  bool declared() const { return declared_; }

 private:
  double AckedRate() const;  // over the last kRateWindowSeconds

  const bool declared_;
  const bool pace_;
  double pace_bps_ = 0;
  double now_ = 0;
  double last_cut_ = -1e9;
  struct Window {
    double t;
    double dt;
    uint64_t bytes;
  };
  std::vector<Window> recent_;                       // the last kRateWindowSeconds of samples
  struct Seen {
    double t;
    double bps;
    bool lower_bound;  // carried the whole pace with no queue: the uplink holds at least this
  };
  std::vector<Seen> rates_;  // capacity seen over the last kCapacityMemorySeconds
};

// Queueing-delay samples in 0.5 ms bins up to 2 s (the rest in the last), for percentiles.
class DelayHistogram {
 public:
  void Add(double seconds);
  std::optional<double> Quantile(double q) const;  // seconds; none without samples
  uint64_t count() const { return count_; }

 private:
  static constexpr double kBinSeconds = 0.0005;
  static constexpr size_t kBins = 4000;
  std::array<uint64_t, kBins> bins_{};
  uint64_t count_ = 0;
};

// One served TCP socket's figures from TCP_INFO.
struct ServedSocket {
  int fd = -1;
  uint64_t id = 0;            // the socket's inode: unique while it is open
  std::string remote_host;    // the peer's address
  uint64_t bytes_acked = 0;   // since the connection opened
  double rtt_s = 0;           // smoothed
  double min_rtt_s = 0;       // the kernel's windowed minimum
  uint32_t unacked = 0;       // segments in flight
  double delivery_bps = 0;    // the kernel's latest delivery-rate sample
  bool app_limited = false;   // ... taken while the sender had too little to send
};
// This process's connected TCP sockets whose local port is `port` (the connections accepted
// by the server listening there), read from /proc/self/fd and TCP_INFO.
std::vector<ServedSocket> ServedSockets(int port);
// One descriptor's, if it is such a socket.
std::optional<ServedSocket> ReadServedSocket(int fd, int port);

struct UplinkPacerOptions {
  double declared_bps = 0;  // > 0: paced to kUploadPaceFraction of it; nothing estimated
  bool pace = true;         // false: estimated and reported, never paced
  // The node sends one chunk at a time (ChunkSourceService serialize_uploads), so the socket
  // it sends on carries the whole uplink and the others in flight only a finished chunk's
  // tail: the uplink's delivery rate is their highest, not their sum (which counts the
  // uplink once per tail: an origin estimated 140-310 Mbit/s on a 100 Mbit/s link).
  bool one_upload_at_a_time = true;
};

struct UplinkSummary {
  double declared_bps = 0;                   // 0: none
  double estimated_bps = 0;                  // 0: no queue seen yet (the uplink was never full)
  double pace_bps = 0;                       // what it is paced to now; 0: not paced
  std::optional<double> queue_delay_p50_s;   // over the samples with data in flight
  std::optional<double> queue_delay_p99_s;
  uint64_t delay_samples = 0;
};
// {"declared_mbps", "estimated_mbps", "pace_mbps", "queue_delay_ms": {"p50", "p99"}} as JSON
// text (nulls where unknown), for the nodes' summary lines.
std::string UplinkSummaryJson(const UplinkSummary& s);

class UplinkPacer {
 public:
  explicit UplinkPacer(UplinkPacerOptions options);
  ~UplinkPacer();
  UplinkPacer(const UplinkPacer&) = delete;
  UplinkPacer& operator=(const UplinkPacer&) = delete;

  // Starts reading the sockets served on `port` every UplinkRule::kSampleSeconds.
  void Watch(int port);
  // The size of the next piece of at most `remaining` bytes, once it may leave at the current
  // pace (at once when unpaced). A piece holds UplinkRule::kBurstSeconds at the pace, within
  // [kMinPieceBytes, kPacedPieceBytes] (kPacedPieceBytes when unpaced): it leaves as one burst
  // at line rate, so on a slow uplink a large one is a queue of its own.
  size_t Pace(size_t remaining);
  UplinkSummary Summary() const;

 private:
  void SampleLoop(int port);
  static constexpr int kRescanSamples = 5;  // the descriptor table is scanned four times a second

  const UplinkPacerOptions options_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> held_back_{false};
  std::thread sampler_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;

  mutable std::mutex mu_;  // guards everything below
  UplinkController controller_;
  DelayHistogram delays_;
  std::chrono::steady_clock::time_point paced_until_;  // when the paced uplink is next free
};

}  // namespace echelon::net
