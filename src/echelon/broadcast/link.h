// The mechanism side of the broadcast: a Link moves one chunk from one node to another and
// reports how it ended. The RelayPlanner (policy) never moves bytes; it only emits Transfers.
// The discrete-event LinkSimulator and the network transport both implement Link, so the
// same plan runs over simulated links and real sockets.
//
//   class TcpLink : public Link {
//     void Start(const Transfer& t, DoneFn done) override {
//       // ask node t.from to send chunk t.chunk of version v to node t.to; when the
//       // receiver has verified it (ChunkStore::PutChunk) call done(t, kVerified),
//       // on a hash mismatch done(t, kCorrupt), on a broken connection done(t, kFailed).
//     }
//   };
//
// Thread contract: Start may be called from any thread and must not call `done` before it
// returns (no re-entry); `done` is called exactly once per transfer, from any thread,
// except for transfers touching a node the caller has declared dead, which may be dropped
// silently.
#pragma once

#include <cstdint>
#include <functional>

namespace echelon::broadcast {

using NodeId = int;                 // 0 is the origin; peers are 1, 2, ... in join order
inline constexpr NodeId kOrigin = 0;

struct Transfer {
  uint64_t id = 0;  // unique per planner
  NodeId from = 0;
  NodeId to = 0;
  int chunk = 0;    // chunk index within the version being broadcast
};

enum class TransferOutcome {
  kVerified,  // the receiver holds the chunk and its SHA-256 matched
  kCorrupt,   // bytes arrived but failed verification: the sender is penalised
  kFailed,    // the transfer broke (connection loss, timeout): nobody is blamed
};

class Link {
 public:
  using DoneFn = std::function<void(const Transfer&, TransferOutcome)>;
  virtual ~Link() = default;
  virtual void Start(const Transfer& t, DoneFn done) = 0;
};

}  // namespace echelon::broadcast
