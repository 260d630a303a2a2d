// The relay policy at internet scale, on simulated links: one snapshot (or a delta of it)
// from the origin to N peers, every node uploading at the same rate (downloads unconstrained,
// see link_simulator.h). Prints the last peer's completion against one point-to-point
// transfer time T1 = bytes / bandwidth, and what the simulation cost.
//
//   broadcast_scale_bench --peers 1000 --bytes 16e9 --chunk-mib 64 --gbit 1
//   broadcast_scale_bench --peers 1000 --bytes 16e9 --chunk-mib 64 --gbit 1 --delta 0.02
//   broadcast_scale_bench --peers 1000 --bytes 16e9 --chunk-mib 16 --delta 0.02 --slots 2
//
// --slow-fraction F --slow-factor K: mixed links, against the capacity bound as well.
// --delta F: a delta of every chunk, F of its size each (the chunking of the full snapshot,
// as broadcast/delta.h sends it). Exit 1 when --bound is given and the ratio exceeds it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "echelon/broadcast/link_simulator.h"

int main(int argc, char** argv) {
  using namespace echelon::broadcast;
  CLI::App app{"relay policy at scale on simulated links"};
  int peers = 1000;
  double bytes = 16e9;
  double chunk_mib = 64;
  double gbit = 1;
  double delta = 0;
  double latency_ms = 1;
  double bound = 0;
  int slots = 1;
  double slow_fraction = 0;
  double slow_factor = 10;
  double endgame = 0;
  bool serial = false;
  bool undeclared = false;
  double jitter = 0;
  uint64_t seed = 1;
  std::string trace;
  app.add_option("--peers", peers, "peers (besides the origin)")->check(CLI::Range(1, 100000));
  app.add_option("--bytes", bytes, "snapshot size in bytes")->check(CLI::PositiveNumber);
  app.add_option("--chunk-mib", chunk_mib, "chunk size of the full snapshot, MiB")->check(CLI::PositiveNumber);
  app.add_option("--gbit", gbit, "upload rate of every node, Gbit/s")->check(CLI::PositiveNumber);
  app.add_option("--delta", delta, "send a delta of this fraction of each chunk (0 = the full snapshot)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--latency-ms", latency_ms, "per-transfer start latency, ms")->check(CLI::NonNegativeNumber);
  app.add_option("--slots", slots, "concurrent uploads per node (RelayOptions::upload_slots)")->check(CLI::Range(1, 64));
  app.add_option("--slow-fraction", slow_fraction, "this fraction of the peers upload --slow-factor times slower")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--slow-factor", slow_factor, "how much slower the slow peers upload")->check(CLI::Range(1.0, 1e6));
  app.add_option("--endgame", endgame, "RelayOptions::endgame_ratio (0 = off)")->check(CLI::NonNegativeNumber);
  app.add_flag("--serial-uploads", serial, "each node sends one transfer at a time (as the network transport does)");
  app.add_flag("--undeclared", undeclared,
               "peers declare no upload rate: the planner starts them at --gbit and measures them");
  app.add_option("--jitter", jitter, "each transfer's rate varies by up to this fraction (uniform)")
      ->check(CLI::Range(0.0, 0.9));
  app.add_option("--seed", seed, "seed of --jitter");
  app.add_option("--trace", trace, "write one JSON line per transfer here (as `broadcast origin --trace`)");
  app.add_option("--bound", bound, "exit 1 when last completion / T1 exceeds this");
  CLI11_PARSE(app, argc, argv);

  const double chunk_bytes = chunk_mib * (1 << 20);
  BroadcastScenario s;
  s.peers = peers;
  s.options.upload_slots = slots;
  s.options.endgame_ratio = endgame;
  s.chunks = static_cast<int>(std::ceil(bytes / chunk_bytes));
  s.chunk_bytes = static_cast<uint64_t>(delta > 0 ? chunk_bytes * delta : chunk_bytes);
  s.origin_bps = gbit * 1e9 / 8;
  s.latency_s = latency_ms / 1000;
  s.serial_uploads = serial;
  s.rates_declared = !undeclared;
  s.rate_jitter = jitter;
  s.seed = seed;
  s.log_transfers = !trace.empty();
  const int slow = static_cast<int>(std::lround(slow_fraction * peers));
  double upload_total = s.origin_bps;
  for (int i = 0; i < peers; ++i) {
    s.peer_bps.push_back(i < peers - slow ? s.origin_bps : s.origin_bps / slow_factor);
    upload_total += s.peer_bps.back();
  }
  const double payload = static_cast<double>(s.chunks) * static_cast<double>(s.chunk_bytes);
  const double t1 = payload / s.origin_bps;
  // Capacity bound: the origin sends every byte once; all uploads together carry N copies.
  const double capacity = std::max(t1, peers * payload / upload_total);

  const auto start = std::chrono::steady_clock::now();
  auto r = SimulateBroadcast(s);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!r.ok()) {
    std::fprintf(stderr, "broadcast_scale_bench: %s\n", r.status().message().c_str());
    return 1;
  }
  if (!trace.empty()) {
    std::FILE* f = std::fopen(trace.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "broadcast_scale_bench: cannot write --trace %s\n", trace.c_str());
      return 1;
    }
    auto name = [](NodeId n) { return n == kOrigin ? std::string("origin") : "p" + std::to_string(n); };
    for (const SimulatedTransfer& t : r->transfers) {
      if (!t.finished) continue;
      std::fprintf(f,
                   "{\"chunk\": %d, \"from\": \"%s\", \"to\": \"%s\", \"ordered_s\": %.6f, \"reported_s\": %.6f, "
                   "\"bytes\": %llu, \"result\": \"verified\"}\n",
                   t.transfer.chunk, name(t.transfer.from).c_str(), name(t.transfer.to).c_str(), t.started, *t.finished,
                   static_cast<unsigned long long>(s.chunk_bytes));
    }
    std::fclose(f);
  }
  const double ratio = r->last_completion / t1;
  std::printf(
      "{\"peers\": %d, \"chunks\": %d, \"chunk_bytes\": %llu, \"payload_bytes\": %.0f, \"t1_s\": %.3f, "
      "\"last_completion_s\": %.3f, \"ratio\": %.4f, \"capacity_bound_s\": %.3f, \"over_bound\": %.4f, \"all_complete\": %s, \"transfers\": %llu, "
      "\"origin_sends\": %llu, \"sim_wall_s\": %.2f}\n",
      peers, s.chunks, static_cast<unsigned long long>(s.chunk_bytes), payload, t1, r->last_completion, ratio, capacity,
      r->last_completion / capacity,
      r->all_complete ? "true" : "false", static_cast<unsigned long long>(r->stats.started),
      static_cast<unsigned long long>(r->stats.origin_sends), wall);
  if (!r->all_complete) return 1;
  return bound > 0 && ratio > bound ? 1 : 0;
}
