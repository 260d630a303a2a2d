// `echelon_testkit load-actors`: drives one learner with N lightweight synthetic actors over
// loopback, to find how many actors one learner holds (bench/learner_load.sh). Each actor
// registers with its own worker token, heartbeats every second, asks for work with the real
// actors' idle backoff (sched::kActorIdleSleepSeconds doubling to kActorMaxIdleSleepSeconds),
// "generates" for --group-seconds, and submits a valid group (the prompt's answer, the
// learner's own prompt encoding). Prints one JSON line: actors, RPCs per second, latency
// percentiles per RPC kind, honest refusals and errors.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <thread>

#include "echelon/common/fs.h"
#include "echelon/contract/run_spec.h"
#include "echelon/net/auth.h"
#include "echelon/net/codec.h"
#include "echelon/net/protocol.h"
#include "echelon/sched/tunables.h"
#include "echelon/v1/learner.grpc.pb.h"
#include "tests/tools/workers.h"

namespace echelon::testkit {
namespace {

using Clock = std::chrono::steady_clock;

struct SyntheticActor {
  std::string token;
  std::string id;
  Clock::time_point next_call;
  Clock::time_point next_heartbeat;
  double idle = sched::kActorIdleSleepSeconds;
  std::optional<v1::AcquireReply> work;  // held while "generating"
};

struct Latencies {
  std::mutex mu;
  std::map<std::string, std::vector<double>> seconds;
  std::map<std::string, int64_t> counts;
  void Add(const std::string& kind, double s) {
    std::lock_guard<std::mutex> lock(mu);
    seconds[kind].push_back(s);
  }
  void Count(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    ++counts[what];
  }
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - (q > 0 ? 1 : 0))];
}

class Load {
 public:
  Load(const std::string& address, const contract::ActorSetup* setup, double group_seconds, Latencies* lat)
      : setup_(setup), group_seconds_(group_seconds), lat_(lat) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(net::kMaxMessageBytes);
    // Several channels, so the calls of all actors do not share one HTTP/2 connection.
    for (int i = 0; i < 8; ++i) {
      args.SetInt("echelon.channel", i);
      stubs_.push_back(v1::Learner::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
    }
  }

  template <typename F>
  grpc::Status Timed(const std::string& kind, const std::string& token, F call) {
    grpc::ClientContext ctx;
    net::AttachToken(ctx, token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const auto t0 = Clock::now();
    grpc::Status st = call(ctx);
    lat_->Add(kind, std::chrono::duration<double>(Clock::now() - t0).count());
    if (!st.ok()) lat_->Count("error_" + kind);
    return st;
  }

  v1::Learner::Stub& Stub(size_t i) { return *stubs_[i % stubs_.size()]; }

  bool Register(SyntheticActor& a, size_t i) {
    v1::RegisterRequest req;
    req.set_protocol_version(net::kProtocolVersion);
    v1::RegisterReply reply;
    grpc::Status st = Timed("register", a.token, [&](grpc::ClientContext& c) { return Stub(i).Register(&c, req, &reply); });
    if (!st.ok()) return false;
    a.id = reply.actor_id();
    return true;
  }

  // One due step of actor i: heartbeat, submit finished work, or ask for work.
  void Step(SyntheticActor& a, size_t i) {
    const auto now = Clock::now();
    if (now >= a.next_heartbeat) {
      v1::HeartbeatRequest req;
      req.set_actor_id(a.id);
      v1::HeartbeatReply reply;
      Timed("heartbeat", a.token, [&](grpc::ClientContext& c) { return Stub(i).Heartbeat(&c, req, &reply); });
      if (reply.done()) done_ = true;
      a.next_heartbeat = now + std::chrono::seconds(1);
    }
    if (a.work) {
      Submit(a, i);
      a.work.reset();
      a.next_call = Clock::now();
      return;
    }
    v1::AcquireRequest req;
    req.set_actor_id(a.id);
    v1::AcquireReply reply;
    grpc::Status st = Timed("acquire", a.token, [&](grpc::ClientContext& c) { return Stub(i).Acquire(&c, req, &reply); });
    if (st.ok() && reply.done()) done_ = true;
    if (st.ok() && reply.has_work()) {
      a.work = reply;
      a.idle = sched::kActorIdleSleepSeconds;
      a.next_call = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(group_seconds_));
    } else {
      a.next_call = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.idle));
      a.idle = std::min(a.idle * 2, sched::kActorMaxIdleSleepSeconds);
    }
  }

  void Submit(SyntheticActor& a, size_t i) {
    const v1::AcquireReply& w = *a.work;
    contract::GroupRollout g;
    g.group_id = w.group_id();
    g.lease_id = w.lease_id();
    g.behavior_version = w.snapshot_version();
    data::Turn t;
    t.prompt_ids = setup_->vocab.EncodePrompt(w.prompt_system(), w.prompt_text()).value();
    t.tokens = setup_->vocab.Encode(w.prompt_reference()).value();
    t.tokens.push_back(setup_->vocab.stop_ids().front());
    t.logprobs.assign(t.tokens.size(), -0.1f);
    data::Episode e;
    e.turns.push_back(t);
    e.reward = 1;
    g.episodes.assign(w.group_size(), e);
    v1::SubmitRequest req;
    net::EncodeRollout(g, a.id, &req);
    v1::SubmitReply reply;
    grpc::Status st = Timed("submit", a.token, [&](grpc::ClientContext& c) { return Stub(i).Submit(&c, req, &reply); });
    if (st.ok()) lat_->Count(reply.accepted() ? "accepted" : "refused_" + reply.reason());
  }

  std::atomic<bool> done_{false};

 private:
  const contract::ActorSetup* setup_;
  const double group_seconds_;
  Latencies* lat_;
  std::vector<std::unique_ptr<v1::Learner::Stub>> stubs_;
};

}  // namespace

// load-actors LEARNER WORKERS_FILE N SECONDS GROUP_SECONDS
int LoadActorsMain(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: echelon_testkit load-actors LEARNER WORKERS_FILE N SECONDS GROUP_SECONDS" << std::endl;
    return 2;
  }
  const std::string address = argv[1];
  const int n = std::stoi(argv[3]);
  const double seconds = std::stod(argv[4]), group_seconds = std::stod(argv[5]);
  std::optional<std::vector<Worker>> workers = ReadWorkers(argv[2]);
  if (!workers) return 2;
  std::vector<SyntheticActor> actors;
  for (size_t i = 0; i < workers->size() && static_cast<int>(actors.size()) < n; ++i) {
    SyntheticActor a;
    a.token = (*workers)[i].token;
    actors.push_back(a);
  }
  if (static_cast<int>(actors.size()) < n) {
    std::cerr << argv[2] << " has fewer than " << n << " workers" << std::endl;
    return 2;
  }
  // The run spec, once (every actor receives the same).
  auto stub = v1::Learner::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::RegisterRequest req;
  req.set_protocol_version(net::kProtocolVersion);
  v1::RegisterReply reply;
  grpc::ClientContext ctx;
  net::AttachToken(ctx, actors[0].token);
  if (grpc::Status st = stub->Register(&ctx, req, &reply); !st.ok()) {
    std::cerr << "register: " << st.error_message() << std::endl;
    return 1;
  }
  Result<contract::ActorSetup> setup = contract::ParseRunSpec(reply.run_spec_json());
  if (!setup.ok()) {
    std::cerr << setup.status().message() << std::endl;
    return 1;
  }
  Latencies lat;
  Load load(address, &setup.value(), group_seconds, &lat);
  constexpr int kThreads = 32;
  std::atomic<int> registered{0};
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<size_t> mine;
      for (size_t i = t; i < actors.size(); i += kThreads) {
        if (load.Register(actors[i], i)) {
          mine.push_back(i);
          ++registered;
        }
      }
      while (Clock::now() < end && !load.done_) {
        Clock::time_point soonest = end;
        for (size_t i : mine) {
          if (Clock::now() >= actors[i].next_call) load.Step(actors[i], i);
          soonest = std::min(soonest, actors[i].next_call);
        }
        std::this_thread::sleep_until(std::min(soonest, Clock::now() + std::chrono::milliseconds(50)));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  nlohmann::json out = {{"actors", registered.load()}, {"seconds", wall}, {"counts", lat.counts}};
  int64_t calls = 0;
  std::vector<double> all;
  for (const auto& [kind, v] : lat.seconds) {
    out["p50_s"][kind] = Percentile(v, 0.5);
    out["p99_s"][kind] = Percentile(v, 0.99);
    out["max_s"][kind] = v.empty() ? 0 : *std::max_element(v.begin(), v.end());
    calls += static_cast<int64_t>(v.size());
    all.insert(all.end(), v.begin(), v.end());
  }
  out["rpc_per_s"] = calls / wall;
  out["p99_s"]["all"] = Percentile(all, 0.99);
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace echelon::testkit
