// SnapshotPublisher: turns the learner's weights into a policy snapshot (the safetensors
// bytes of the state dict, tagged with its version) and publishes it two ways at once: to the
// intake, where actors pull the newest one directly, and to the transport's broadcast
// (peer-assisted, for remote actors). A failed broadcast is logged and left to the direct
// pulls: it costs the actors time, not the run.
//
//   SnapshotPublisher publisher(&intake, &transport);
//   ECHELON_RETURN_IF_ERROR(publisher.Publish(learner.model(), learner.version()));
//
// Thread contract: owned by the learner thread.
#pragma once

#include <cstdint>

#include "echelon/common/status.h"
#include "echelon/contract/transport.h"
#include "echelon/learn/actor_transport.h"
#include "echelon/learn/trajectory_intake.h"
#include "echelon/model/qwen3.h"

namespace echelon::learn {

// The weights of `model` as a snapshot of `version`.
Result<contract::Snapshot> MakeSnapshot(const model::Qwen3Model& model, int64_t version);

class SnapshotPublisher {
 public:
  SnapshotPublisher(TrajectoryIntake* intake, ActorTransport* transport) : intake_(intake), transport_(transport) {}
  Status Publish(const model::Qwen3Model& model, int64_t version);

 private:
  TrajectoryIntake* intake_;
  ActorTransport* transport_;
};

}  // namespace echelon::learn
