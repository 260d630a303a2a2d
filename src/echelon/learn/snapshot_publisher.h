// SnapshotPublisher: turns the learner's weights into a policy snapshot (the safetensors
// bytes of the state dict, tagged with its version) and publishes it two ways at once: to the
// intake, where actors pull the newest one directly, and to the transport's broadcast
// (peer-assisted, for remote actors). A failed broadcast is logged and left to the direct
// pulls: it costs the actors time, not the run. In a LoRA run only the adapters travel each
// version; the whole model (the base) is made once and fetched once by each actor.
//
//   SnapshotPublisher publisher(&intake, &transport);
//   ECHELON_RETURN_IF_ERROR(publisher.Publish(learner.model(), learner.version()));
//
// Thread contract: owned by the learner thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "echelon/common/status.h"
#include "echelon/contract/transport.h"
#include "echelon/learn/actor_transport.h"
#include "echelon/learn/trajectory_intake.h"
#include "echelon/model/qwen3.h"

namespace echelon::learn {

// The weights of `model` as a snapshot of `version`. With LoRA adapters (config().lora) the
// snapshot holds the adapters alone over `base` (made by MakeBase of the same run), which it
// carries along.
Result<contract::Snapshot> MakeSnapshot(const model::Qwen3Model& model, int64_t version,
                                        std::shared_ptr<const std::string> base = nullptr);
// The whole model's bytes as a LoRA run's base.
Result<std::shared_ptr<const std::string>> MakeBase(const model::Qwen3Model& model);

class SnapshotPublisher {
 public:
  SnapshotPublisher(TrajectoryIntake* intake, ActorTransport* transport) : intake_(intake), transport_(transport) {}
  Status Publish(const model::Qwen3Model& model, int64_t version);
  // A snapshot made elsewhere (the weights of sharded ranks, gathered into its bytes).
  Status Publish(contract::Snapshot snapshot);

 private:
  TrajectoryIntake* intake_;
  ActorTransport* transport_;
  // A LoRA run's base, made at the first publication: only the adapters train afterwards.
  std::shared_ptr<const std::string> base_;
};

}  // namespace echelon::learn
