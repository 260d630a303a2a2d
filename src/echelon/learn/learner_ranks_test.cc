// Data-parallel learner ranks over c10d Gloo on loopback: two ranks as threads of this test.
#include "echelon/learn/learner_ranks.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <sstream>
#include <thread>

#include "echelon/learn/run_checkpoint.h"
#include "echelon/learn/snapshot_publisher.h"
#include "echelon/model/safetensors.h"
#include "echelon/learn/testing.h"

namespace echelon::learn {
namespace {

// Rank 0 in this thread, rank 1 in another; rank 1 learns rank 0's port from on_listening.
struct TwoRanks {
  TwoRanks() {
    RankGroupOptions r0;
    r0.world = 2;
    r0.timeout_seconds = 60;
    r0.on_listening = [this](int port) {
      worker = std::async(std::launch::async, [this, port] {
        RankGroupOptions r1;
        r1.rank = 1;
        r1.world = 2;
        r1.master_port = port;
        r1.timeout_seconds = 60;
        Result<std::unique_ptr<RankGroup>> g = RankGroup::Connect(r1);
        if (!g.ok()) return g.status();
        return RunRankWorker(*g.value(), worker_log);
      });
      return Status::Ok();
    };
    Result<std::unique_ptr<RankGroup>> g = RankGroup::Connect(r0);
    EXPECT_TRUE(g.ok()) << g.status().message();
    ranks = std::make_unique<LearnerRanks>(std::move(g).value());
  }
  std::unique_ptr<LearnerRanks> ranks;
  std::future<Status> worker;
  std::stringstream worker_log;
};

// A one-rank learner beside two ranks under sharded parameters, from the same random weights
// (`seed`) and options, stepped together on the same groups: what the sharded ranks write or
// serve must be the one rank's.
struct OneBesideShardedTwo {
  static constexpr double kLr = 1e-3;
  OneBesideShardedTwo(const model::ModelConfig& c, int seed)
      : init(Init(c, seed)),
        groups(SampleGroups(init, 1.0, 6)),
        one(Copy(init), Options(Shard::kNone)),
        rank0(Copy(init), Options(Shard::kParams), two.ranks->group()) {
    EXPECT_TRUE(two.ranks->Setup(rank0, {}).ok());
  }
  static model::Qwen3Model Init(const model::ModelConfig& c, int seed) {
    model::Qwen3Model m(c);
    m->InitWeights(seed);
    return m;
  }
  static LearnerOptions Options(Shard shard) {
    LearnerOptions o;
    o.lr = kLr;
    o.shard = shard;
    return o;
  }
  // `steps` updates by both; false at the first that fails.
  bool Step(int steps) {
    for (int i = 0; i < steps; ++i)
      if (!one.Step(groups).ok() || !two.ranks->SendStep(groups, kLr).ok() || !rank0.Step(groups).ok()) return false;
    return true;
  }
  model::Qwen3Model init;
  std::vector<LearnerGroup> groups;
  Learner one;
  TwoRanks two;
  Learner rank0;
};

// `steps` updates on `groups` from `init` with options `o`, by one rank and by two: the weights
// of each.
struct OneAndTwo {
  model::Qwen3Model one{nullptr}, two{nullptr};
};
OneAndTwo TrainOnOneAndTwoRanks(const model::Qwen3Model& init, const std::vector<LearnerGroup>& groups,
                                const LearnerOptions& o, int steps) {
  Learner one(Copy(init), o);
  TwoRanks two;
  Learner rank0(Copy(init), o, two.ranks->group());
  EXPECT_TRUE(two.ranks->Setup(rank0, {}).ok());
  for (int step = 0; step < steps; ++step) {
    EXPECT_TRUE(one.Step(groups).ok());
    EXPECT_TRUE(two.ranks->SendStep(groups, o.lr).ok());
    EXPECT_TRUE(rank0.Step(groups).ok());
  }
  model::Qwen3Model whole = WholeWeights(*two.ranks, rank0);
  two.ranks->Stop();
  EXPECT_TRUE(two.worker.get().ok());
  return {one.model(), whole};
}

// The same ten updates on the same batches, one rank against two: each of two ranks computes
// the gradients of half the micro-batches and the sum is all-reduced, which is the one-rank
// gradient summed in another order (float32 rounding, ~1e-7 relative); as for micro-batches,
// AdamW turns that into weights equal within 1e-5. The learning rate changes half-way (each
// step message carries rank 0's).
TEST(LearnerRanks, TwoRanksGiveTheWeightsOfOne) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(5);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  for (int64_t minibatches : {1, 2})
  for (int64_t micro : {0, 20}) {
    LearnerOptions o;
    o.lr = 1e-3;
    o.minibatches = minibatches;
    o.micro_batch_tokens = micro;
    Learner one(Copy(init), o);
    TwoRanks two;
    Learner rank0(Copy(init), o, two.ranks->group());
    ASSERT_TRUE(two.ranks->Setup(rank0, {}).ok());
    for (int step = 0; step < 10; ++step) {
      if (step == 5) {  // rl.staleness: auto moving the learning rate: every rank follows rank 0's
        one.SetLearningRate(3e-3);
        rank0.SetLearningRate(3e-3);
      }
      Result<StepStats> a = one.Step(groups);
      ASSERT_TRUE(two.ranks->SendStep(groups, rank0.options().lr).ok());
      Result<StepStats> b = rank0.Step(groups);
      ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
      EXPECT_NEAR(a->loss, b->loss, 1e-6) << "step " << step;
      EXPECT_NEAR(a->logprob_gap, b->logprob_gap, 1e-6) << "step " << step;
      EXPECT_NEAR(a->clip_frac, b->clip_frac, 1e-6) << "step " << step;
    }
    two.ranks->Stop();
    ASSERT_TRUE(two.worker.get().ok());
    EXPECT_NE(two.worker_log.str().find("learner rank 1 of 2 ready at version 0"), std::string::npos);
    EXPECT_LT(MaxWeightDiff(one.model(), rank0.model()), 1e-5) << "minibatches " << minibatches;
    EXPECT_GT(MaxWeightDiff(one.model(), init), 1e-3);
  }
}

// learner.pack_sequences did not reach the workers: with it off on rank 0, a worker still packed
// and cut other micro-batches than rank 0 (rows trained twice or not at all). Two ranks
// unpacked give one rank's weights.
TEST(LearnerRanks, PackSequencesReachesEveryRank) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(7);
  // Rows of 3 to 14 positions: packed into rows of 14 they take 8 rows instead of 18, so a
  // packing rank cuts other micro-batches than one that pads.
  std::vector<LearnerGroup> groups(3);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int i = 0; i < 6; ++i) {
      data::Turn t{{1, 5, 7}, {}, {}, ""};
      for (int k = 0; k < 1 + (i * 2 + static_cast<int>(g)) % 12; ++k) t.tokens.push_back(3 + (k + i) % 12);
      t.logprobs.assign(t.tokens.size(), -2.0f);
      data::Episode e;
      e.turns.push_back(t);
      e.reward = i % 2;
      groups[g].episodes.push_back(e);
    }
  LearnerOptions o;
  o.lr = 1e-3;
  o.micro_batch_tokens = 28;
  o.pack_sequences = false;
  const OneAndTwo r = TrainOnOneAndTwoRanks(init, groups, o, 5);
  EXPECT_LT(MaxWeightDiff(r.one, r.two), 1e-5);
  EXPECT_GT(MaxWeightDiff(r.one, init), 1e-3);
}

// The loss options (aggregation, the group share cap, sequence ratios, overlong shaping and the
// limit it reads) reach the workers: two ranks give one rank's weights with every one of them
// away from its default.
TEST(LearnerRanks, LossOptionsReachEveryRank) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(8);
  std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  // In every group one completion stopped exactly at the limit (5 tokens, the stop id last) and
  // one was cut there: only the stop ids tell them apart.
  for (LearnerGroup& g : groups)
    for (size_t e = 0; e < 2; ++e) {
      data::Turn& t = g.episodes[e].turns[0];
      t.tokens = {3, 4, 5, 6, e == 0 ? int64_t{2} : int64_t{7}};
      t.logprobs.assign(5, -2.0f);
      g.episodes[e].reward = static_cast<double>(e);
    }
  LearnerOptions o;
  o.lr = 1e-3;
  o.micro_batch_tokens = 20;
  o.loss_aggregation = LossAggregation::kSeqMeanTokenSumNorm;
  o.max_group_share = 0.2;  // three groups: each carries 1/3 uncapped
  o.loss.ratio = RatioLevel::kSequence;
  o.loss.correction = Correction::kTruncatedIS;
  o.overlong = {2, 0.5, true};
  o.max_new_tokens = 5;
  o.stop_ids = {2};
  const OneAndTwo r = TrainOnOneAndTwoRanks(init, groups, o, 4);
  EXPECT_LT(MaxWeightDiff(r.one, r.two), 1e-5);
  EXPECT_GT(MaxWeightDiff(r.one, init), 1e-4);
}

// A worker that joins a run in progress gets rank 0's whole state: its next update is the
// one-rank update from the same checkpoint.
// One rank takes three updates; two ranks with `shard` resume at version 3 from its weights and
// AdamW state, and both take `after` more updates on the same groups: the largest weight
// difference then, and the worker's log.
struct ResumedFromOne {
  double diff = 0;
  std::string worker_log;
};
ResumedFromOne ResumeFromOneOnTwo(const model::ModelConfig& config, uint64_t seed, Shard shard, int after) {
  model::Qwen3Model init(config);
  init->InitWeights(seed);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  LearnerOptions o;
  o.lr = 1e-3;
  Learner one(Copy(init), o);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(one.Step(groups).ok());
  o.shard = shard;
  TwoRanks two;
  Learner rank0(Copy(one.model()), o, two.ranks->group());
  EXPECT_TRUE(rank0.Restore(one.version(), one.OptimizerState(), {}).ok());
  const Status setup = two.ranks->Setup(rank0, one.OptimizerState());
  EXPECT_TRUE(setup.ok()) << setup.message();
  for (int i = 0; i < after; ++i) {
    EXPECT_TRUE(one.Step(groups).ok());
    EXPECT_TRUE(two.ranks->SendStep(groups, o.lr).ok());
    EXPECT_TRUE(rank0.Step(groups).ok());
  }
  const double diff = MaxWeightDiff(one.model(), WholeWeights(*two.ranks, rank0));
  two.ranks->Stop();
  const Status worker = two.worker.get();
  EXPECT_TRUE(worker.ok()) << worker.message();
  return {diff, two.worker_log.str()};
}

TEST(LearnerRanks, WorkersStartFromRankZerosOptimizerState) {
  const ResumedFromOne r = ResumeFromOneOnTwo(TinyConfig(), 6, Shard::kNone, 1);
  EXPECT_NE(r.worker_log.find("ready at version 3"), std::string::npos) << r.worker_log;
  EXPECT_LT(r.diff, 1e-5);
}

// The same under sharded parameters: no whole weights or AdamW state reach the worker; rank 0
// sends each unit's, and the worker keeps its part (Learner::ShardsFromRankZero). A worker with
// wrong shards or moments would make the gathered weights wrong after the next updates.
TEST(LearnerRanks, ShardedWorkersTakeRankZerosWeightsAndAdamWStateUnitByUnit) {
  const ResumedFromOne r = ResumeFromOneOnTwo(TinyMoeConfig(), 8, Shard::kParams, 2);
  EXPECT_NE(r.worker_log.find("ready at version 3 (cpu, sharded parameters)"), std::string::npos) << r.worker_log;
  EXPECT_LT(r.diff, 1e-5);
}

// Under sharded parameters a checkpoint's AdamW state is written as it is gathered, unit by unit
// (rank 0 never holds it whole): what a resume reads back is the one-rank learner's state after
// the same updates. A file that cannot be written fails the save but leaves the workers in step
// (they took part in every gather), so the run goes on.
TEST(LearnerRanks, AShardedCheckpointWritesTheAdamWStateAsItIsGathered) {
  OneBesideShardedTwo pair(TinyMoeConfig(), 9);
  const std::vector<LearnerGroup>& groups = pair.groups;
  Learner& one = pair.one;
  Learner& rank0 = pair.rank0;
  TwoRanks& two = pair.two;
  ASSERT_TRUE(pair.Step(2));
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("echelon_ranks_ckpt_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  // Nowhere to write: an error, and the ranks still in step.
  Result<model::CheckpointFile> nowhere = two.ranks->OptimizerFile(rank0, dir + "/missing/optimizer.safetensors");
  EXPECT_FALSE(nowhere.ok());
  EXPECT_FALSE(two.ranks->WeightsFile(rank0, dir + "/missing/model.safetensors", at::kFloat).ok());
  Result<model::CheckpointFiles> files = GatherCheckpointFiles(*two.ranks, rank0, dir);
  ASSERT_TRUE(files.ok()) << files.status().message();
  RunState state;
  state.version = state.dispatcher.version = rank0.version();
  state.rng_state_hex = CaptureRngState();
  const Status saved =
      SaveRunCheckpoint(dir, rank0, model::Vocabulary::Characters("0123456789"), state, 1, files.value());
  ASSERT_TRUE(saved.ok()) << saved.message();
  for (const char* name : {"optimizer.safetensors", "model.safetensors"})
    EXPECT_FALSE(std::filesystem::exists(GatheredPath(dir, name))) << name << " moved into the checkpoint";
  ASSERT_TRUE(two.ranks->SendStep(groups, OneBesideShardedTwo::kLr).ok());
  ASSERT_TRUE(rank0.Step(groups).ok());
  two.ranks->Stop();
  const Status worker = two.worker.get();
  ASSERT_TRUE(worker.ok()) << worker.message();
  std::vector<std::string> skipped;
  Result<ResumePoint> point = LoadNewestRunCheckpoint(dir, &skipped);
  ASSERT_TRUE(point.ok()) << point.status().message();
  EXPECT_LT(MaxWeightDiff(one.model(), point->checkpoint.model), 1e-5) << "the weights gathered unit by unit";
  const std::map<std::string, at::Tensor> expected = one.OptimizerState();
  ASSERT_EQ(point->optimizer.size(), expected.size());
  for (const auto& [name, t] : expected) {
    ASSERT_TRUE(point->optimizer.count(name)) << name;
    const at::Tensor& got = point->optimizer.at(name);
    ASSERT_EQ(got.sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::allclose(got.to(at::kDouble), t.to(at::kDouble), 1e-3, 1e-7)) << name;
  }
  std::filesystem::remove_all(dir);
}

// checkpoints/final of a sharded learner (checkpoint.shard_mb): Hugging Face's sharded files,
// each of whole units gathered into it, within the bound; through the index the checkpoint
// loads the one-rank learner's weights.
TEST(LearnerRanks, AShardedLearnersFinalWeightsAreHuggingFaceShardsOfWholeUnits) {
  OneBesideShardedTwo pair(TinyMoeConfig(), 12);
  const std::vector<LearnerGroup>& groups = pair.groups;
  Learner& one = pair.one;
  Learner& rank0 = pair.rank0;
  TwoRanks& two = pair.two;
  ASSERT_TRUE(pair.Step(1));
  const std::vector<std::pair<std::vector<std::string>, uint64_t>> units = rank0.WeightUnits(at::kFloat);
  uint64_t largest = 0;
  for (const auto& [names, bytes] : units) largest = std::max(largest, bytes);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("echelon_ranks_shards_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Result<model::CheckpointFiles> files = two.ranks->WeightsFiles(rank0, dir, at::kFloat, largest);
  ASSERT_TRUE(files.ok()) << files.status().message();
  two.ranks->Stop();
  ASSERT_TRUE(two.worker.get().ok());
  ASSERT_TRUE(files->count(model::kWeightsIndexFile));
  EXPECT_FALSE(files->count(model::kWeightsFile));
  EXPECT_GT(files->size(), 3u) << "several shards besides the index";
  const nlohmann::json index = nlohmann::json::parse(files->at(model::kWeightsIndexFile).bytes);
  uint64_t total = 0;
  for (const auto& [file, f] : files.value()) {
    if (file == model::kWeightsIndexFile) continue;
    Result<model::SafetensorsFile> shard = model::ReadSafetensors(f.written_path);
    ASSERT_TRUE(shard.ok()) << shard.status().message();
    uint64_t bytes = 0;
    for (const auto& [name, t] : shard->tensors) {
      EXPECT_EQ(index["weight_map"][name], file) << name;
      bytes += static_cast<uint64_t>(t.nbytes());
    }
    EXPECT_LE(bytes, largest) << file;
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  const Status saved = model::SaveCheckpoint(dir + "/final", rank0.model(), model::Vocabulary::Characters("0123456789"),
                                             files.value());
  ASSERT_TRUE(saved.ok()) << saved.message();
  Result<model::LoadedCheckpoint> back = model::LoadCheckpoint(dir + "/final");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_LT(MaxWeightDiff(one.model(), back->model), 1e-5);
  EXPECT_TRUE(model::VerifyCheckpoint(dir + "/final", /*required=*/true).ok());
  std::filesystem::remove_all(dir);
}

// Under sharded parameters a snapshot is gathered unit by unit into its bytes (rank 0 keeps no
// whole weights after set-up): the same tensors, names, dtypes and shapes as the one-rank
// learner's snapshot of the same update (bf16 storage).
TEST(LearnerRanks, AShardedSnapshotIsTheOneRankSnapshot) {
  model::ModelConfig c = TinyMoeConfig();
  c.torch_dtype = "bfloat16";
  OneBesideShardedTwo pair(c, 14);
  const std::vector<LearnerGroup>& groups = pair.groups;
  Learner& one = pair.one;
  Learner& rank0 = pair.rank0;
  TwoRanks& two = pair.two;
  EXPECT_EQ(rank0.model()->parameters().front().numel(), 0) << "rank 0 keeps no whole weights";
  ASSERT_TRUE(pair.Step(2));
  Result<std::shared_ptr<const std::string>> gathered = two.ranks->WeightsBytes(rank0, at::kBFloat16);
  ASSERT_TRUE(gathered.ok()) << gathered.status().message();
  two.ranks->Stop();
  ASSERT_TRUE(two.worker.get().ok());
  Result<contract::Snapshot> expected = MakeSnapshot(one.model(), one.version());
  ASSERT_TRUE(expected.ok());
  Result<model::SafetensorsFile> a = model::ParseSafetensors(*expected->weights, "one rank");
  Result<model::SafetensorsFile> b = model::ParseSafetensors(*gathered.value(), "gathered");
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  for (const auto& [name, t] : a->tensors) {
    ASSERT_TRUE(b->tensors.count(name)) << name;
    const at::Tensor& g = b->tensors.at(name);
    EXPECT_EQ(g.scalar_type(), at::kBFloat16) << name;
    ASSERT_EQ(g.sizes(), t.sizes()) << name;
    // bf16 of weights equal within 1e-5: at most one rounding step apart
    EXPECT_LE((g.to(at::kFloat) - t.to(at::kFloat)).abs().max().item<double>(),
              t.to(at::kFloat).abs().max().item<double>() / 128.0) << name;
  }
}

// A run of four sharded ranks checkpointed after three updates and stopped, then resumed from
// that checkpoint's files on two: every update on either side of the break has the unbroken
// one-rank run's loss and gradient norm within 1e-5.
TEST(LearnerRanks, AFourRankRunResumedOnTwoContinuesTheUnbrokenLosses) {
  model::Qwen3Model init(TinyMoeConfig());
  init->InitWeights(12);
  LearnerOptions o;
  o.lr = 1e-3;
  o.micro_batch_tokens = 20;
  Learner one(Copy(init), o);
  std::vector<std::vector<LearnerGroup>> batches;
  std::vector<StepStats> unbroken;
  for (int step = 0; step < 6; ++step) {
    batches.push_back(SampleGroups(one.model(), 1.0, 6));
    Result<StepStats> a = one.Step(batches.back());
    ASSERT_TRUE(a.ok()) << a.status().message();
    unbroken.push_back(a.value());
  }
  o.shard = Shard::kParams;
  const auto run = [&](Learner& rank0, LearnerRanks& ranks, int from, int to) {
    for (int step = from; step < to; ++step) {
      ASSERT_TRUE(ranks.SendStep(batches[step], o.lr).ok());
      Result<StepStats> b = rank0.Step(batches[step]);
      ASSERT_TRUE(b.ok()) << b.status().message();
      EXPECT_NEAR(unbroken[step].loss, b->loss, 1e-5) << "update " << step;
      EXPECT_NEAR(unbroken[step].grad_norm, b->grad_norm, 1e-5) << "update " << step;
    }
  };
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("echelon_four_to_two_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    LocalRanks four(4);
    Learner rank0(Copy(init), o, four.ranks->group());
    ASSERT_TRUE(four.ranks->Setup(rank0, {}).ok());
    run(rank0, *four.ranks, 0, 3);
    Result<model::CheckpointFiles> files = GatherCheckpointFiles(*four.ranks, rank0, dir);
    ASSERT_TRUE(files.ok()) << files.status().message();
    RunState state;
    state.version = state.dispatcher.version = rank0.version();
    state.rng_state_hex = CaptureRngState();
    const Status saved =
        SaveRunCheckpoint(dir, rank0, model::Vocabulary::Characters("0123456789"), state, 1, files.value());
    ASSERT_TRUE(saved.ok()) << saved.message();
    run(rank0, *four.ranks, 3, 4);  // the update the break loses
    ASSERT_TRUE(four.Finish().ok());
  }
  std::vector<std::string> skipped;
  Result<ResumePoint> point = LoadNewestRunCheckpoint(dir, &skipped);
  ASSERT_TRUE(point.ok()) << point.status().message();
  ASSERT_EQ(point->state.version, 3);
  LocalRanks two(2);
  Learner rank0(point->checkpoint.model, o, two.ranks->group());
  ASSERT_TRUE(rank0.Restore(point->state.version, point->optimizer, {}).ok());
  const Status setup = two.ranks->Setup(rank0, point->optimizer);
  ASSERT_TRUE(setup.ok()) << setup.message();
  run(rank0, *two.ranks, 3, 6);
  EXPECT_EQ(rank0.version(), 6);
  EXPECT_LT(MaxWeightDiff(one.model(), WholeWeights(*two.ranks, rank0)), 1e-5);
  ASSERT_TRUE(two.Finish().ok());
  std::filesystem::remove_all(dir);
}

// One rank takes three updates with the KL term; two ranks resume from its weights, AdamW state
// and reference, and both take a fourth on the same groups. The learners after it: {one, two}.
struct Resumed {
  model::Qwen3Model start{nullptr}, one{nullptr}, two{nullptr};
};
Resumed ResumeOnTwoRanks(const LearnerOptions& o, uint64_t seed) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(seed);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  Learner one(Copy(init), o);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(one.Step(groups).ok());
  EXPECT_GT(MaxWeightDiff(one.model(), init), 1e-3) << "the reference (init) differs from the weights";
  Resumed out;
  out.start = Copy(one.model());
  TwoRanks two;
  Learner rank0(Copy(one.model()), o, two.ranks->group());
  EXPECT_TRUE(rank0.Restore(one.version(), one.OptimizerState(), one.ReferenceState()).ok());
  const Status setup = two.ranks->Setup(rank0, one.OptimizerState(), one.ReferenceState());
  EXPECT_TRUE(setup.ok()) << setup.message();
  EXPECT_TRUE(one.Step(groups).ok());
  EXPECT_TRUE(two.ranks->SendStep(groups, o.lr).ok());
  EXPECT_TRUE(rank0.Step(groups).ok());
  out.two = WholeWeights(*two.ranks, rank0);
  two.ranks->Stop();
  EXPECT_TRUE(two.worker.get().ok());
  out.one = one.model();
  return out;
}

// A resumed run with the KL term: the worker received the reference into tensors that shared
// its model's memory, so its weights became the reference's and its gradients were of the wrong
// policy. Its next update is again the one-rank update from the same checkpoint.
TEST(LearnerRanks, TheReferenceDoesNotOverwriteAWorkersWeights) {
  LearnerOptions o;
  o.lr = 1e-2;
  o.loss.kl_coef = 0.1;
  const Resumed r = ResumeOnTwoRanks(o, 10);
  EXPECT_LT(MaxWeightDiff(r.one, r.two), 1e-5);
}

// Under sharded parameters each rank keeps its shards of the KL reference, cut from the whole
// reference a resume reads on rank 0 (not from the weights, which moved since): the update after
// the resume is one rank's.
TEST(LearnerRanks, AShardedKlReferenceIsCutFromTheResumedReference) {
  LearnerOptions o;
  o.lr = 1e-2;
  o.loss.kl_coef = 0.1;
  o.shard = Shard::kParams;
  const Resumed r = ResumeOnTwoRanks(o, 10);
  EXPECT_LT(MaxWeightDiff(r.one, r.two), 1e-5);
}

// A bf16 learner keeps its KL reference in bf16, which Gloo cannot carry: the set-up failed
// with "Invalid scalar type" (and the rank exited) before the reference went over as fp32. Two
// ranks now give one rank's bf16 update.
TEST(LearnerRanks, ABf16ReferenceReachesTheWorkers) {
  LearnerOptions o;
  o.lr = 1e-2;
  o.loss.kl_coef = 0.1;
  o.precision = Precision::kBf16;
  const Resumed r = ResumeOnTwoRanks(o, 12);
  EXPECT_LT(RelativeUpdateDiff(r.one, r.two, r.start), 0.05);
}

// ZeRO stage 1: each of two ranks keeps half the AdamW state, steps its parameters and sends
// them to the other. The weights are those of one rank (within float rounding, as above), the
// state gathered for a checkpoint is the whole state, and each rank holds about half of it.
TEST(LearnerRanks, ShardedOptimizerGivesTheWeightsOfOneRankWithHalfTheState) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(8);
  const std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 6);
  LearnerOptions o;
  o.lr = 1e-3;
  o.micro_batch_tokens = 20;
  Learner one(Copy(init), o);
  o.shard = Shard::kOptimizer;
  TwoRanks two;
  Learner rank0(Copy(init), o, two.ranks->group());
  ASSERT_TRUE(two.ranks->Setup(rank0, {}).ok());
  for (int step = 0; step < 10; ++step) {
    ASSERT_TRUE(one.Step(groups).ok());
    ASSERT_TRUE(two.ranks->SendStep(groups, o.lr).ok());
    ASSERT_TRUE(rank0.Step(groups).ok());
  }
  EXPECT_LT(MaxWeightDiff(one.model(), rank0.model()), 1e-5);
  Result<std::map<std::string, at::Tensor>> gathered = two.ranks->GatherOptimizerState(rank0);
  ASSERT_TRUE(gathered.ok()) << gathered.status().message();
  const std::map<std::string, at::Tensor> whole = one.OptimizerState();
  ASSERT_EQ(gathered->size(), whole.size());
  for (const auto& [name, t] : whole) EXPECT_LT((t.to(at::kFloat) - gathered->at(name).to(at::kFloat)).abs().max().item<double>(), 1e-4) << name;
  const double share = static_cast<double>(rank0.OptimizerStateBytes()) / one.OptimizerStateBytes();
  EXPECT_GT(share, 0.3);
  EXPECT_LT(share, 0.7);
  two.ranks->Stop();
  ASSERT_TRUE(two.worker.get().ok());
  EXPECT_NE(two.worker_log.str().find("sharded optimizer"), std::string::npos);
}

TEST(LearnerRanks, GroupsSurviveTheirEncoding) {
  model::Qwen3Model init(TinyConfig());
  init->InitWeights(1);
  std::vector<LearnerGroup> groups = SampleGroups(init, 1.0, 3);
  const int64_t chosen[] = {3, 1};
  groups[1].episodes[0].turns[0].routes.Add(2, 1, chosen, 2);
  const nlohmann::json j = GroupsToJson(groups);
  Result<std::vector<LearnerGroup>> back =
      GroupsFromJson(nlohmann::json::from_msgpack(nlohmann::json::to_msgpack(j)));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(GroupsToJson(back.value()), j);
  EXPECT_TRUE(back.value()[1].episodes[0].turns[0].routes == groups[1].episodes[0].turns[0].routes);
  EXPECT_FALSE(GroupsFromJson(nlohmann::json::parse(R"([{"v": 1}])")).ok());
}

// Router replay: the routes reach every rank with the groups. Without them a worker rank
// routed its micro-batches itself, so the two ranks trained on different routes and their
// summed start-of-update log-probs left the actor's.
TEST(LearnerRanks, RoutesReachEveryRank) {
  model::ModelConfig cfg = TinyMoeConfig();
  cfg.num_experts_per_tok = 1;  // the router's weights do not enter the output
  model::Qwen3Model actor(cfg);
  actor->InitWeights(6);
  int64_t entries = 0;
  const std::vector<LearnerGroup> groups = RoutedGroups(actor, &entries);
  model::Qwen3Model init = Copy(actor);
  RerouteLayerOne(init, 7);
  LearnerOptions o;
  o.router_replay = true;
  o.router_replay_trust = 1.0;
  o.micro_batch_tokens = 20;  // several micro-batches: each rank computes some
  Learner one(Copy(init), o);
  TwoRanks two;
  Learner rank0(Copy(init), o, two.ranks->group());
  ASSERT_TRUE(two.ranks->Setup(rank0, {}).ok());
  Result<StepStats> a = one.Step(groups);
  ASSERT_TRUE(two.ranks->SendStep(groups, rank0.options().lr).ok());
  Result<StepStats> b = rank0.Step(groups);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  EXPECT_LT(a->logprob_gap, 1e-5);
  EXPECT_LT(b->logprob_gap, 1e-5) << "every rank trained on the actor's routes";
  int64_t counted = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    EXPECT_EQ(a->group_routes[g].applied, b->group_routes[g].applied) << "group " << g;
    counted += b->group_routes[g].total();
  }
  EXPECT_EQ(counted, entries) << "the ranks' counts add up to every route once";
  two.ranks->Stop();
  ASSERT_TRUE(two.worker.get().ok());
  EXPECT_LT(MaxWeightDiff(one.model(), rank0.model()), 1e-5);
}

}  // namespace
}  // namespace echelon::learn
