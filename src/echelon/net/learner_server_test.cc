// LearnerServer and RemoteLearner over real loopback gRPC, against a scripted hub.
#include "echelon/net/learner_server.h"

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "echelon/common/fs.h"
#include "echelon/common/sha256.h"
#include "echelon/model/safetensors.h"
#include "echelon/model/snapshot_weights.h"
#include "echelon/net/auth.h"
#include "echelon/net/protocol.h"
#include "echelon/net/remote_learner.h"
#include "echelon/sched/dispatcher.h"
#include "echelon/v1/learner.grpc.pb.h"

namespace echelon::net {
namespace {

// A hub that hands out numbered groups and records submissions.
class ScriptedHub : public contract::WorkSource, public contract::TrajectorySink, public contract::SnapshotSource {
 public:
  std::optional<contract::Assignment> Acquire(const std::string& actor) override {
    std::lock_guard<std::mutex> lock(mu);
    contract::Assignment a;
    a.work.group_id = next++;
    a.work.lease_id = 100 + a.work.group_id;
    a.prompt.id = a.work.group_id;
    a.prompt.text = "1+2=";
    a.prompt.reference = "3";
    a.prompt.system = "Answer with a number.";
    a.group_size = 2;
    a.scored_by_learner = true;
    holders.push_back(actor);
    return a;
  }
  // Lease 999 stands for a forged group (a swapped prompt, say).
  contract::SubmitOutcome Submit(contract::GroupRollout g) override {
    std::lock_guard<std::mutex> lock(mu);
    submitted.push_back(g);
    if (g.lease_id == 999) return {false, "prompt_mismatch", true};
    return {g.lease_id == 100 + g.group_id, g.lease_id == 100 + g.group_id ? "" : "not_lease_holder"};
  }
  contract::Snapshot Latest() override {
    std::lock_guard<std::mutex> lock(mu);
    return snapshot;
  }
  void Progress(const std::string& actor, const sched::WorkItem& work, int64_t tokens) override {
    std::lock_guard<std::mutex> lock(mu);
    progress.push_back({actor, work.group_id, work.lease_id, tokens});
  }
  // A resumed group: sample 0 continues from two tokens (v3, v4), sample 1 from none.
  std::optional<contract::Assignment> AcquireWith(const std::string& actor, const contract::WorkRequest& request) override {
    std::optional<contract::Assignment> a = Acquire(actor);
    {
      std::lock_guard<std::mutex> lock(mu);
      requests.push_back(request);
    }
    if (!request.continues_prefixes) return a;
    a->report_prefix = true;
    data::Turn t;
    t.tokens = {6, 2};
    t.logprobs = {-0.5f, -0.25f};
    t.versions = {3, 4};
    a->prefix = {t, data::Turn()};
    return a;
  }
  bool ReportPrefix(const std::string& actor, const sched::WorkItem& work,
                    const std::vector<contract::PrefixPart>& parts) override {
    std::lock_guard<std::mutex> lock(mu);
    prefix_reports.push_back({actor, work.lease_id, parts});
    return true;
  }
  struct Report {
    std::string actor;
    uint64_t group, lease;
    int64_t tokens;
  };
  struct PrefixReport {
    std::string actor;
    uint64_t lease;
    std::vector<contract::PrefixPart> parts;
  };
  std::vector<PrefixReport> prefix_reports;
  std::vector<contract::WorkRequest> requests;
  std::mutex mu;
  std::vector<Report> progress;
  uint64_t next = 0;
  std::vector<std::string> holders;
  std::vector<contract::GroupRollout> submitted;
  contract::Snapshot snapshot;
};

struct Fixture {
  explicit Fixture(const std::string& token) : Fixture(TokenTable::Shared(token), "") {}
  Fixture(TokenTable tokens, const std::string& token_file) {
    LearnerServerOptions o;
    o.tokens = std::move(tokens);
    o.token_file = token_file;
    o.run_spec_json = "{\"spec\": 1}";
    o.evict_after_seconds = 3.0;
    server = std::make_unique<LearnerServer>(o, &hub, &hub, &hub, &clock);
    EXPECT_TRUE(server->Start().ok());
    address = "127.0.0.1:" + std::to_string(server->port());
    stub = v1::Learner::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  grpc::Status Register(const std::string& token, uint32_t version, v1::RegisterReply* reply,
                        const std::string& name = "t") {
    grpc::ClientContext ctx;
    AttachToken(ctx, token);
    v1::RegisterRequest req;
    req.set_protocol_version(version);
    req.set_actor_name(name);
    return stub->Register(&ctx, req, reply);
  }
  grpc::Status Acquire(const std::string& token, const std::string& actor_id, v1::AcquireReply* reply) {
    grpc::ClientContext ctx;
    AttachToken(ctx, token);
    v1::AcquireRequest req;
    req.set_actor_id(actor_id);
    return stub->Acquire(&ctx, req, reply);
  }
  grpc::Status Submit(const std::string& token, const std::string& actor_id, uint64_t lease, v1::SubmitReply* reply) {
    grpc::ClientContext ctx;
    AttachToken(ctx, token);
    v1::SubmitRequest req;
    req.set_actor_id(actor_id);
    req.set_lease_id(lease);
    return stub->Submit(&ctx, req, reply);
  }
  // An actor's options for this learner.
  RemoteLearnerOptions Remote(const std::string& token) const {
    RemoteLearnerOptions o;
    o.address = address;
    o.token = token;
    o.name = "rl";
    return o;
  }
  ScriptedHub hub;
  SimulatedClock clock;
  std::unique_ptr<LearnerServer> server;
  std::string address;
  std::unique_ptr<v1::Learner::Stub> stub;
};

TEST(LearnerServerTest, RefusesMissingOrWrongTokenAndKeepsServing) {
  Fixture f("right");
  v1::RegisterReply reply;
  EXPECT_EQ(f.Register("", kProtocolVersion, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(f.Register("wrong", kProtocolVersion, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(f.server->Counters().at("unauthenticated"), 2);
  ASSERT_TRUE(f.Register("right", kProtocolVersion, &reply).ok());
  EXPECT_EQ(reply.run_spec_json(), "{\"spec\": 1}");
  EXPECT_EQ(f.server->Actors().size(), 1u);
}

constexpr char kAliceToken[] = "alice-0123456789abcdef";
constexpr char kBobToken[] = "bob-0123456789abcdef00";

std::string WriteTokens(const std::string& text) {
  const std::string path = ::testing::TempDir() + "/tokens-" + std::to_string(::getpid());
  std::ofstream(path) << text;
  return path;
}

TEST(TokenTableTest, LoadsOneSharedTokenOrNamedWorkersAndNamesTheBadLine) {
  const std::string path = WriteTokens("# workers\nalice " + std::string(kAliceToken) + "\n\nbob " + kBobToken + "  # home\n");
  Result<TokenTable> t = TokenTable::Load(path);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->per_actor());
  const std::vector<std::string> names = t->names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), (std::set<std::string>{"alice", "bob"}));
  ASSERT_TRUE(TokenTable::Load(WriteTokens(std::string(kAliceToken) + "\n")).ok());
  EXPECT_FALSE(TokenTable::Load(WriteTokens(std::string(kAliceToken) + "\n"))->per_actor());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "no token"},
      {"alice short\n", ":1: token shorter than 16 characters"},
      {"alice " + std::string(kAliceToken) + "\nalice " + kBobToken + "\n", ":2: worker \"alice\" listed twice"},
      {"alice " + std::string(kAliceToken) + "\nbob " + kAliceToken + "\n", ":2: token listed twice"},
      {"a/b " + std::string(kAliceToken) + "\n", ":1: worker name \"a/b\""},
      {"a b c\n", ":1: expected \"NAME TOKEN\""},
      {std::string(kAliceToken) + "\nbob " + kBobToken + "\n", "a bare token is only allowed"},
  };
  for (const auto& [text, message] : bad) {
    Result<TokenTable> r = TokenTable::Load(WriteTokens(text));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  }
}

TEST(LearnerServerTest, ActorIdsAreUnguessableAndBoundToTheirWorkersToken) {
  Fixture f(TokenTable::Load(WriteTokens("alice " + std::string(kAliceToken) + "\nbob " + kBobToken + "\n")).value(), "");
  v1::RegisterReply a, b;
  // A worker is named by its token, whatever name it asks for.
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &a, "bob").ok());
  ASSERT_TRUE(f.Register(kBobToken, kProtocolVersion, &b, "bob").ok());
  EXPECT_EQ(a.actor_id().substr(0, 6), "alice#");
  EXPECT_EQ(a.actor_id().size(), 6u + 32u);  // 128 random bits
  EXPECT_NE(a.broadcast_token(), kAliceToken);
  // Bob cannot act as Alice's actor, even knowing its id; Alice can.
  v1::AcquireReply reply;
  EXPECT_EQ(f.Acquire(kBobToken, a.actor_id(), &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(f.server->Counters().at("foreign_actor"), 1);
  EXPECT_TRUE(f.hub.holders.empty());
  ASSERT_TRUE(f.Acquire(kAliceToken, a.actor_id(), &reply).ok());
  EXPECT_EQ(f.hub.holders, std::vector<std::string>{a.actor_id()});
}

TEST(LearnerServerTest, AWorkerWhoseSubmissionsAreForgedIsQuarantinedAndItsActorsEvicted) {
  Fixture f(TokenTable::Load(WriteTokens("alice " + std::string(kAliceToken) + "\nbob " + kBobToken + "\n")).value(), "");
  v1::RegisterReply a1, a2, b;
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &a1).ok());
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &a2).ok());
  ASSERT_TRUE(f.Register(kBobToken, kProtocolVersion, &b).ok());
  v1::SubmitReply reply;
  for (int i = 0; i < sched::kQuarantineAfterForged; ++i) {
    ASSERT_TRUE(f.Submit(kAliceToken, a1.actor_id(), 999, &reply).ok());
    EXPECT_EQ(reply.reason(), "prompt_mismatch");
  }
  EXPECT_EQ(f.server->Quarantined(), std::set<std::string>{"alice"});
  std::vector<std::string> evicted = f.server->EvictSilent();
  std::sort(evicted.begin(), evicted.end());
  std::vector<std::string> want = {a1.actor_id(), a2.actor_id()};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(evicted, want);
  // Alice can neither call with her old actors nor register again; Bob is untouched.
  v1::AcquireReply acquired;
  EXPECT_EQ(f.Acquire(kAliceToken, a2.actor_id(), &acquired).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::RegisterReply again;
  grpc::Status st = f.Register(kAliceToken, kProtocolVersion, &again);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("quarantined"), std::string::npos);
  EXPECT_TRUE(f.Acquire(kBobToken, b.actor_id(), &acquired).ok());
}

// With a shared token quarantine was keyed by the caller's address: a liar's forgeries
// quarantined every honest worker behind the same address (a NAT, one host), and the run
// stalled. It is keyed by the name at its address now: the liar is quarantined under its
// name, its neighbour keeps working. (A liar that renames itself escapes: a shared token is
// for a fleet one trusts, and the learner says so.)
// Strikes the intake deals outside a submission's answer (a forged prefix report, the part of
// a resumed group a worker drew) count towards quarantine like forged submissions; a strike for
// an actor no longer registered changes nothing.
TEST(LearnerServerTest, StrikesForForgedPrefixesQuarantineTheWorker) {
  Fixture f(TokenTable::Load(WriteTokens("alice " + std::string(kAliceToken) + "\nbob " + kBobToken + "\n")).value(), "");
  v1::RegisterReply a, b;
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &a).ok());
  ASSERT_TRUE(f.Register(kBobToken, kProtocolVersion, &b).ok());
  f.server->Strike("nobody#0", "prefix_logprob_mismatch");
  for (int i = 0; i < sched::kQuarantineAfterForged; ++i) f.server->Strike(a.actor_id(), "prefix_sample_not_drawn");
  EXPECT_EQ(f.server->Quarantined(), std::set<std::string>{"alice"});
}

TEST(LearnerServerTest, SharedTokenQuarantineSparesANeighbourBehindTheSameAddress) {
  Fixture f{std::string(kAliceToken)};
  v1::RegisterReply liar, honest;
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &liar, "mallory").ok());
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &honest, "honest").ok());
  v1::SubmitReply reply;
  for (int i = 0; i < sched::kQuarantineAfterForged; ++i)
    ASSERT_TRUE(f.Submit(kAliceToken, liar.actor_id(), 999, &reply).ok());
  EXPECT_EQ(f.server->Quarantined(), std::set<std::string>{"mallory at 127.0.0.1"});
  v1::AcquireReply acquired;
  EXPECT_TRUE(f.Acquire(kAliceToken, honest.actor_id(), &acquired).ok());
  v1::RegisterReply again;
  grpc::Status st = f.Register(kAliceToken, kProtocolVersion, &again, "mallory");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("mallory at 127.0.0.1"), std::string::npos) << st.error_message();
  v1::RegisterReply neighbour;
  EXPECT_TRUE(f.Register(kAliceToken, kProtocolVersion, &neighbour, "honest-2").ok());
}

// A shared token's actor named itself "honest-a#x": its actor id began "honest-a#x#...", which
// sched::WorkerName cut at the first '#', so it used up honest-a's lease cap. A chosen name is
// made a worker name first.
TEST(LearnerServerTest, AChosenNameWithAHashIsNotAnotherWorkersName) {
  Fixture f{std::string(kAliceToken)};
  v1::RegisterReply r;
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &r, "honest-a#x").ok());
  EXPECT_EQ(sched::WorkerName(r.actor_id()), "honest-a_x");
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &r, "../\n\x01").ok());
  EXPECT_EQ(sched::WorkerName(r.actor_id()), "..___");
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &r, "").ok());
  EXPECT_EQ(sched::WorkerName(r.actor_id()), "actor");
}

// Registrations were unbounded: one token could fill the learner's tables. Past
// kMaxRegistrationsPerWorker, a worker's least recently seen registration goes; another
// worker's are untouched.
TEST(LearnerServerTest, AWorkerPastItsRegistrationCapLosesItsOldestRegistration) {
  Fixture f(TokenTable::Load(WriteTokens("alice " + std::string(kAliceToken) + "\nbob " + kBobToken + "\n")).value(), "");
  v1::RegisterReply bob;
  ASSERT_TRUE(f.Register(kBobToken, kProtocolVersion, &bob).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < kMaxRegistrationsPerWorker; ++i) {
    f.clock.Advance(1.0);
    v1::RegisterReply r;
    ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &r).ok());
    ids.push_back(r.actor_id());
  }
  v1::AcquireReply acquired;
  f.clock.Advance(1.0);
  ASSERT_TRUE(f.Acquire(kAliceToken, ids[0], &acquired).ok());  // the first is now seen most recently
  v1::RegisterReply past;
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &past).ok());
  EXPECT_TRUE(f.Acquire(kAliceToken, ids[0], &acquired).ok());
  EXPECT_EQ(f.Acquire(kAliceToken, ids[1], &acquired).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(f.Acquire(kAliceToken, past.actor_id(), &acquired).ok());
  EXPECT_TRUE(f.Acquire(kBobToken, bob.actor_id(), &acquired).ok());
  const std::vector<std::string> evicted = f.server->EvictSilent();  // its leases are re-issued
  EXPECT_NE(std::find(evicted.begin(), evicted.end(), ids[1]), evicted.end());
}

// A snapshot stream whose reader stopped reading held its version's bytes and a server thread
// for as long as the reader liked. The learner cuts a stream nothing could be written to for
// kSnapshotStallSeconds.
TEST(LearnerServerTest, ASnapshotStreamThatStopsReadingIsCut) {
  Fixture f("tok");
  f.hub.snapshot = contract::Snapshot{3, std::make_shared<const std::string>(64 << 20, 'w'), nullptr};
  v1::RegisterReply r;
  ASSERT_TRUE(f.Register("tok", kProtocolVersion, &r).ok());
  grpc::ClientContext ctx;
  AttachToken(ctx, "tok");
  v1::SnapshotRequest req;
  req.set_actor_id(r.actor_id());
  auto reader = f.stub->GetSnapshot(&ctx, req);
  v1::SnapshotPiece piece;
  ASSERT_TRUE(reader->Read(&piece));  // then reads no more: the server's writes block
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(f.server->Counters()["snapshot_stream_cut"], 0);
  (void)f.server->EvictSilent();
  EXPECT_EQ(f.server->Counters()["snapshot_stream_cut"], 0) << "within the stall time";
  f.clock.Advance(kSnapshotStallSeconds + 1);
  (void)f.server->EvictSilent();
  EXPECT_EQ(f.server->Counters()["snapshot_stream_cut"], 1);
  int64_t pieces = 1;
  while (reader->Read(&piece)) ++pieces;  // what was in flight, then the end
  EXPECT_LT(pieces, 64) << "the whole snapshot went out";
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// `echelon tokens`: per-worker tokens, owner-only, numbered on from what was issued; the
// learner's file loads as per-worker tokens and each worker's own file holds its token.
TEST(TokenTableTest, IssuedWorkerTokensLoadAndGoOnFromTheLastName) {
  const std::string dir = ::testing::TempDir() + "/issued-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  ASSERT_EQ(IssueWorkerTokens(dir, 2, "gpu").value(), (std::vector<std::string>{"gpu-0", "gpu-1"}));
  ASSERT_EQ(IssueWorkerTokens(dir, 1, "gpu").value(), (std::vector<std::string>{"gpu-2"}));
  Result<TokenTable> t = TokenTable::Load(dir + "/tokens");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->per_actor());
  std::vector<std::string> names = t->names();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"gpu-0", "gpu-1", "gpu-2"}));
  const auto owner_only = std::filesystem::perms::owner_read | std::filesystem::perms::owner_write;
  for (const std::string f : {"/tokens", "/gpu-0.token", "/gpu-2.token"})
    EXPECT_EQ(std::filesystem::status(dir + f).permissions() & std::filesystem::perms::all, owner_only) << f;
  const std::string own = LoadToken(dir + "/gpu-1.token").value();
  EXPECT_EQ(own.size(), 64u);
  EXPECT_NE(ReadFile(dir + "/tokens").value().find("gpu-1 " + own + "\n"), std::string::npos);
  EXPECT_NE(IssueWorkerTokens(dir, 1, "a b").status().message().find("--prefix"), std::string::npos);
  std::ofstream(dir + "/tokens") << kAliceToken << "\n";
  EXPECT_NE(IssueWorkerTokens(dir, 1, "gpu").status().message().find("one shared token"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(LearnerServerTest, ReloadingTheTokenFileRevokesARemovedWorker) {
  const std::string path = WriteTokens("alice " + std::string(kAliceToken) + "\nbob " + kBobToken + "\n");
  Fixture f(TokenTable::Load(path).value(), path);
  v1::RegisterReply a, b;
  ASSERT_TRUE(f.Register(kAliceToken, kProtocolVersion, &a).ok());
  ASSERT_TRUE(f.Register(kBobToken, kProtocolVersion, &b).ok());
  // A malformed file changes nothing.
  std::ofstream(path) << "bob short\n";
  EXPECT_FALSE(f.server->ReloadTokens().ok());
  v1::AcquireReply reply;
  EXPECT_TRUE(f.Acquire(kAliceToken, a.actor_id(), &reply).ok());
  std::ofstream(path) << "bob " << kBobToken << "\n";
  ASSERT_TRUE(f.server->ReloadTokens().ok());
  EXPECT_EQ(f.server->EvictSilent(), std::vector<std::string>{a.actor_id()});
  EXPECT_EQ(f.Acquire(kAliceToken, a.actor_id(), &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(f.Acquire(kBobToken, b.actor_id(), &reply).ok());
  EXPECT_EQ(f.server->Counters().at("revoked"), 1);
}

TEST(LearnerServerTest, ProtocolMismatchNamesBothVersions) {
  Fixture f("");
  v1::RegisterReply reply;
  grpc::Status st = f.Register("", kProtocolVersion + 1, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("protocol version " + std::to_string(kProtocolVersion + 1)), std::string::npos);
  EXPECT_NE(st.error_message().find("speaks " + std::to_string(kProtocolVersion)), std::string::npos);
  EXPECT_TRUE(f.server->Actors().empty());
}

TEST(LearnerServerTest, UnknownActorIsRefusedAndSilentActorsAreEvicted) {
  Fixture f("");
  grpc::ClientContext ctx;
  v1::AcquireRequest req;
  req.set_actor_id("ghost#9");
  v1::AcquireReply reply;
  EXPECT_EQ(f.stub->Acquire(&ctx, req, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(f.hub.holders.empty());

  v1::RegisterReply a, b;
  ASSERT_TRUE(f.Register("", kProtocolVersion, &a).ok());
  f.clock.Advance(2.0);
  ASSERT_TRUE(f.Register("", kProtocolVersion, &b).ok());
  f.clock.Advance(1.5);  // a silent 3.5 s, b 1.5 s
  EXPECT_EQ(f.server->EvictSilent(), std::vector<std::string>{a.actor_id()});
  EXPECT_EQ(f.server->Actors().size(), 1u);
  EXPECT_EQ(f.server->Counters().at("evicted"), 1);
}

TEST(RemoteLearnerTest, AcquireSubmitAndSnapshotRoundTrip) {
  Fixture f("tok");
  // 2.5 pieces, so the stream reassembles several messages.
  std::string blob(kSnapshotPieceBytes * 5 / 2, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 7 + 3);
  f.hub.snapshot = contract::Snapshot{4, std::make_shared<const std::string>(blob), nullptr};

  RemoteLearner learner(f.Remote("tok"));
  std::atomic<bool> stop{false};
  Result<std::string> spec = learner.Connect(stop);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec.value(), "{\"spec\": 1}");

  std::optional<contract::Assignment> a = learner.Acquire("ignored");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->prompt.text, "1+2=");
  EXPECT_EQ(a->prompt.system, "Answer with a number.");  // a chat prompt's system message travels
  EXPECT_EQ(a->group_size, 2);
  EXPECT_TRUE(a->scored_by_learner);  // the actor samples only; the learner scores

  contract::GroupRollout g;
  g.group_id = a->work.group_id;
  g.lease_id = a->work.lease_id;
  g.behavior_version = 4;
  data::Episode e;
  e.turns.push_back({{1, 5}, {6, 2}, {-0.5f, -0.25f}, "3"});
  e.reward = 1.0;
  g.episodes = {e, e};
  EXPECT_TRUE(learner.Submit(g).accepted);
  g.lease_id += 1;
  contract::SubmitOutcome refused = learner.Submit(g);
  EXPECT_FALSE(refused.accepted);
  EXPECT_EQ(refused.reason, "not_lease_holder");
  ASSERT_EQ(f.hub.submitted.size(), 2u);
  EXPECT_EQ(f.hub.submitted[0].episodes[1].turns[0].logprobs, (std::vector<float>{-0.5f, -0.25f}));
  EXPECT_EQ(f.hub.submitted[0].actor.rfind("rl#", 0), 0u);

  contract::Snapshot s = learner.Latest();
  EXPECT_EQ(s.version, 4);
  ASSERT_TRUE(s.weights);
  EXPECT_TRUE(*s.weights == blob);
  learner.Close();
}

// A LoRA run: snapshots hold adapters naming their base's SHA-256. The actor pulls the base
// once (the same bytes under every later version), checks it, and hands it out with each
// snapshot; an adapter naming a base the learner does not serve is not taken.
TEST(RemoteLearnerTest, PullsTheLoraBaseOnceAndChecksIt) {
  Fixture f("tok");
  const auto base = std::make_shared<const std::string>(kSnapshotPieceBytes * 3 / 2, 'b');
  const auto adapter = [&](float value, const std::string& sha) {
    Result<std::string> bytes = model::SerializeSafetensors({{"model.layers.0.self_attn.q_proj.lora_A.weight",
                                                              at::full({2, 4}, value)}},
                                                            {{model::kLoraBaseKey, sha}});
    EXPECT_TRUE(bytes.ok());
    return std::make_shared<const std::string>(bytes.value());
  };
  {
    std::lock_guard<std::mutex> lock(f.hub.mu);
    f.hub.snapshot = contract::Snapshot{5, adapter(1, Sha256Hex(*base)), base};
  }
  RemoteLearner learner(f.Remote("tok"));
  std::atomic<bool> stop{false};
  ASSERT_TRUE(learner.Connect(stop).ok());
  const contract::Snapshot s5 = learner.Latest();
  EXPECT_EQ(s5.version, 5);
  ASSERT_TRUE(s5.base);
  EXPECT_EQ(*s5.base, *base);
  {
    std::lock_guard<std::mutex> lock(f.hub.mu);
    f.hub.snapshot = contract::Snapshot{6, adapter(2, Sha256Hex(*base)), base};
  }
  learner.Want(6);
  const contract::Snapshot s6 = learner.Latest();
  EXPECT_EQ(s6.version, 6);
  EXPECT_EQ(s6.base, s5.base) << "the base is pulled once";
  {
    std::lock_guard<std::mutex> lock(f.hub.mu);
    f.hub.snapshot = contract::Snapshot{7, adapter(3, std::string(64, '0')), base};
  }
  learner.Want(7);
  EXPECT_EQ(learner.Latest().version, 6) << "an adapter over a base that does not check out is not taken";
  learner.Close();
}

// A learner whose snapshot streams in `pieces` pieces `gap` seconds apart; from piece
// `stall_at` on it sends nothing more and keeps the stream open.
class TricklingLearner final : public v1::Learner::Service {
 public:
  TricklingLearner(int pieces, double gap, int stall_at) : pieces_(pieces), gap_(gap), stall_at_(stall_at) {}
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*, v1::RegisterReply* reply) override {
    reply->set_actor_id("t#1");
    reply->set_heartbeat_seconds(1);
    reply->set_snapshot_version(1);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*, v1::HeartbeatReply* reply) override {
    reply->set_known(true);
    reply->set_snapshot_version(1);
    return grpc::Status::OK;
  }
  grpc::Status GetSnapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest*,
                           grpc::ServerWriter<v1::SnapshotPiece>* writer) override {
    for (int i = 0; i < pieces_; ++i) {
      if (i == stall_at_) {
        while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return grpc::Status(grpc::StatusCode::CANCELLED, "stalled");
      }
      if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(gap_));
      v1::SnapshotPiece piece;
      piece.set_version(1);
      piece.set_total_bytes(4 * pieces_);
      piece.set_offset(4 * i);
      piece.set_data("abcd");
      if (!writer->Write(piece)) return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
    }
    return grpc::Status::OK;
  }

 private:
  const int pieces_;
  const double gap_;
  const int stall_at_;
};

// A direct snapshot pull had a 120 s deadline as a whole, so a snapshot of more than ~1.5 GB
// could never come directly over 100 Mbit/s. A pull now runs as long as pieces keep coming and
// is cancelled when they stop.
TEST(RemoteLearnerTest, ASnapshotPullEndsOnAStallNotOnItsLength) {
  for (const bool stalls : {false, true}) {
    TricklingLearner service(/*pieces=*/5, /*gap=*/stalls ? 0.01 : 0.3, /*stall_at=*/stalls ? 2 : 99);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    RemoteLearnerOptions o;
    o.address = "127.0.0.1:" + std::to_string(port);
    o.broadcast = false;
    o.snapshot_stall_seconds = 0.5;
    RemoteLearner learner(o);
    std::atomic<bool> stop{false};
    ASSERT_TRUE(learner.Connect(stop).ok());
    const auto t0 = std::chrono::steady_clock::now();
    const contract::Snapshot snap = learner.Latest();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (stalls) {
      EXPECT_EQ(snap.version, -1);
      EXPECT_LT(took, 5.0);
    } else {
      EXPECT_EQ(snap.version, 1);  // 1.2 s of pieces, each within the 0.5 s stall limit
      ASSERT_TRUE(snap.weights);
      EXPECT_EQ(*snap.weights, "abcdabcdabcdabcdabcd");
      EXPECT_GT(took, 1.0);
    }
    learner.Close();
    server->Shutdown();
  }
}

TEST(RemoteLearnerTest, WrongTokenFailsConnectAtOnce) {
  Fixture f("tok");
  RemoteLearner learner(f.Remote("nope"));
  std::atomic<bool> stop{false};
  Result<std::string> spec = learner.Connect(stop);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("bearer token"), std::string::npos);
}

}  // namespace
}  // namespace echelon::net

namespace echelon::net {
namespace {

// An actor's progress reaches the learner's work source with its heartbeat, under the
// authenticated actor's id; a report once submitted is not sent; one heartbeat carries at most
// kMaxProgressReports that are read.
// Resumable groups over the wire: an actor that can continue prefixes says so (with the snapshot
// it holds, for deadline-aware dispatch) and gets the
// group's prefix whole (tokens, log-probs, versions); one that cannot is never handed one; its
// prefix reports reach the learner whole, under its own actor id.
TEST(RemoteLearnerTest, APrefixAndItsReportsTravelWhole) {
  Fixture f("tok");
  f.hub.snapshot = contract::Snapshot{4, std::make_shared<const std::string>("w"), nullptr};
  RemoteLearner learner(f.Remote("tok"));
  std::atomic<bool> stop{false};
  ASSERT_TRUE(learner.Connect(stop).ok());
  const std::optional<contract::Assignment> plain = learner.Acquire("ignored");
  ASSERT_TRUE(plain);
  EXPECT_TRUE(plain->prefix.empty());
  EXPECT_FALSE(plain->report_prefix);
  const std::optional<contract::Assignment> a = learner.AcquireWith("ignored", {true, 4});
  ASSERT_TRUE(a);
  {
    std::lock_guard<std::mutex> lock(f.hub.mu);
    ASSERT_EQ(f.hub.requests.size(), 2u);
    EXPECT_FALSE(f.hub.requests[0].continues_prefixes);
    EXPECT_EQ(f.hub.requests[0].snapshot_version, -1);
    EXPECT_TRUE(f.hub.requests[1].continues_prefixes);
    EXPECT_EQ(f.hub.requests[1].snapshot_version, 4) << "the snapshot the actor holds travels";
  }
  EXPECT_TRUE(a->report_prefix);
  ASSERT_EQ(a->prefix.size(), 2u);
  EXPECT_EQ(a->prefix[0].tokens, (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(a->prefix[0].logprobs, (std::vector<float>{-0.5f, -0.25f}));
  EXPECT_EQ(a->prefix[0].versions, (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(a->prefix[1].tokens.empty());
  contract::PrefixPart part{1, 0, {7, 8, 9}, {-0.1f, -0.2f, -0.3f}, {4, 4, 4}};
  EXPECT_TRUE(learner.ReportPrefix("ignored", a->work, {part}));
  std::lock_guard<std::mutex> lock(f.hub.mu);
  ASSERT_EQ(f.hub.prefix_reports.size(), 1u);
  const ScriptedHub::PrefixReport& got = f.hub.prefix_reports[0];
  EXPECT_EQ(got.actor, f.hub.holders.back());
  EXPECT_EQ(got.lease, a->work.lease_id);
  ASSERT_EQ(got.parts.size(), 1u);
  EXPECT_EQ(got.parts[0].sample, 1);
  EXPECT_EQ(got.parts[0].from, 0);
  EXPECT_EQ(got.parts[0].tokens, part.tokens);
  EXPECT_EQ(got.parts[0].logprobs, part.logprobs);
  EXPECT_EQ(got.parts[0].versions, part.versions);
}

TEST(RemoteLearnerTest, ProgressTravelsWithTheHeartbeat) {
  Fixture f("tok");
  f.hub.snapshot = contract::Snapshot{0, std::make_shared<const std::string>("w"), nullptr};
  RemoteLearner learner(f.Remote("tok"));
  std::atomic<bool> stop{false};
  ASSERT_TRUE(learner.Connect(stop).ok());
  const std::optional<contract::Assignment> a = learner.Acquire("ignored");
  const std::optional<contract::Assignment> b = learner.Acquire("ignored");
  ASSERT_TRUE(a && b);
  learner.Progress("ignored", a->work, 10);
  learner.Progress("ignored", a->work, 25);  // the newest count of a group is what goes
  learner.Progress("ignored", b->work, 7);
  contract::GroupRollout done;
  done.group_id = b->work.group_id;
  done.lease_id = b->work.lease_id;
  done.episodes.resize(2);
  learner.Submit(done);  // b is handed in: nothing more to report for it
  for (int i = 0; i < 60; ++i) {
    {
      std::lock_guard<std::mutex> lock(f.hub.mu);
      if (!f.hub.progress.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  {
    std::lock_guard<std::mutex> lock(f.hub.mu);
    ASSERT_EQ(f.hub.progress.size(), 1u);
    EXPECT_EQ(f.hub.progress[0].actor, f.hub.holders[0]);
    EXPECT_EQ(f.hub.progress[0].group, a->work.group_id);
    EXPECT_EQ(f.hub.progress[0].lease, a->work.lease_id);
    EXPECT_EQ(f.hub.progress[0].tokens, 25);
    f.hub.progress.clear();
  }
  learner.Close();
  // A flood of reports in one heartbeat: only the first kMaxProgressReports are read.
  v1::RegisterReply reg;
  ASSERT_TRUE(f.Register("tok", kProtocolVersion, &reg).ok());
  grpc::ClientContext ctx;
  AttachToken(ctx, "tok");
  v1::HeartbeatRequest req;
  req.set_actor_id(reg.actor_id());
  for (int i = 0; i < 1000; ++i) {
    v1::LeaseProgress* p = req.add_progress();
    p->set_group_id(static_cast<uint64_t>(i));
    p->set_lease_id(1);
    p->set_tokens(i + 1);
  }
  v1::HeartbeatReply reply;
  ASSERT_TRUE(f.stub->Heartbeat(&ctx, req, &reply).ok());
  std::lock_guard<std::mutex> lock(f.hub.mu);
  EXPECT_EQ(f.hub.progress.size(), static_cast<size_t>(kMaxProgressReports));
  for (const ScriptedHub::Report& r : f.hub.progress) EXPECT_EQ(r.actor, reg.actor_id());
}

}  // namespace
}  // namespace echelon::net
