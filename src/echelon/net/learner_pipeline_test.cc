// Pipelined workers at the learner: stages registering, the pipeline formed with its layers
// split, work only for a formed pipeline's head, a dead stage re-issuing the head's groups, a
// spare taking over, stages' snapshots holding only their layers, hostile roles refused.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "echelon/model/safetensors.h"
#include "echelon/model/testing.h"
#include "echelon/net/auth.h"
#include "echelon/net/learner_server.h"
#include "echelon/net/protocol.h"
#include "echelon/net/tls.h"
#include "echelon/plan/pipeline_split.h"
#include "echelon/v1/learner.grpc.pb.h"

namespace echelon::net {
namespace {

const std::string kToken = "pipeline-token-0123456789";

class Hub : public contract::WorkSource, public contract::TrajectorySink, public contract::SnapshotSource {
 public:
  std::optional<contract::Assignment> Acquire(const std::string& actor) override {
    std::lock_guard<std::mutex> lock(mu);
    contract::Assignment a;
    a.work.group_id = next++;
    a.work.lease_id = 100 + a.work.group_id;
    a.prompt.id = a.work.group_id;
    a.prompt.text = "1+2=";
    a.prompt.reference = "3";
    a.group_size = 2;
    holders.push_back(actor);
    return a;
  }
  contract::SubmitOutcome Submit(contract::GroupRollout) override { return {true, ""}; }
  contract::Snapshot Latest() override {
    std::lock_guard<std::mutex> lock(mu);
    return snapshot;
  }
  std::mutex mu;
  uint64_t next = 0;
  std::vector<std::string> holders;
  contract::Snapshot snapshot;
};

struct Learner {
  // With `tls`, the service runs over TLS with that identity (its files under TempDir()).
  explicit Learner(TokenTable tokens = TokenTable::Shared(kToken), const TlsIdentity& tls = {}) {
    whole = model::PeakedModel(model::FourLayerConfig());
    LearnerServerOptions o;
    o.tokens = std::move(tokens);
    o.run_spec_json = nlohmann::json{{"model", whole->config().ToJson()}}.dump();
    o.evict_after_seconds = 3.0;
    o.split_layers = plan::SplitPipelineLayers;  // as cli/launch.cc wires it
    hub.snapshot = {7, std::make_shared<const std::string>(model::SerializeSafetensors(whole->StateDict()).value())};
    if (!tls.empty()) {
      o.tls_cert_file = ::testing::TempDir() + "/pipeline-learner.crt";
      o.tls_key_file = ::testing::TempDir() + "/pipeline-learner.key";
      std::ofstream(o.tls_cert_file) << tls.cert_pem;
      std::ofstream(o.tls_key_file) << tls.key_pem;
    }
    server = std::make_unique<LearnerServer>(o, &hub, &hub, &hub, &clock);
    EXPECT_TRUE(server->Start().ok());
    grpc::ChannelArguments args;
    if (!tls.empty()) SetPeerTargetName(&args);
    stub = v1::Learner::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(server->port()),
        tls.empty() ? grpc::InsecureChannelCredentials() : ChannelCredentials(tls.cert_pem), args));
  }
  // Registers stage `stage` of `stages` of pipeline `name`; returns the actor id or the error.
  grpc::Status Join(int stage, int stages, std::string* id, const std::string& address = "",
                    const std::string& name = "box", const std::string& token = kToken,
                    const std::string& cert_pem = "") {
    grpc::ClientContext ctx;
    AttachToken(ctx, token);
    v1::RegisterRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_actor_name("stage");
    v1::PipelineRole* r = req.mutable_pipeline();
    r->set_pipeline(name);
    r->set_stage(stage);
    r->set_stages(stages);
    r->set_address(address.empty() && stage > 0 ? "10.0.0." + std::to_string(stage) + ":7801" : address);
    r->set_cert_pem(cert_pem);
    v1::RegisterReply reply;
    grpc::Status st = stub->Register(&ctx, req, &reply);
    *id = reply.actor_id();
    return st;
  }
  v1::HeartbeatReply Beat(const std::string& id) {
    grpc::ClientContext ctx;
    AttachToken(ctx, kToken);
    v1::HeartbeatRequest req;
    req.set_actor_id(id);
    v1::HeartbeatReply reply;
    EXPECT_TRUE(stub->Heartbeat(&ctx, req, &reply).ok());
    return reply;
  }
  grpc::Status Acquire(const std::string& id, v1::AcquireReply* reply) {
    grpc::ClientContext ctx;
    AttachToken(ctx, kToken);
    v1::AcquireRequest req;
    req.set_actor_id(id);
    return stub->Acquire(&ctx, req, reply);
  }
  // The ranged snapshot's tensor names, or the error.
  grpc::Status Fetch(const std::string& id, int64_t first, int64_t last, std::set<std::string>* names) {
    grpc::ClientContext ctx;
    AttachToken(ctx, kToken);
    v1::SnapshotRequest req;
    req.set_actor_id(id);
    req.set_ranged(true);
    req.set_first_layer(first);
    req.set_last_layer(last);
    auto reader = stub->GetSnapshot(&ctx, req);
    v1::SnapshotPiece piece;
    std::string bytes;
    while (reader->Read(&piece)) bytes += piece.data();
    grpc::Status st = reader->Finish();
    if (!st.ok()) return st;
    Result<model::SafetensorsFile> f = model::ParseSafetensors(bytes, "ranged");
    EXPECT_TRUE(f.ok()) << f.status().message();
    if (!f.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "unparsable");
    for (const auto& [name, t] : f->tensors) {
      names->insert(name);
      EXPECT_TRUE(at::equal(t, whole->StateDict().at(name))) << name;
    }
    return st;
  }

  model::Qwen3Model whole{nullptr};
  Hub hub;
  SimulatedClock clock;
  std::unique_ptr<LearnerServer> server;
  std::unique_ptr<v1::Learner::Stub> stub;
};

TEST(LearnerPipelineTest, StagesFormAPipelineWithEveryLayerOnceAndOnlyItsHeadTakesWork) {
  Learner l;
  std::string head, s1, s2;
  ASSERT_TRUE(l.Join(0, 3, &head).ok());
  ASSERT_TRUE(l.Join(2, 3, &s2).ok());
  v1::AcquireReply work;
  ASSERT_TRUE(l.Acquire(head, &work).ok());
  EXPECT_FALSE(work.has_work()) << "a pipeline missing a stage takes no work";
  EXPECT_FALSE(l.Beat(head).pipeline().complete());
  ASSERT_TRUE(l.Join(1, 3, &s1).ok());
  const v1::HeartbeatReply beat = l.Beat(s1);
  ASSERT_TRUE(beat.pipeline().complete());
  ASSERT_EQ(beat.pipeline().members_size(), 3);
  int64_t at = 0;
  for (const v1::PipelineMember& m : beat.pipeline().members()) {
    EXPECT_EQ(m.first_layer(), at);
    EXPECT_GT(m.last_layer(), m.first_layer());
    at = m.last_layer();
  }
  EXPECT_EQ(at, 4);
  EXPECT_EQ(beat.pipeline().members(1).address(), "10.0.0.1:7801");
  EXPECT_EQ(beat.pipeline().members(2).address(), "10.0.0.2:7801");
  ASSERT_TRUE(l.Acquire(head, &work).ok());
  EXPECT_TRUE(work.has_work());
  EXPECT_EQ(l.Acquire(s1, &work).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(l.hub.holders, std::vector<std::string>{head});
}

TEST(LearnerPipelineTest, DeclaredMemoryAndSpeedShapeTheSplit) {
  Learner l;
  // Stage 1 is three times slower per layer: the head takes more of the four layers.
  std::string head, s1;
  grpc::ClientContext ctx;
  AttachToken(ctx, kToken);
  ASSERT_TRUE(l.Join(0, 2, &head).ok());
  v1::RegisterRequest req;
  req.set_protocol_version(kProtocolVersion);
  v1::PipelineRole* r = req.mutable_pipeline();
  r->set_pipeline("box");
  r->set_stage(1);
  r->set_stages(2);
  r->set_address("10.0.0.1:7801");
  r->set_seconds_per_layer(3.0);
  v1::RegisterReply reply;
  ASSERT_TRUE(l.stub->Register(&ctx, req, &reply).ok());
  const v1::PipelineView v = l.Beat(head).pipeline();
  ASSERT_TRUE(v.complete());
  EXPECT_EQ(v.members(0).last_layer(), 3);
  EXPECT_EQ(v.members(1).first_layer(), 3);
}

TEST(LearnerPipelineTest, ADeadStageReissuesTheHeadsGroupsAndASpareTakesOver) {
  Learner l;
  std::string head, s1, spare;
  ASSERT_TRUE(l.Join(0, 2, &head).ok());
  ASSERT_TRUE(l.Join(1, 2, &s1).ok());
  ASSERT_TRUE(l.Join(1, 2, &spare, "10.0.0.9:7801").ok());
  const v1::PipelineView before = l.Beat(head).pipeline();
  ASSERT_TRUE(before.complete());
  EXPECT_EQ(before.members(1).address(), "10.0.0.1:7801") << "the first registered keeps the stage";
  EXPECT_FALSE(l.Beat(spare).pipeline().complete()) << "a spare is not a member";
  v1::AcquireReply work;
  ASSERT_TRUE(l.Acquire(head, &work).ok() && work.has_work());
  // Stage 1 goes silent; the head and the spare keep beating.
  l.clock.Advance(2.0);
  l.Beat(head);
  l.Beat(spare);
  l.clock.Advance(2.0);
  std::vector<std::string> evicted = l.server->EvictSilent();
  std::sort(evicted.begin(), evicted.end());
  std::vector<std::string> want = {head, s1};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(evicted, want) << "the dead stage, and the head whose groups were in flight through it";
  const v1::PipelineView after = l.Beat(head).pipeline();
  ASSERT_TRUE(after.complete());
  EXPECT_GT(after.epoch(), before.epoch());
  EXPECT_EQ(after.members(1).address(), "10.0.0.9:7801");
  EXPECT_EQ(l.server->Counters()["pipeline_reissued"], 1);
  ASSERT_TRUE(l.Acquire(head, &work).ok());
  EXPECT_TRUE(work.has_work()) << "the head stays registered and takes work again";
  EXPECT_TRUE(l.server->EvictSilent().empty());
}

TEST(LearnerPipelineTest, AStageFetchesOnlyItsLayersTensors) {
  Learner l;
  std::string head, s1;
  ASSERT_TRUE(l.Join(0, 2, &head).ok());
  ASSERT_TRUE(l.Join(1, 2, &s1).ok());
  std::set<std::string> later, first;
  ASSERT_TRUE(l.Fetch(s1, 2, 4, &later).ok());
  for (const std::string& name : later) EXPECT_TRUE(name.rfind("model.layers.2.", 0) == 0 || name.rfind("model.layers.3.", 0) == 0) << name;
  ASSERT_TRUE(l.Fetch(head, 0, 2, &first).ok());
  EXPECT_TRUE(first.count("model.embed_tokens.weight"));
  EXPECT_TRUE(first.count("model.norm.weight"));
  EXPECT_FALSE(first.count("model.layers.2.mlp.up_proj.weight"));
  EXPECT_EQ(first.size() + later.size(), l.whole->StateDict().size()) << "together, every tensor once";
  std::set<std::string> none;
  EXPECT_EQ(l.Fetch(s1, 3, 9, &none).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(l.Fetch(s1, 2, 2, &none).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(l.Fetch(s1, -1, 2, &none).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Any actor could ask for a ranged snapshot of any (first, last): every pair was cached (a
// 28-layer model: 406 ranges, ~145 x its layer weights). Only a formed pipeline's stage may
// ask, and only for the layers the pipeline gave it.
TEST(LearnerPipelineTest, ARangedSnapshotIsOnlyForAFormedStageAndItsOwnLayers) {
  Learner l;
  std::string plain, head, s1;
  {
    grpc::ClientContext ctx;
    AttachToken(ctx, kToken);
    v1::RegisterRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_actor_name("plain");
    v1::RegisterReply reply;
    ASSERT_TRUE(l.stub->Register(&ctx, req, &reply).ok());
    plain = reply.actor_id();
  }
  std::set<std::string> names;
  EXPECT_EQ(l.Fetch(plain, 0, 2, &names).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(l.Join(0, 2, &head).ok());
  EXPECT_EQ(l.Fetch(head, 0, 2, &names).error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "not formed yet";
  ASSERT_TRUE(l.Join(1, 2, &s1).ok());
  EXPECT_EQ(l.Fetch(head, 0, 1, &names).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(l.Fetch(s1, 0, 2, &names).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "the head's layers";
  EXPECT_TRUE(l.Fetch(head, 0, 2, &names).ok());
  EXPECT_EQ(l.server->Counters()["ranged_refused"], 4);
}

TEST(LearnerPipelineTest, HostileRolesAreRefusedWithTheirReason) {
  Learner l(TokenTable::Load([] {
              const std::string path = ::testing::TempDir() + "/pipeline-tokens";
              std::ofstream(path) << "alice " << kToken << "\nbob bob-token-0123456789abcdef\n";
              return path;
            }()).value());
  std::string id;
  EXPECT_EQ(l.Join(0, 1, &id).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(l.Join(3, 3, &id).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(l.Join(-1, 3, &id).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(l.Join(0, kMaxPipelineStages + 1, &id).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(l.Join(1, 3, &id, "no-port").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(l.Join(1, 3, &id, "host:12ab").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(l.Join(0, 3, &id, "", std::string(65, 'p')).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(l.Join(0, 3, &id).ok());
  EXPECT_EQ(l.Join(1, 2, &id).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "stages disagree";
  EXPECT_EQ(l.Join(1, 3, &id, "", "box", "bob-token-0123456789abcdef").error_code(),
            grpc::StatusCode::PERMISSION_DENIED)
      << "another worker cannot join (and read the activations of) alice's pipeline";
  EXPECT_GE(l.server->Counters()["bad_pipeline_role"], 8);
  EXPECT_EQ(l.server->Counters()["foreign_pipeline"], 1);
}

// Under TLS the stage before dials a later stage with the worker's token and sends it the
// activations; a stage that registered without a certificate used to be dialled in plaintext.
TEST(LearnerPipelineTest, UnderTlsAStageWithoutACertificateIsRefused) {
  const TlsIdentity learner = SelfSignedIdentity().value();
  Learner l(TokenTable::Shared(kToken), learner);
  std::string id;
  ASSERT_TRUE(l.Join(0, 2, &id).ok());  // the head serves nothing: no certificate needed
  const grpc::Status bare = l.Join(1, 2, &id);
  EXPECT_EQ(bare.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(bare.error_message().find("must present the certificate"), std::string::npos) << bare.error_message();
  EXPECT_TRUE(l.Join(1, 2, &id, "", "box", kToken, SelfSignedIdentity().value().cert_pem).ok());
}

}  // namespace
}  // namespace echelon::net
