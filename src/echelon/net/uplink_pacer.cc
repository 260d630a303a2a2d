#include "echelon/net/uplink_pacer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_min_rtt and tcpi_bytes_acked
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "echelon/net/broadcast_protocol.h"

namespace echelon::net {

UplinkController::UplinkController(double declared_bps, bool pace) : declared_(declared_bps > 0), pace_(pace) {
  if (declared_) {
    pace_bps_ = pace_ ? kUploadPaceFraction * declared_bps : 0;
    rates_.push_back({0, declared_bps, false});  // kept: Step learns nothing when declared
  }
}

double UplinkController::AckedRate() const {
  double seconds = 0;
  double bytes = 0;
  for (const Window& w : recent_) {
    seconds += w.dt;
    bytes += static_cast<double>(w.bytes);
  }
  return seconds > 0 ? bytes / seconds : 0;
}

double UplinkController::capacity_bps() const {
  double best = 0;
  std::vector<double> queued;
  for (const Seen& r : rates_) {
    if (r.lower_bound) best = std::max(best, r.bps);
    else queued.push_back(r.bps);
  }
  if (queued.empty()) return best;
  const size_t q = queued.size() * 3 / 4;
  std::nth_element(queued.begin(), queued.begin() + q, queued.end());
  return std::max(best, queued[q]);
}

void UplinkController::Step(const UplinkSample& s) {
  now_ += s.dt;
  // Only busy samples (data in flight, or pieces held back) count toward the acknowledged
  // rate: the gaps between a relay's transfers say nothing of its uplink.
  if (declared_ || !(s.queue_delay_s || s.held_back)) return;
  recent_.push_back({now_, s.dt, s.acked_bytes});
  while (!recent_.empty() && recent_.front().t <= now_ - UplinkRule::kRateWindowSeconds) recent_.erase(recent_.begin());
  // The last capacity seen stays until a newer one: a long stretch without one must not
  // lower the floor.
  while (rates_.size() > 1 && rates_.front().t <= now_ - UplinkRule::kCapacityMemorySeconds) rates_.erase(rates_.begin());
  // Held back with nothing in flight: every piece was acknowledged before the next left, so
  // no queue stands.
  const double qd = s.queue_delay_s.value_or(0);
  const double target = UplinkRule::kTargetDelaySeconds;
  if (qd > target) {
    const double acked = AckedRate();
    // A queue stands. Where the uplink carried less than the pace (or there is none yet), this
    // node's own sending fills it, and the acknowledged rate is the uplink's capacity. Where
    // it carried the pace, the delay may be another's queue on the acknowledgement path, which
    // says nothing of this uplink (nor does a queue draining faster than the pace).
    if (acked > 0 && (pace_bps_ <= 0 || acked < (1 - UplinkRule::kPaceMatch) * pace_bps_))
      rates_.push_back({now_, std::max(s.delivery_bps, acked), false});
    if (!pace_) return;
    const double hold = std::max(UplinkRule::kCutHoldSeconds, s.rtt_s.value_or(0));
    const double from = pace_bps_ > 0 ? pace_bps_ : acked;
    if (now_ - last_cut_ < hold || from <= 0) return;
    const double share = UplinkRule::kDrainShare * std::min(1.0, (qd - target) / target);
    const double floor = std::max(UplinkRule::kMinPaceBps, UplinkRule::kFloorShare * capacity_bps());
    pace_bps_ = std::max(floor, from * (1 - share));
    last_cut_ = now_;
  } else if (s.held_back && pace_bps_ > 0) {
    const double grown = pace_bps_ * (1 + UplinkRule::kGrowthPerSecond * ((target - qd) / target) * s.dt);
    const double capacity = capacity_bps();
    if (capacity > 0 && grown > UplinkRule::kProbeShare * capacity) {
      // At the probe's bound with no queue: if the uplink carried the whole pace, it holds at
      // least that much (the household's traffic stopped), and the bound moves up with it.
      const double acked = AckedRate();
      if (acked >= (1 - UplinkRule::kPaceMatch) * pace_bps_) rates_.push_back({now_, acked, true});
      pace_bps_ = std::max(pace_bps_, std::min(grown, UplinkRule::kProbeShare * capacity_bps()));
    } else {
      pace_bps_ = grown;
    }
  }
}

void DelayHistogram::Add(double seconds) {
  const double bin = std::max(0.0, seconds) / kBinSeconds;
  bins_[std::min<size_t>(kBins - 1, static_cast<size_t>(bin))] += 1;
  ++count_;
}

std::optional<double> DelayHistogram::Quantile(double q) const {
  if (count_ == 0) return std::nullopt;
  const auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
  uint64_t seen = 0;
  for (size_t i = 0; i < kBins; ++i) {
    seen += bins_[i];
    if (seen >= std::max<uint64_t>(1, rank)) return (static_cast<double>(i) + 0.5) * kBinSeconds;
  }
  return (static_cast<double>(kBins) - 0.5) * kBinSeconds;
}

namespace {

// The port and host of a socket address (IPv4, IPv6, IPv4-mapped IPv6); nullopt for others.
std::optional<std::pair<int, std::string>> PortAndHost(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return std::make_pair(static_cast<int>(ntohs(in->sin_port)), std::string(text));
  }
  if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return std::make_pair(static_cast<int>(ntohs(in6->sin6_port)), std::string(text));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ServedSocket> ReadServedSocket(int fd, int port) {
  int type = 0;
  int protocol = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return std::nullopt;
  len = sizeof(protocol);
  if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0 || protocol != IPPROTO_TCP) return std::nullopt;
  sockaddr_storage local{};
  sockaddr_storage remote{};
  socklen_t local_len = sizeof(local);
  socklen_t remote_len = sizeof(remote);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return std::nullopt;
  const auto mine = PortAndHost(local);
  if (!mine || mine->first != port) return std::nullopt;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &remote_len) != 0) return std::nullopt;  // the listener
  const auto theirs = PortAndHost(remote);
  tcp_info info{};
  len = sizeof(info);
  struct stat st{};
  if (!theirs || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 || fstat(fd, &st) != 0) return std::nullopt;
  ServedSocket sock;
  sock.fd = fd;
  sock.id = static_cast<uint64_t>(st.st_ino);
  sock.remote_host = theirs->second;
  sock.bytes_acked = info.tcpi_bytes_acked;
  sock.rtt_s = info.tcpi_rtt * 1e-6;
  sock.min_rtt_s = info.tcpi_min_rtt == ~0u ? sock.rtt_s : info.tcpi_min_rtt * 1e-6;
  sock.unacked = info.tcpi_unacked;
  sock.delivery_bps = static_cast<double>(info.tcpi_delivery_rate);
  sock.app_limited = info.tcpi_delivery_rate_app_limited != 0;
  return sock;
}

std::vector<ServedSocket> ServedSockets(int port) {
  std::vector<ServedSocket> out;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (std::optional<ServedSocket> s = ReadServedSocket(static_cast<int>(fd), port)) out.push_back(std::move(*s));
  }
  closedir(dir);
  return out;
}

std::string UplinkSummaryJson(const UplinkSummary& s) {
  auto mbps = [](double bps) {
    if (!(bps > 0)) return std::string("null");
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2f", bps * 8e-6);
    return std::string(buf);
  };
  auto ms = [](const std::optional<double>& seconds) {
    if (!seconds) return std::string("null");
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f", *seconds * 1e3);
    return std::string(buf);
  };
  return "{\"declared_mbps\":" + mbps(s.declared_bps) + ",\"estimated_mbps\":" + mbps(s.estimated_bps) +
         ",\"pace_mbps\":" + mbps(s.pace_bps) + ",\"queue_delay_ms\":{\"p50\":" + ms(s.queue_delay_p50_s) +
         ",\"p99\":" + ms(s.queue_delay_p99_s) + "},\"delay_samples\":" + std::to_string(s.delay_samples) + "}";
}

UplinkPacer::UplinkPacer(UplinkPacerOptions options)
    : options_(options), controller_(options.declared_bps, options.pace) {}

UplinkPacer::~UplinkPacer() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (sampler_.joinable()) sampler_.join();
}

void UplinkPacer::Watch(int port) {
  if (sampler_.joinable() || port <= 0) return;
  sampler_ = std::thread([this, port] { SampleLoop(port); });
}

void UplinkPacer::SampleLoop(int port) {
  using Clock = std::chrono::steady_clock;
  std::map<uint64_t, uint64_t> acked;      // socket id -> bytes acknowledged at the last sample
  std::map<std::string, double> base_rtt;  // remote host -> least RTT seen
  std::vector<int> known;                  // the served sockets' fds at the last scan
  int since_scan = kRescanSamples;
  auto last = Clock::now();
  const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(UplinkRule::kSampleSeconds));
  while (true) {
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (stop_cv_.wait_for(lock, period, [this] { return stopping_.load(); })) return;
    }
    const auto now = Clock::now();
    UplinkSample sample;
    sample.dt = std::chrono::duration<double>(now - last).count();
    last = now;
    // The descriptor table is scanned now and then; in between only the served sockets are read
    // (a process with a thousand actors' connections would otherwise pay for all of them).
    // A piece held back with none of the known sockets in flight is on a connection opened
    // since the last scan: scan now.
    std::vector<ServedSocket> sockets;
    if (++since_scan < kRescanSamples) {
      bool in_flight = false;
      for (int fd : known) {
        if (std::optional<ServedSocket> s = ReadServedSocket(fd, port)) {
          in_flight = in_flight || s->unacked > 0;
          sockets.push_back(std::move(*s));
        }
      }
      if (!in_flight && held_back_.load()) since_scan = kRescanSamples;
    }
    if (since_scan >= kRescanSamples) {
      sockets = ServedSockets(port);
      since_scan = 0;
    }
    known.clear();
    std::map<uint64_t, uint64_t> seen;
    for (const ServedSocket& s : sockets) {
      known.push_back(s.fd);
      // A socket first seen counts from here: what it carried before is not this sample's.
      const auto before = acked.find(s.id);
      if (before != acked.end()) sample.acked_bytes += s.bytes_acked - std::min(before->second, s.bytes_acked);
      seen[s.id] = s.bytes_acked;
      double& base = base_rtt.try_emplace(s.remote_host, s.min_rtt_s).first->second;
      base = std::min({base, s.min_rtt_s, s.rtt_s});
      if (s.unacked == 0) continue;  // idle: its smoothed RTT is from its last transfer
      if (!s.app_limited)
        sample.delivery_bps = options_.one_upload_at_a_time ? std::max(sample.delivery_bps, s.delivery_bps)
                                                            : sample.delivery_bps + s.delivery_bps;
      const double delay = std::max(0.0, s.rtt_s - base);
      if (!sample.queue_delay_s || delay < *sample.queue_delay_s) {
        sample.queue_delay_s = delay;
        sample.rtt_s = s.rtt_s;
      }
    }
    acked = std::move(seen);
    sample.held_back = held_back_.exchange(false);
    std::lock_guard<std::mutex> lock(mu_);
    if (sample.queue_delay_s) delays_.Add(*sample.queue_delay_s);
    controller_.Step(sample);
  }
}

size_t UplinkPacer::Pace(size_t remaining) {
  std::unique_lock<std::mutex> lock(mu_);
  const double rate = controller_.pace_bps();
  if (!(rate > 0)) return std::min<size_t>(remaining, kPacedPieceBytes);
  const size_t bytes = std::min(remaining, std::clamp(static_cast<size_t>(rate * UplinkRule::kBurstSeconds),
                                                      UplinkRule::kMinPieceBytes, static_cast<size_t>(kPacedPieceBytes)));
  const auto now = std::chrono::steady_clock::now();
  if (paced_until_ < now) paced_until_ = now;  // an idle uplink saves up no credit
  const auto send_at = paced_until_;
  paced_until_ += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / rate));
  lock.unlock();
  if (send_at > now + std::chrono::milliseconds(1)) held_back_ = true;
  std::this_thread::sleep_until(send_at);
  return bytes;
}

UplinkSummary UplinkPacer::Summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  UplinkSummary s;
  s.declared_bps = options_.declared_bps > 0 ? options_.declared_bps : 0;
  s.estimated_bps = controller_.declared() ? 0 : controller_.capacity_bps();
  s.pace_bps = controller_.pace_bps();
  s.queue_delay_p50_s = delays_.Quantile(0.5);
  s.queue_delay_p99_s = delays_.Quantile(0.99);
  s.delay_samples = delays_.count();
  return s;
}

}  // namespace echelon::net
