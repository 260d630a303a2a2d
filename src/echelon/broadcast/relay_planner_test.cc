#include "echelon/broadcast/relay_planner.h"

#include <algorithm>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace echelon::broadcast {
namespace {

// Completes every in-flight transfer at once (verified): one synchronous round.
std::vector<Transfer> Round(RelayPlanner& p, std::vector<Transfer>* log = nullptr) {
  std::vector<Transfer> started = p.NextTransfers();
  for (const Transfer& t : started) p.OnTransferDone(t.id, TransferOutcome::kVerified);
  if (log) log->insert(log->end(), started.begin(), started.end());
  return started;
}

int RoundsToComplete(RelayPlanner& p, std::vector<Transfer>* log = nullptr) {
  int rounds = 0;
  while (!p.AllComplete() && rounds < 1000) {
    EXPECT_FALSE(Round(p, log).empty()) << "planner stalled";
    ++rounds;
  }
  return rounds;
}

TEST(RelayPlannerTest, OriginSendsEveryChunkOnceBeforeAnyDuplicate) {
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/8, 1e6);
  for (int i = 0; i < 4; ++i) p.AddPeer(1e6);
  std::vector<Transfer> log;
  RoundsToComplete(p, &log);
  std::vector<int> origin_chunks;
  for (const Transfer& t : log) {
    if (t.from == kOrigin) origin_chunks.push_back(t.chunk);
  }
  ASSERT_GE(origin_chunks.size(), 8u);
  EXPECT_EQ(std::set<int>(origin_chunks.begin(), origin_chunks.begin() + 8).size(), 8u);
  EXPECT_EQ(log.size(), 4u * 8u);  // every peer receives every chunk exactly once
  EXPECT_EQ(p.stats().verified, 32u);
}

TEST(RelayPlannerTest, OneChunkDoublesItsHoldersEveryRound) {
  for (int n : {1, 2, 3, 7, 8, 15, 100}) {
    RelayPlanner p(RelayOptions{}, 1, 1e6);
    for (int i = 0; i < n; ++i) p.AddPeer(1e6);
    int expect = 0;
    while ((1 << expect) < n + 1) ++expect;  // ceil(log2(n + 1))
    EXPECT_EQ(RoundsToComplete(p), expect) << "n=" << n;
  }
}

TEST(RelayPlannerTest, RelayDeathReturnsItsTransfersAndReceiversResume) {
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/6, 1e6);
  for (int i = 0; i < 3; ++i) p.AddPeer(1e6);  // nodes 1, 2, 3
  Round(p);
  Round(p);  // node 1 now holds chunks and relays them
  std::vector<Transfer> in_flight = p.NextTransfers();
  int from_or_to_1 = 0;
  for (const Transfer& t : in_flight) from_or_to_1 += (t.from == 1 || t.to == 1);
  ASSERT_GT(from_or_to_1, 0);
  const int held2 = p.HeldCount(2), held3 = p.HeldCount(3);
  std::vector<Transfer> cancelled = p.RemovePeer(1);
  EXPECT_EQ(static_cast<int>(cancelled.size()), from_or_to_1);
  EXPECT_EQ(p.stats().cancelled, static_cast<uint64_t>(from_or_to_1));
  EXPECT_EQ(p.HeldCount(2), held2);  // verified chunks survive the relay's death
  EXPECT_EQ(p.HeldCount(3), held3);
  for (const Transfer& t : in_flight) p.OnTransferDone(t.id, TransferOutcome::kVerified);  // late reports
  std::vector<Transfer> log;
  RoundsToComplete(p, &log);
  EXPECT_TRUE(p.IsComplete(2) && p.IsComplete(3));
  EXPECT_FALSE(p.IsAlive(1));
  for (const Transfer& t : log) EXPECT_TRUE(t.from != 1 && t.to != 1);
  // Each survivor received each chunk exactly once in total: it resumed, not restarted.
  EXPECT_EQ(p.stats().verified, static_cast<uint64_t>(6 + 6 + p.HeldCount(1)));
}

TEST(RelayPlannerTest, OneCorruptReportKeepsThatReceiverFromTheSenderWithoutBanningIt) {
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/2, 1e6);
  p.AddPeer(1e6);
  p.AddPeer(1e6);
  std::vector<Transfer> first = p.NextTransfers();
  ASSERT_EQ(first.size(), 1u);  // origin -> node 1
  p.OnTransferDone(first[0].id, TransferOutcome::kVerified);
  std::vector<Transfer> second = p.NextTransfers();
  bool corrupted = false;
  for (const Transfer& t : second) {
    bool bad = t.from == 1;
    corrupted = corrupted || bad;
    p.OnTransferDone(t.id, bad ? TransferOutcome::kCorrupt : TransferOutcome::kVerified);
  }
  ASSERT_TRUE(corrupted);
  // Node 2 may be the liar: node 1 is not banned, but never sends to node 2 again.
  EXPECT_FALSE(p.IsBanned(1));
  EXPECT_EQ(p.strikes(1), 1);
  EXPECT_EQ(p.stats().corrupt, 1u);
  std::vector<Transfer> log;
  RoundsToComplete(p, &log);
  EXPECT_TRUE(p.AllComplete());
  for (const Transfer& t : log) EXPECT_FALSE(t.from == 1 && t.to == 2);
}

// A receiver that reports every fetch from node 1 as failed (unreachable from there, or a
// liar) stops fetching from node 1 and costs node 1 nothing else: it keeps uploading to the
// others, with no strike (the origin, for its part, declares a sender dead only on failures
// reported by two receivers: net/broadcast_protocol.h).
TEST(RelayPlannerTest, AFailedFetchKeepsThatReceiverFromTheSenderOnly) {
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/8, 1e6);
  for (int i = 0; i < 4; ++i) p.AddPeer(1e6);
  std::vector<Transfer> log;
  int failed = 0;
  for (int round = 0; round < 100 && !p.AllComplete(); ++round) {
    for (const Transfer& t : p.NextTransfers()) {
      log.push_back(t);
      const bool lie = t.from == 1 && t.to == 2;
      failed += lie;
      p.OnTransferDone(t.id, lie ? TransferOutcome::kFailed : TransferOutcome::kVerified);
    }
  }
  EXPECT_TRUE(p.AllComplete());
  EXPECT_LE(failed, 1);  // node 2 asked node 1 once at most
  EXPECT_EQ(p.strikes(1), 0);
  EXPECT_FALSE(p.IsBanned(1));
  int from1 = 0;
  for (const Transfer& t : log) from1 += t.from == 1 && t.to != 2;
  EXPECT_GT(from1, 0);  // node 1 still relays to the others
}

TEST(RelayPlannerTest, TwoReceiversReportingASenderBanItAndTheOriginIsNeverBlamed) {
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/1, 1e6);
  for (int i = 0; i < 5; ++i) p.AddPeer(1e6);
  std::vector<Transfer> log;
  int reports = 0;
  for (int round = 0; round < 20 && !p.AllComplete(); ++round) {
    for (const Transfer& t : p.NextTransfers()) {
      log.push_back(t);
      // Node 1 corrupts everything it relays; node 3 also claims the origin's chunk is corrupt.
      const bool bad = t.from == 1 || (t.from == kOrigin && t.to == 3 && reports++ == 0);
      p.OnTransferDone(t.id, bad ? TransferOutcome::kCorrupt : TransferOutcome::kVerified);
    }
  }
  EXPECT_TRUE(p.AllComplete());
  EXPECT_TRUE(p.IsBanned(1));
  EXPECT_EQ(p.strikes(1), 2);
  EXPECT_FALSE(p.IsBanned(kOrigin));
  EXPECT_EQ(p.strikes(kOrigin), 0);
}

TEST(RelayPlannerTest, UnreachablePeersReceiveEverythingAndNeverUpload) {
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/6, 1e6);
  std::set<NodeId> nat;
  for (int i = 0; i < 6; ++i) {
    const bool reachable = i % 2 == 0;
    // The unreachable ones claim the fastest uplinks: they must still never be asked to send.
    NodeId n = p.AddPeer(reachable ? 1e6 : 1e9, {}, reachable);
    if (!reachable) nat.insert(n);
  }
  std::vector<Transfer> log;
  RoundsToComplete(p, &log);
  EXPECT_TRUE(p.AllComplete());
  EXPECT_EQ(log.size(), 6u * 6u);
  for (const Transfer& t : log) EXPECT_EQ(nat.count(t.from), 0u) << "node " << t.from << " cannot be dialled";
  for (NodeId n : nat) EXPECT_FALSE(p.IsReachable(n));
  // Only NAT peers besides the origin: the origin sends everything.
  RelayPlanner q(RelayOptions{}, 3, 1e6);
  for (int i = 0; i < 3; ++i) q.AddPeer(1e6, {}, false);
  std::vector<Transfer> q_log;
  RoundsToComplete(q, &q_log);
  EXPECT_EQ(q_log.size(), 9u);
  for (const Transfer& t : q_log) EXPECT_EQ(t.from, kOrigin);
}

TEST(RelayPlannerTest, DeltaPeersOnlyReceiveMissingChunks) {
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/5, 1e6);
  std::vector<bool> held = {true, true, false, true, false};
  for (int i = 0; i < 3; ++i) p.AddPeer(1e6, held);
  std::vector<Transfer> log;
  RoundsToComplete(p, &log);
  EXPECT_EQ(log.size(), 3u * 2u);
  for (const Transfer& t : log) EXPECT_TRUE(t.chunk == 2 || t.chunk == 4);
  RelayPlanner none(RelayOptions{}, 5, 1e6);
  none.AddPeer(1e6, std::vector<bool>(5, true));
  EXPECT_TRUE(none.AllComplete());
  EXPECT_TRUE(none.NextTransfers().empty());
}

TEST(RelayPlannerTest, LateJoinerIsServedMostlyByPeers) {
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/8, 1e6);
  for (int i = 0; i < 4; ++i) p.AddPeer(1e6);
  RoundsToComplete(p);
  const uint64_t origin_before = p.stats().origin_sends;
  NodeId late = p.AddPeer(1e6);
  std::vector<Transfer> log;
  RoundsToComplete(p, &log);
  EXPECT_TRUE(p.IsComplete(late));
  EXPECT_EQ(log.size(), 8u);
  EXPECT_LE(p.stats().origin_sends - origin_before, 2u);  // peers relay the rest
}

TEST(RelayPlannerTest, StarModeOnlyTheOriginUploads) {
  RelayOptions opts;
  opts.mode = RelayMode::kStar;
  RelayPlanner p(opts, /*num_chunks=*/4, 1e6);
  for (int i = 0; i < 3; ++i) p.AddPeer(1e6);
  std::vector<Transfer> log;
  EXPECT_EQ(RoundsToComplete(p, &log), 4);  // one chunk per peer per round, all in parallel
  EXPECT_EQ(log.size(), 12u);
  for (const Transfer& t : log) EXPECT_EQ(t.from, kOrigin);
}

// Mixed links: a slow peer's upload goes to receivers no faster than itself, so a fast receiver's
// last chunk is never the one a slow sender holds; the origin still feeds the fastest relay.
TEST(RelayPlannerTest, SlowPeerSendsToSlowReceiversFirst) {
  // The origin uploads slowest here, so the slow peer picks first (faster uploaders do).
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/2, 0.5e6);
  const NodeId slow = p.AddPeer(1e6, {true, false});
  const NodeId fast = p.AddPeer(10e6, {false, false});
  const NodeId slow2 = p.AddPeer(1e6, {false, false});
  std::vector<Transfer> first = p.NextTransfers();
  ASSERT_EQ(first.size(), 2u);  // the origin and the slow peer; the others hold nothing
  EXPECT_EQ(first[0].from, slow);
  EXPECT_EQ(first[0].to, slow2);
  EXPECT_EQ(first[1].from, kOrigin);
  EXPECT_EQ(first[1].to, fast);
}

// A node whose chunk takes longer than multi_slot_max_chunk_seconds sends one chunk at a time.
TEST(RelayPlannerTest, SlowNodeUploadsOneChunkAtATime) {
  RelayOptions o;
  o.upload_slots = 2;
  auto origin_sends = [&](double origin_bps) {
    RelayPlanner p(o, /*num_chunks=*/8, origin_bps, /*mean_chunk_bytes=*/4e6);
    p.AddPeer(100e6);
    p.AddPeer(100e6);
    return p.NextTransfers().size();
  };
  EXPECT_EQ(origin_sends(100e6), 2u);  // 0.04 s per chunk: both slots
  EXPECT_EQ(origin_sends(5e6), 2u);    // 0.8 s
  EXPECT_EQ(origin_sends(1e6), 1u);    // 4 s: one at a time
}

// Until its first transfer is measured a peer sends one at a time whatever it declared: were it
// slow, a second chunk would wait a whole slow chunk time in its queue, holding that receiver's
// copy.
TEST(RelayPlannerTest, UnmeasuredPeerUploadsOneChunkAtATime) {
  RelayOptions o;
  o.upload_slots = 2;
  RelayPlanner p(o, /*num_chunks=*/8, /*origin_upload_bps=*/1.0, /*mean_chunk_bytes=*/4e6);  // origin: 1 slot
  const NodeId seeded = p.AddPeer(100e6, std::vector<bool>(8, true));
  for (int i = 0; i < 4; ++i) p.AddPeer(100e6);
  auto sends_from = [&](const std::vector<Transfer>& ts, NodeId n) {
    return std::count_if(ts.begin(), ts.end(), [&](const Transfer& t) { return t.from == n; });
  };
  EXPECT_EQ(sends_from(p.NextTransfers(), seeded), 1);
  p.UpdateBandwidth(seeded, 100e6);
  EXPECT_EQ(sends_from(p.NextTransfers(), seeded), 1);  // the second slot
  EXPECT_EQ(p.in_flight(), 3u);                         // the origin's, and two from the peer
}

// A node keeps ceil(start latency x rate / mean transfer) + 1 transfers in flight over its
// slots (at least one per slot, at most max_transfers_per_slot each), each receiver's inbound
// place one of its own slots' worth: deltas much smaller than a chunk share a slot, whole chunks
// on a 100 Mbit/s link do not.
TEST(RelayPlannerTest, SlotsCoverTheStartLatency) {
  RelayOptions o;
  o.upload_slots = 2;
  o.max_inbound = 1;
  o.start_latency_seconds = 0.05;
  auto origin_sends = [&](double bps, double mean_chunk_bytes, int peers) {
    RelayPlanner p(o, /*num_chunks=*/64, bps, mean_chunk_bytes);
    for (int i = 0; i < peers; ++i) p.AddPeer(bps);
    return std::make_pair(p.NextTransfers().size(), p.transfers_per_slot(kOrigin));
  };
  EXPECT_EQ(origin_sends(12.5e6, 1 << 20, 8), std::make_pair(size_t{2}, 1));   // 0.6 + 1 -> 2 in flight
  EXPECT_EQ(origin_sends(12.5e6, 4 << 20, 8), std::make_pair(size_t{2}, 1));   // bigger ones
  EXPECT_EQ(origin_sends(125e6, 1 << 20, 8), std::make_pair(size_t{8}, 4));    // 6 + 1 -> 2 slots x 4
  EXPECT_EQ(origin_sends(12.5e6, 200e3, 8), std::make_pair(size_t{6}, 3));     // 4 + 1 -> 2 slots x 3
  EXPECT_EQ(origin_sends(12.5e6, 20e3, 8), std::make_pair(size_t{16}, 8));     // capped at 8
  // One receiver takes max_inbound (1) x 8 at once, not 16.
  EXPECT_EQ(origin_sends(12.5e6, 20e3, 1), std::make_pair(size_t{8}, 8));
}

// A node's queue is sized by its declared rate or a faster measured one: a rate measured while
// its queue was too short includes the idle starts, and must not keep the queue short.
TEST(RelayPlannerTest, SlowMeasurementsDoNotShortenTheQueue) {
  RelayOptions o;
  o.upload_slots = 1;
  o.start_latency_seconds = 0.02;
  RelayPlanner p(o, /*num_chunks=*/64, 125e6, 1 << 20);
  for (int i = 0; i < 8; ++i) p.AddPeer(125e6);
  EXPECT_EQ(p.transfers_per_slot(kOrigin), 4);  // 2.4 + 1
  p.UpdateBandwidth(kOrigin, 30e6);
  EXPECT_EQ(p.transfers_per_slot(kOrigin), 4);
  p.UpdateBandwidth(kOrigin, 1000e6);  // 0.7 x 30e6 + 0.3 x 1e9 = 321e6: 6.1 + 1
  EXPECT_EQ(p.transfers_per_slot(kOrigin), 8);
}

// A declared rate is a first estimate: one measurement replaces it (a claim of 100 Gbit/s
// does not decay over thousands of chunks), later ones are averaged.
TEST(RelayPlannerTest, FirstMeasurementReplacesTheDeclaredRate) {
  RelayOptions o;
  RelayPlanner p(o, /*num_chunks=*/4, 1e6);
  const NodeId n = p.AddPeer(12.5e9);
  p.UpdateBandwidth(n, 1e6);
  EXPECT_DOUBLE_EQ(p.bandwidth(n), 1e6);
  p.UpdateBandwidth(n, 2e6);
  EXPECT_DOUBLE_EQ(p.bandwidth(n), (1 - o.bandwidth_ewma_alpha) * 1e6 + o.bandwidth_ewma_alpha * 2e6);
}

TEST(RelayPlannerTest, MeasuredFastUploaderReceivesRareChunksFirst) {
  RelayPlanner p(RelayOptions{}, /*num_chunks=*/4, 1e6);
  p.AddPeer(1e6);
  NodeId fast = p.AddPeer(1e6);
  for (int i = 0; i < 10; ++i) p.UpdateBandwidth(fast, 10e6);
  EXPECT_GT(p.bandwidth(fast), 9e6);
  std::vector<Transfer> first = p.NextTransfers();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].to, fast);
}

}  // namespace
}  // namespace echelon::broadcast
