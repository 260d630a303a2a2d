#include "echelon/learn/snapshot_publisher.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "echelon/common/sha256.h"
#include "echelon/model/safetensors.h"
#include "echelon/model/snapshot_weights.h"

namespace echelon::learn {

Result<std::shared_ptr<const std::string>> MakeBase(const model::Qwen3Model& model) {
  ECHELON_ASSIGN_OR_RETURN(std::string bytes, model::SerializeSafetensors(model->StorageStateDict()));
  return std::make_shared<const std::string>(std::move(bytes));
}

Result<contract::Snapshot> MakeSnapshot(const model::Qwen3Model& model, int64_t version,
                                        std::shared_ptr<const std::string> base) {
  if (!model->config().lora.on()) {
    ECHELON_ASSIGN_OR_RETURN(std::string bytes, model::SerializeSafetensors(model->StorageStateDict()));
    return contract::Snapshot{version, std::make_shared<const std::string>(std::move(bytes)), nullptr};
  }
  if (!base) return FailedPrecondition("a LoRA snapshot needs its base");
  ECHELON_ASSIGN_OR_RETURN(std::string bytes, model::SerializeAdapter(model, Sha256Hex(*base)));
  return contract::Snapshot{version, std::make_shared<const std::string>(std::move(bytes)), std::move(base)};
}

Status SnapshotPublisher::Publish(const model::Qwen3Model& model, int64_t version) {
  if (model->config().lora.on() && !base_) {
    ECHELON_ASSIGN_OR_RETURN(base_, MakeBase(model));
    spdlog::info("LoRA base: {:.1f} MB, fetched once by each actor; snapshots carry the adapters alone",
                 static_cast<double>(base_->size()) / 1e6);
  }
  ECHELON_ASSIGN_OR_RETURN(contract::Snapshot snap, MakeSnapshot(model, version, base_));
  return Publish(std::move(snap));
}

Status SnapshotPublisher::Publish(contract::Snapshot snap) {
  const int64_t version = snap.version;
  // The intake first: an actor the broadcast reaches at once may submit a group of this version
  // before Broadcast returns, and the intake must not refuse it as one never published.
  const std::shared_ptr<const std::string> weights = snap.weights;
  intake_->Publish(std::move(snap));
  Status st = transport_->Broadcast(version, *weights);
  if (!st.ok())
    spdlog::warn("broadcast of snapshot v{} failed: {}; actors will pull it directly", version, st.message());
  return Status::Ok();
}

}  // namespace echelon::learn
