// Pipeline stages over gRPC (proto/echelon/v1/pipeline.proto): StageService serves a
// model::StageServer to the stage before it; RemoteStage is that server as the stage before sees
// it (a model::NextStage).
//
//   model::StageServer stage(model_of_layers_12_to_23, &next_remote_or_null);
//   auto service = StageService::Start(&stage, config, {.listen = "0.0.0.0:50061", .token = t});
//   auto remote = RemoteStage::Connect("10.0.0.2:50061", t, /*timeout_seconds=*/60);
//   PipelineGenerate(first_stage_model, **remote, prompts, params, /*micro_batches=*/4);
//
// With a TLS identity (net/tls.h: a stage's self-signed certificate, which the learner hands to
// the stage before) the stage serves over TLS and RemoteStage, given that certificate, trusts
// exactly it: activations and the worker's token never cross the network in clear text.
//
// Every message is read as a caller with a valid token could write it: a lane's prompts, limits
// and slots are bounded by the model's positions and kMaxLaneRows (they size the KV cache), a
// tensor's dtype, shape and byte count must agree and its width be the model's hidden size, and
// a stage holds at most max_lanes lanes. A bad message fails its call with one line and leaves
// every other lane as it was.
//
// Thread contract: both are safe for concurrent calls (lanes in parallel).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "echelon/common/status.h"
#include "echelon/model/model_config.h"
#include "echelon/model/pipeline.h"
#include "echelon/net/tls.h"

namespace grpc {
class Server;
class Channel;
}  // namespace grpc

namespace echelon::net {

// Rows one lane may decode (a lane's cache holds slots x positions per layer).
inline constexpr int64_t kMaxLaneRows = 4096;

struct StageServiceOptions {
  std::string listen = "0.0.0.0:0";  // port 0: any free port (see port())
  std::string token;                 // the bearer token callers present; empty: none
  TlsIdentity tls;                   // non-empty: serve over TLS with this certificate
  int64_t max_lanes = 64;
};

class StageService {
 public:
  // `config` bounds what callers may send; a stage that learns it later (from its learner)
  // starts with nullopt, refuses calls as not ready, and calls SetConfig.
  static Result<std::unique_ptr<StageService>> Start(model::StageServer* stage, std::optional<model::ModelConfig> config,
                                                     const StageServiceOptions& options);
  void SetConfig(const model::ModelConfig& config);
  ~StageService();
  int port() const { return port_; }

 private:
  class Impl;
  StageService() = default;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

class RemoteStage : public model::NextStage {
 public:
  // Each call fails after timeout_seconds (a Forward waits for every later stage). A non-empty
  // `cert_pem` is the stage's TLS certificate: the channel is TLS and trusts only it.
  static Result<std::unique_ptr<RemoteStage>> Connect(const std::string& address, const std::string& token,
                                                      double timeout_seconds, const std::string& cert_pem = "");
  ~RemoteStage() override;

  Status Open(uint64_t lane, const model::LaneSpec& spec) override;
  Result<at::Tensor> Forward(uint64_t lane, model::StageMessage m) override;
  Status Close(uint64_t lane, model::StageMessage m) override;

 private:
  class Stub;
  RemoteStage() = default;
  std::string address_;
  std::string token_;
  double timeout_seconds_ = 60;
  std::unique_ptr<Stub> stub_;
};

// The next stage where a pipeline's learner says it is now (a stage that died and came back
// elsewhere, a spare that took over): lanes opened after Retarget go to the new address, and
// every lane stays with the stage it was opened on until it closes.
class StageRoute : public model::NextStage {
 public:
  StageRoute(std::string token, double timeout_seconds);
  // Points new lanes at `address` (serving with `cert_pem`, "" without TLS); a no-op when it is
  // the current one.
  Status Retarget(const std::string& address, const std::string& cert_pem = "");
  std::string address() const;

  Status Open(uint64_t lane, const model::LaneSpec& spec) override;
  Result<at::Tensor> Forward(uint64_t lane, model::StageMessage m) override;
  Status Close(uint64_t lane, model::StageMessage m) override;

 private:
  std::shared_ptr<RemoteStage> Of(uint64_t lane) const;

  const std::string token_;
  const double timeout_seconds_;
  mutable std::mutex mu_;  // guards everything below
  std::string address_;
  std::string cert_pem_;
  std::shared_ptr<RemoteStage> current_;
  std::map<uint64_t, std::shared_ptr<RemoteStage>> lanes_;
};

}  // namespace echelon::net
