#include "echelon/net/grpc_actors.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "echelon/broadcast/ed25519.h"
#include "echelon/common/fs.h"
#include "echelon/learn/hosted_episodes.h"
#include "echelon/learn/trajectory_intake.h"
#include "echelon/net/address.h"
#include "echelon/net/broadcast_origin.h"
#include "echelon/net/learner_server.h"

namespace echelon::net {

GrpcActors::GrpcActors(GrpcActorsOptions options, const Clock* clock) : options_(std::move(options)), clock_(clock) {}

GrpcActors::~GrpcActors() = default;

Status GrpcActors::Start(learn::TrajectoryIntake* intake, const std::string& run_spec_json, std::ostream& progress) {
  LearnerServerOptions so;
  so.listen = options_.listen;
  so.tokens = options_.tokens;
  so.token_file = options_.token_file;
  so.tls_cert_file = options_.tls_cert_file;
  so.tls_key_file = options_.tls_key_file;
  so.heartbeat_seconds = options_.heartbeat_seconds;
  so.evict_after_seconds = options_.evict_after_seconds;
  so.run_spec_json = run_spec_json;
  so.split_layers = options_.split_layers;
  if (options_.broadcast) {
    ECHELON_ASSIGN_OR_RETURN(broadcast::SigningKey key, broadcast::SigningKey::Generate());
    BroadcastOriginOptions bo;
    bo.listen = options_.broadcast_listen.empty() ? HostOf(options_.listen) + ":0" : options_.broadcast_listen;
    bo.advertise_hosts = options_.broadcast_peer_hosts;
    // Each registration gets a broadcast token of its own (never a worker token, which other
    // peers could see), revoked with the registration: a worker evicted, quarantined or
    // removed from the token file leaves the broadcast at the next EvictSilent.
    bo.admission = !options_.tokens.off();
    if (bo.admission) so.broadcast_admit = [this](const std::string& actor_id, const std::string& worker) {
        return origin_->Admit(actor_id, worker);
      };
    if (!options_.tls_cert_file.empty()) {
      // Over TLS like the learner's own service, with the same certificate (same host).
      ECHELON_ASSIGN_OR_RETURN(bo.tls.cert_pem, ReadFile(options_.tls_cert_file));
      ECHELON_ASSIGN_OR_RETURN(bo.tls.key_pem, ReadFile(options_.tls_key_file));
    }
    bo.log_each_version = false;  // one snapshot per update: the metrics carry broadcast_s
    bo.delta_from_previous = true;  // actors hold the previous snapshot: they pull the deltas
    origin_ = std::make_unique<BroadcastOrigin>(bo, std::move(key), clock_);
    ECHELON_RETURN_IF_ERROR(origin_->Start().WithContext("snapshot broadcast origin"));
    so.broadcast_port = origin_->port();
    so.broadcast_key_pem = origin_->public_key().ToPem();
  }
  // Multi-turn groups are played here, so an environment's hidden state stays on the learner.
  episodes_ = std::make_unique<learn::HostedEpisodes>(
      intake, learn::HostedEpisodesOptions{options_.play_turn_timeout_seconds});
  so.episodes = episodes_.get();
  server_ = std::make_unique<LearnerServer>(so, intake, intake, intake, clock_);
  intake->SetStrikeHook(
      [server = server_.get()](const std::string& actor, const std::string& reason) { server->Strike(actor, reason); });
  ECHELON_RETURN_IF_ERROR(server_->Start());
  progress << "learner serving actors on port " << server_->port() << std::endl;
  if (origin_) progress << "snapshot broadcast origin on port " << origin_->port() << std::endl;
  if (options_.on_listening) options_.on_listening(server_->port());
  return Status::Ok();
}

int64_t GrpcActors::live_actors() const { return server_ ? static_cast<int64_t>(server_->Actors().size()) : 0; }

int64_t GrpcActors::broadcast_peers() const { return origin_ ? static_cast<int64_t>(origin_->live_peers()) : 0; }

std::vector<std::string> GrpcActors::EvictSilent() {
  if (!server_) return {};
  if (options_.reload_tokens != nullptr && options_.reload_tokens->exchange(false)) {
    Status st = server_->ReloadTokens();
    if (!st.ok()) spdlog::error("SIGHUP: {}; the tokens loaded before stay in force", st.message());
  }
  std::vector<std::string> gone = server_->EvictSilent();
  if (origin_)
    for (const std::string& id : gone) origin_->Revoke(id);
  return gone;
}

std::map<std::string, int64_t> GrpcActors::Refusals() const {
  return server_ ? server_->Counters() : std::map<std::string, int64_t>();
}

Status GrpcActors::Broadcast(int64_t version, const std::string& safetensors_bytes) {
  if (!origin_) return Status::Ok();
  ECHELON_RETURN_IF_ERROR(origin_->Publish(static_cast<uint64_t>(version), safetensors_bytes).status());
  broadcasting_.emplace_back(version, safetensors_bytes.size());
  if (broadcasting_.size() > 8) broadcasting_.pop_front();
  return Status::Ok();
}

std::optional<learn::BroadcastCompletion> GrpcActors::TakeCompletedBroadcast() {
  std::optional<learn::BroadcastCompletion> newest;
  if (!origin_) return newest;
  for (auto it = broadcasting_.begin(); it != broadcasting_.end();) {
    const uint64_t version = static_cast<uint64_t>(it->first);
    if (!origin_->IsComplete(version)) {
      ++it;
      continue;
    }
    const BroadcastTally tally = Tally(origin_->Report(version));
    if (tally.last_completed_s) {
      newest = learn::BroadcastCompletion{it->first, *tally.last_completed_s,
                                          static_cast<int64_t>(origin_->BytesPulled(version)) / tally.held,
                                          static_cast<int64_t>(it->second)};
    }
    it = broadcasting_.erase(it);
  }
  return newest;
}

void GrpcActors::StopWork() {
  if (server_) server_->SetDone();
}

void GrpcActors::Finish() {
  // Actors poll at least every heartbeat: let every one of them hear that the run is over.
  if (server_) server_->WaitUntilActorsTold(3 * options_.heartbeat_seconds + 1.0);
  // Then stop serving: the intake the handlers call into goes away with the run.
  if (server_) server_->Shutdown();
  episodes_.reset();  // ends the groups still being played: they call into the intake
  if (origin_) origin_->Shutdown();
}

}  // namespace echelon::net
