// ActorTransport: how the actors of a run reach the learning plane. The learner run
// (learn/learner_run.h) talks to its actors only through this interface and the
// TrajectoryIntake, so the same loop drives actors that are threads of this process
// (cli/thread_actors.h) and actors that are processes anywhere behind gRPC, with snapshots
// going out by peer-assisted broadcast (net/grpc_actors.h).
//
// Lifecycle: Start once (the intake is ready, the run spec known), then the loop calls
// EvictSilent / live_actors / Refusals between updates and Broadcast for every published
// snapshot, then StopWork and Finish once each.
//
// Thread contract: called from the learner thread only; implementations run their own
// threads (actor threads, gRPC) and are safe for that.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::learn {

class TrajectoryIntake;

// A snapshot version that every peer of the broadcast held, how long it took from publishing
// to the last peer, the payload bytes a peer pulled for it (the mean over the peers that
// completed it), and its size whole.
struct BroadcastCompletion {
  int64_t version = 0;
  double seconds = 0;
  int64_t bytes = 0;
  int64_t snapshot_bytes = 0;
};

class ActorTransport {
 public:
  virtual ~ActorTransport() = default;
  // Starts serving actors through `intake`. `run_spec_json` (contract/run_spec.h) is what an
  // actor is told about the run; progress lines (addresses, ports) go to `progress`.
  virtual Status Start(TrajectoryIntake* intake, const std::string& run_spec_json, std::ostream& progress) = 0;
  // Actors connected now.
  virtual int64_t live_actors() const = 0;
  // Actors gone silent since the last call, by id; the caller re-issues their groups.
  virtual std::vector<std::string> EvictSilent() = 0;
  // Calls refused before they reached the intake (authentication, protocol), and
  // evictions, by reason.
  virtual std::map<std::string, int64_t> Refusals() const = 0;
  // Sends a published snapshot out beyond the intake (the peer-assisted broadcast). A failure
  // is not fatal: actors then pull the snapshot from the intake directly.
  virtual Status Broadcast(int64_t version, const std::string& safetensors_bytes) = 0;
  // The newest version whose broadcast completed since the last call; nullopt: none.
  virtual std::optional<BroadcastCompletion> TakeCompletedBroadcast() = 0;
  // The loop is over: no work is handed out any more; in-process actors stop.
  virtual void StopWork() = 0;
  // The run is over (final checkpoint and metrics written): actors are told, connections close.
  // After Finish nothing calls into the intake any more (it may be destroyed).
  virtual void Finish() = 0;
};

}  // namespace echelon::learn
