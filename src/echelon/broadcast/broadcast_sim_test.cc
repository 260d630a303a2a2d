// The relay policy on simulated links: scaling (star linear, peer-assisted ~ T1 + log2(N)
// chunk times), faults (relay death, corrupt sender, late joiners) and delta, then an
// end-to-end run with real bytes, real hashes and real ChunkStores.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include <gtest/gtest.h>

#include "echelon/broadcast/chunk_store.h"
#include "echelon/broadcast/link_simulator.h"
#include "echelon/broadcast/manifest.h"
#include "echelon/broadcast/relay_session.h"
#include "echelon/common/sha256.h"
#include "echelon/plan/link_model.h"

namespace echelon::broadcast {
namespace {

// 128 MiB in 32 chunks of 4 MiB at 100 Mbit/s per uploader (the benchmark).
constexpr double kBps = 12.5e6;
constexpr double kChunkSeconds = (4u << 20) / kBps;
constexpr double kT1 = 32 * kChunkSeconds;  // one point-to-point transfer of the file

BroadcastResult Simulate(const BroadcastScenario& s) {
  Result<BroadcastResult> r = SimulateBroadcast(s);
  EXPECT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r.ok() && r->all_complete);
  return r.ok() ? r.value() : BroadcastResult{};
}

double LastCompletion(RelayMode mode, int peers, int chunks = 32) {
  BroadcastScenario s;
  s.options.mode = mode;
  s.peers = peers;
  s.chunks = chunks;
  return Simulate(s).last_completion;
}

int CeilLog2(int x) {
  int k = 0;
  while ((1 << k) < x) ++k;
  return k;
}

TEST(BroadcastSimTest, StarGrowsLinearlyInPeers) {
  for (int n : {1, 2, 4, 8, 16, 100, 1000}) {
    EXPECT_NEAR(LastCompletion(RelayMode::kStar, n) / kT1, n, 1e-6 * n) << "n=" << n;
  }
}

TEST(BroadcastSimTest, OneChunkIsABinomialTree) {
  for (int n : {1, 2, 3, 7, 8, 100, 1000}) {
    EXPECT_NEAR(LastCompletion(RelayMode::kSwarm, n, 1) / kChunkSeconds, CeilLog2(n + 1), 1e-6) << "n=" << n;
  }
}

TEST(BroadcastSimTest, PeerAssistedGrowsLogarithmically) {
  std::map<int, double> t;
  std::printf("  N    star/T1  peer-assisted/T1  excess chunk-times  ceil(log2(N+1))\n");
  for (int n : {1, 2, 4, 8, 10, 16, 100, 1000}) {
    t[n] = LastCompletion(RelayMode::kSwarm, n);
    const double excess = (t[n] - kT1) / kChunkSeconds;
    std::printf("%5d %8.3f %12.3f %16.2f %14d\n", n, LastCompletion(RelayMode::kStar, n) / kT1, t[n] / kT1, excess,
                CeilLog2(n + 1));
    // About one file time plus one chunk time per doubling of the swarm.
    EXPECT_GE(excess, CeilLog2(n + 1) - 1 - 1e-6) << "n=" << n;
    EXPECT_LE(excess, CeilLog2(n + 1) + 1 + 1e-6) << "n=" << n;
  }
  // 100x more peers: linear would be 100x, log10 ratio is 3x; measured ~1.23x.
  EXPECT_LT(t[1000] / t[10], std::log(1000.0) / std::log(10.0));
  EXPECT_LT(t[1000] / t[10], 1.3);
  EXPECT_LE(t[16] / t[4], 1.15);  // the N = 4 -> 16 bound
}

TEST(BroadcastSimTest, EightPeersFinishWithinOnePointThreeTransfers) {
  BroadcastScenario s;
  EXPECT_LE(Simulate(s).last_completion, 1.3 * kT1);
  EXPECT_GE(Simulate(s).last_completion, kT1);  // nobody beats the origin's own upload
  s.latency_s = 0.005;                     // 5 ms per chunk handshake
  EXPECT_LE(Simulate(s).last_completion, 1.3 * kT1);
  s.options.upload_slots = 2;  // two chunks in flight per uploader
  EXPECT_LE(Simulate(s).last_completion, 1.3 * kT1);
  BroadcastResult r = Simulate(BroadcastScenario{});
  EXPECT_EQ(r.stats.verified, 8u * 32u);       // no chunk moves twice to one peer
  EXPECT_LE(r.stats.origin_sends, 32u + 4u);   // each chunk leaves the origin about once
}

TEST(BroadcastSimTest, KillingTwoOfEightMidTransferSurvivorsResume) {
  for (std::vector<NodeId> victims : {std::vector<NodeId>{1, 2}, {3, 6}, {7, 8}}) {
    BroadcastScenario s;
    s.kills[kT1 / 2] = victims;
    BroadcastResult r = Simulate(s);
    EXPECT_GT(r.stats.cancelled, 0u);
    EXPECT_LE(r.last_completion, 1.6 * kT1);
    for (NodeId n = 1; n <= 8; ++n) {
      bool dead = n == victims[0] || n == victims[1];
      EXPECT_EQ(r.completed_at[n].has_value(), !dead) << "node " << n;
      // A survivor receives each chunk exactly once: it resumed from what it held.
      if (dead) {
        EXPECT_LT(r.received[n], 32) << "node " << n;
      } else {
        EXPECT_EQ(r.received[n], 32) << "node " << n;
      }
    }
  }
}

TEST(BroadcastSimTest, CorruptSenderIsPenalisedAndChunkRefetched) {
  BroadcastScenario s;
  s.corrupt_senders = {3};
  BroadcastResult r = Simulate(s);
  for (NodeId n = 1; n <= 8; ++n) {
    EXPECT_EQ(r.banned[n], n == 3) << "node " << n;
    EXPECT_EQ(r.received[n], 32) << "node " << n;  // incl. the refetched chunk
  }
  EXPECT_EQ(r.stats.corrupt, 2u);  // banned once two receivers reported it
  EXPECT_EQ(r.stats.verified, 8u * 32u);
  EXPECT_LE(r.last_completion, 1.3 * kT1);
}

TEST(BroadcastSimTest, DeltaMovesOnlyChangedChunks) {
  BroadcastScenario s;
  std::vector<bool> held(32, true);
  held[2] = held[5] = held[30] = false;
  s.held.assign(8, held);
  BroadcastResult r = Simulate(s);
  EXPECT_EQ(r.stats.started, 3u * 8u);
  EXPECT_EQ(r.bytes_moved, 3ull * 8ull * (4u << 20));
  EXPECT_LE(r.stats.origin_sends, 8u);  // a third of the 24 sends; star would make all 24
  EXPECT_LE(r.last_completion, (3 + CeilLog2(9) + 1) * kChunkSeconds);
}

TEST(BroadcastSimTest, LateJoinersCatchUp) {
  BroadcastScenario s;
  s.late_joiners[kT1 / 2] = 2;
  BroadcastResult r = Simulate(s);
  ASSERT_EQ(r.completed_at.size(), 11u);
  for (NodeId n = 9; n <= 10; ++n) {
    ASSERT_TRUE(r.completed_at[n].has_value());
    EXPECT_EQ(r.received[n], 32);
  }
  EXPECT_LE(r.last_completion, 1.3 * kT1);
}

// 4 fast + 4 ten-times-slower uploaders. Capacity bound: 8 files over 540 Mbit/s of total
// upload = 1.48 x T1 (star: 8 x T1). A slow sender serving a fast receiver holds that
// receiver's last chunk for ten chunk times (2.0 x T1 when receivers were ranked by speed
// alone); slow peers serving slow receivers first: 1.69 x T1; with the endgame (ratio 2) the
// fast uploaders also duplicate what slow senders still hold: 1.56 x T1 = 1.05 x the bound.
TEST(BroadcastSimTest, MixedLinksFinishNearTheCapacityBound) {
  BroadcastScenario s;
  s.peer_bps = {kBps, kBps, kBps, kBps, kBps / 10, kBps / 10, kBps / 10, kBps / 10};
  const double bound = 8.0 * 100 / 540 * kT1;
  s.options.endgame_ratio = 0;
  BroadcastResult without = Simulate(s);
  s.options.endgame_ratio = 2;
  BroadcastResult r = Simulate(s);
  std::printf("  mixed links: %.3f x T1 with the endgame (%llu copies), %.3f x T1 without; capacity bound %.3f\n",
              r.last_completion / kT1, static_cast<unsigned long long>(r.stats.endgame),
              without.last_completion / kT1, bound / kT1);
  EXPECT_GE(r.last_completion, bound);
  EXPECT_LE(r.last_completion, 1.1 * bound);
  EXPECT_LE(without.last_completion, 1.15 * bound);
  EXPECT_LT(r.last_completion, 0.95 * without.last_completion);
  EXPECT_GT(r.stats.endgame, 0u);
  // Equal links never trigger it.
  BroadcastScenario equal;
  equal.options.endgame_ratio = 2;
  EXPECT_EQ(Simulate(equal).stats.endgame, 0u);
}

// Regression: slots held 4 MiB of transfers whatever the link, so a 100 Mbit/s origin sending
// 1 MiB chunks had eight queued (0.7 s): its first ones all went to the first peer added, and it
// sent 16 duplicate copies to 16 peers (144 sends, 1.125 x T1; the netns bench measured 145 and
// 1.13). Queues that only cover a transfer's start (5 ms here) keep the origin near one copy of
// each chunk and the swarm near one transfer time.
TEST(BroadcastSimTest, SmallChunksDoNotQueueTheOriginsFirstCopiesAtOnePeer) {
  BroadcastScenario s;
  s.peers = 16;
  s.chunks = 128;
  s.chunk_bytes = 1u << 20;
  s.latency_s = 0.005;
  s.serial_uploads = true;
  s.options.upload_slots = 2;
  const BroadcastResult r = Simulate(s);
  const double t1 = s.chunks * (1u << 20) / s.origin_bps;
  std::printf("  16 peers, 1 MiB chunks: %.3f x T1, %llu origin sends\n", r.last_completion / t1,
              static_cast<unsigned long long>(r.stats.origin_sends));
  EXPECT_LE(r.stats.origin_sends, 136u);
  EXPECT_LE(r.last_completion, 1.06 * t1);
}

// The same mixed links as a real swarm sees them: no peer declares its rate (the planner starts
// every one at the origin's and measures), each sends one chunk at a time after a 50 ms start,
// and every transfer's rate varies by up to 30% (what the netns bench measures per transfer).
// Seeded: one seed gives one result. With the endgame (ratio 3) these 10 seeds finish at 1.16 x
// the capacity bound on average; without it, 1.26 (20 seeds, bench/broadcast_scale_bench.cc).
TEST(BroadcastSimTest, MixedLinksWithUndeclaredRatesAndNoisyTransfers) {
  BroadcastScenario s;
  s.peer_bps = {kBps, kBps, kBps, kBps, kBps / 10, kBps / 10, kBps / 10, kBps / 10};
  s.rates_declared = false;
  s.latency_s = 0.05;
  s.serial_uploads = true;
  s.options.upload_slots = 2;
  s.options.endgame_ratio = 3;
  s.rate_jitter = 0.3;
  const double bound = 8.0 * 100 / 540 * kT1;
  double sum = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    s.seed = seed;
    const BroadcastResult r = Simulate(s);
    EXPECT_GE(r.last_completion, bound) << "seed " << seed;
    sum += r.last_completion;
    if (seed == 1) {
      EXPECT_EQ(Simulate(s).last_completion, r.last_completion);  // seeded
    }
  }
  std::printf("  mixed links, undeclared rates, 30%% jitter: %.3f x the capacity bound (mean of 10 seeds)\n",
              sum / 10 / bound);
  EXPECT_LE(sum / 10, 1.25 * bound);
  s.seed = 2;
  const double seed2 = Simulate(s).last_completion;
  s.seed = 1;
  EXPECT_NE(Simulate(s).last_completion, seed2);
}

// plan/'s closed-form relay time (link_model.h) against this policy on simulated links, over
// swarm sizes, chunk counts and origin/relay uplink ratios (downloads unconstrained, as in the
// simulator). The model is the capacity bound plus one chunk time per doubling of the holders.
TEST(BroadcastSimTest, LinkModelAgainstRelayPolicy) {
  struct Case {
    int peers, chunks;
    double origin_factor;  // origin uplink / every peer's
  };
  std::printf("  peers chunks U/u   policy/T1  model/T1  model/policy\n");
  for (const Case& k : {Case{1, 32, 1}, Case{2, 32, 1}, Case{8, 32, 1}, Case{16, 32, 1}, Case{100, 32, 1},
                        Case{1000, 32, 1}, Case{8, 1, 1}, Case{100, 4, 1}, Case{1000, 128, 1}, Case{8, 32, 4},
                        Case{100, 32, 10}, Case{100, 32, 0.5}}) {
    BroadcastScenario s;
    s.peers = k.peers;
    s.chunks = k.chunks;
    s.origin_bps = kBps * k.origin_factor;
    s.peer_bps.assign(k.peers, kBps);
    const double policy = Simulate(s).last_completion;
    plan::LinkSpec link{plan::BroadcastMode::kRelay, s.origin_bps * 8 / 1e6, (4u << 20) / 1048576.0};
    const double model = plan::SnapshotSeconds(link, k.chunks * double(4u << 20), /*downlink_mbps=*/1e9, k.peers,
                                               /*relay_uplink_mbps=*/kBps * 8 / 1e6);
    const double t1 = k.chunks * kChunkSeconds;
    std::printf("  %5d %6d %4.1f %9.3f %9.3f %10.3f\n", k.peers, k.chunks, k.origin_factor, policy / t1, model / t1,
                model / policy);
    EXPECT_NEAR(model / policy, 1.0, 0.12) << k.peers << " peers, " << k.chunks << " chunks, U/u " << k.origin_factor;
  }
  // Mixed links (4 fast + 4 ten-times-slower peers): the model sees only the mean uplink, so
  // without the endgame it is optimistic by what the policy loses to slow senders holding the
  // last chunks; with it (the default) the policy comes in within 10% of the model either way.
  BroadcastScenario mixed;
  mixed.peer_bps = {kBps, kBps, kBps, kBps, kBps / 10, kBps / 10, kBps / 10, kBps / 10};
  const double with_endgame = Simulate(mixed).last_completion;
  mixed.options.endgame_ratio = 0;
  const double policy = Simulate(mixed).last_completion;
  plan::LinkSpec link{plan::BroadcastMode::kRelay, kBps * 8 / 1e6, 4};
  const double model = plan::SnapshotSeconds(link, 32 * double(4u << 20), 1e9, 8, 0.55 * kBps * 8 / 1e6);
  std::printf("  mixed links: policy %.3f x T1 (%.3f with the endgame), model %.3f x T1\n", policy / kT1,
              with_endgame / kT1, model / kT1);
  EXPECT_GT(model / policy, 0.9);
  EXPECT_LE(model / policy, 1.0);
  EXPECT_NEAR(model / with_endgame, 1.0, 0.1);
}

// 1,000 peers on 1 Gbit/s links, a 16 GB snapshot in 64 MiB chunks, 1 ms to start each
// transfer: the whole snapshot, then a 2% delta of every chunk, each within 1.2 x its own
// transfer time (bench/broadcast_scale_bench.cc has the other chunk sizes).
TEST(BroadcastSimTest, ThousandPeersSixteenGigabytesAndATwoPercentDelta) {
  for (double fraction : {1.0, 0.02}) {
    BroadcastScenario s;
    s.peers = 1000;
    s.chunks = 239;  // 16e9 bytes / 64 MiB
    s.chunk_bytes = static_cast<uint64_t>(fraction * (64u << 20));
    s.origin_bps = 125e6;
    s.latency_s = 0.001;
    const double t1 = s.chunks * static_cast<double>(s.chunk_bytes) / s.origin_bps;
    const BroadcastResult r = Simulate(s);
    std::printf("  1000 peers, %s: %.3f x T1 (T1 %.2f s)\n", fraction < 1 ? "2% delta" : "16 GB", r.last_completion / t1,
                t1);
    EXPECT_LE(r.last_completion, 1.2 * t1) << "fraction " << fraction;
    EXPECT_GE(r.last_completion, t1);
    EXPECT_EQ(r.stats.started, 1000u * 239u);  // every chunk once per peer: nothing sent twice
  }
}

// A 2% delta of a 1 GiB snapshot cut into 4 MiB chunks is 256 deltas of 84 KB, each sent in
// 0.67 ms at 1 Gbit/s: less than the 1 ms a transfer takes to start. One transfer per slot took
// 2.58 x the delta's transfer time to reach 100 peers; small transfers sharing a slot overlap
// their starts. Nodes send one transfer at a time, as the network transport does.
TEST(BroadcastSimTest, SmallDeltasOverlapTheirStarts) {
  BroadcastScenario s;
  s.peers = 100;
  s.chunks = 256;
  s.chunk_bytes = 83886;
  s.origin_bps = 125e6;
  s.latency_s = 0.001;
  s.serial_uploads = true;
  const double t1 = s.chunks * static_cast<double>(s.chunk_bytes) / s.origin_bps;
  const BroadcastResult r = Simulate(s);
  std::printf("  100 peers, 84 KB deltas: %.3f x T1\n", r.last_completion / t1);
  EXPECT_LE(r.last_completion, 1.2 * t1);
  EXPECT_EQ(r.stats.started, 100u * 256u);
}

// Serial uploads: two sends started together finish one after the other (the first at full
// rate), where processor sharing finishes both at the end.
TEST(LinkSimulatorTest, SerialUploadsSendOneTransferAtATime) {
  for (bool serial : {false, true}) {
    SimulatedClock clock;
    LinkSimulator sim(&clock, {1000, 1000}, /*latency_s=*/0.5);
    sim.SetSerialUploads(serial);
    sim.SetUploadBps(kOrigin, 1000);
    sim.SetUploadBps(1, 1000);
    sim.SetUploadBps(2, 1000);
    std::vector<double> done;
    for (int c = 0; c < 2; ++c) {
      sim.Start(Transfer{static_cast<uint64_t>(c + 1), kOrigin, c + 1, c},
                [&](const Transfer&, TransferOutcome) { done.push_back(clock.Now()); });
    }
    ASSERT_TRUE(sim.Run(100).ok());
    ASSERT_EQ(done.size(), 2u);
    EXPECT_NEAR(done[0], serial ? 1.5 : 2.5, 1e-9) << "serial " << serial;
    EXPECT_NEAR(done[1], 2.5, 1e-9) << "serial " << serial;
  }
}

// Real bytes end to end: signed manifest, per-node ChunkStores, hashes checked on delivery,
// one peer corrupting what it relays, then a delta version.
TEST(BroadcastSimTest, EndToEndRealChunksVerifyAssembleAndDelta) {
  constexpr uint32_t kChunk = 4096;
  constexpr int kPeers = 5;
  constexpr NodeId kLiar = 2;
  std::string v1(16 * kChunk, '\0');
  for (size_t i = 0; i < v1.size(); ++i) v1[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::string v2 = v1;
  v2[3 * kChunk + 10] ^= 1;
  v2[9 * kChunk] ^= 1;

  SigningKey key = SigningKey::Generate().value();
  std::vector<std::unique_ptr<ChunkStore>> stores;
  for (int n = 0; n <= kPeers; ++n) stores.push_back(std::make_unique<ChunkStore>(2));

  for (auto [version, blob] : {std::pair<uint64_t, std::string>{1, v1}, {2, v2}}) {
    Manifest origin_manifest = BuildManifest(version, blob, kChunk).value();
    std::string envelope = SignManifest(origin_manifest, key).value();
    ASSERT_TRUE(stores[0]->AddVersion(origin_manifest).ok());
    for (size_t i = 0; i < origin_manifest.num_chunks(); ++i) {
      ASSERT_TRUE(stores[0]->PutChunk(version, i, std::string(ChunkView(origin_manifest, blob, i))).ok());
    }
    SimulatedClock clock;
    RelayPlanner planner(RelayOptions{}, origin_manifest.num_chunks(), 1e6);
    LinkSimulator sim(&clock, ChunkSizes(origin_manifest), 0.0);
    RelaySession session(&planner, &sim, &clock, ChunkSizes(origin_manifest));
    int corrupt_deliveries = 0;
    sim.SetDeliver([&](const Transfer& t) {
      std::string bytes = *stores[t.from]->GetChunk(version, t.chunk).value();
      if (t.from == kLiar) bytes[0] ^= 0x5a;
      Status st = stores[t.to]->PutChunk(version, t.chunk, bytes);
      corrupt_deliveries += st.code() == StatusCode::kDataLoss;
      return st.ok() ? TransferOutcome::kVerified : TransferOutcome::kCorrupt;
    });
    for (NodeId n = 0; n <= kPeers; ++n) sim.SetUploadBps(n, 1e6);
    for (NodeId n = 1; n <= kPeers; ++n) {
      Result<Manifest> m = VerifySignedManifest(envelope, key.public_key());
      ASSERT_TRUE(m.ok()) << m.status().message();
      ASSERT_TRUE(stores[n]->AddVersion(m.value()).ok());
      EXPECT_EQ(session.AddPeer(1e6, stores[n]->HeldMask(version).value()), n);
    }
    ASSERT_TRUE(sim.Run(1e6).ok());
    EXPECT_TRUE(session.AllComplete());
    for (NodeId n = 1; n <= kPeers; ++n) {
      EXPECT_EQ(Sha256Hex(stores[n]->Assemble(version).value()), origin_manifest.file_sha256) << "node " << n;
    }
    if (version == 1) {
      EXPECT_EQ(corrupt_deliveries, 2);  // two receivers report it: then the liar is banned
      EXPECT_TRUE(planner.IsBanned(kLiar));
      EXPECT_EQ(session.bytes_moved(), uint64_t{kPeers} * 16 * kChunk);
    } else {
      // Delta: only the two changed chunks move, to each of the 5 peers.
      EXPECT_EQ(session.bytes_moved(), uint64_t{kPeers} * 2 * kChunk);
      EXPECT_EQ(planner.stats().started, uint64_t{kPeers} * 2 + corrupt_deliveries);
    }
  }
}

}  // namespace
}  // namespace echelon::broadcast
