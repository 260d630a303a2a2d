#include "echelon/learn/snapshot_publisher.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "echelon/model/safetensors.h"

namespace echelon::learn {

Result<contract::Snapshot> MakeSnapshot(const model::Qwen3Model& model, int64_t version) {
  ECHELON_ASSIGN_OR_RETURN(std::string bytes, model::SerializeSafetensors(model->StorageStateDict()));
  return contract::Snapshot{version, std::make_shared<const std::string>(std::move(bytes))};
}

Status SnapshotPublisher::Publish(const model::Qwen3Model& model, int64_t version) {
  ECHELON_ASSIGN_OR_RETURN(contract::Snapshot snap, MakeSnapshot(model, version));
  Status st = transport_->Broadcast(version, *snap.weights);
  if (!st.ok())
    spdlog::warn("broadcast of snapshot v{} failed: {}; actors will pull it directly", version, st.message());
  intake_->Publish(std::move(snap));
  return Status::Ok();
}

}  // namespace echelon::learn
