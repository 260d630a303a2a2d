#include "echelon/cli/train_config.h"

#include <cstdlib>
#include <sstream>
#include <thread>

#include "echelon/data/adapter_options.h"
#include "echelon/sched/staleness_gate.h"
#include "echelon/sched/tunables.h"

namespace echelon::cli {
namespace {

// Which processes read a key: the learner (rank 0, and the other ranks the update's keys),
// the actors (through the run spec the learner hands them), `echelon train` alone (how it
// starts its actors), and `echelon plan --from-run` (the run's shape).
constexpr char kLearner[] = "learner";
constexpr char kLearnerActors[] = "learner, actors (run spec)";
constexpr char kLearnerPlan[] = "learner, plan --from-run";
constexpr char kTrain[] = "train (starts the actors)";

// task.*: every registered adapter's own option table.
std::string AdapterOptionsHelp() {
  std::string help = "options of the selected adapter (read by the learner; actors get them in the run spec):";
  for (const std::string& name : data::AdapterNames()) {
    help += "\n      " + name + ":\n";
    help += data::DescribeOptions(*data::AdapterOptionTable(name), "        ");
    help.pop_back();
  }
  return help;
}

}  // namespace

const ConfigSchema& TrainSchema() {
  static const ConfigSchema schema = [] {
    ConfigSchema s;
    s.Int("seed", 1, 0, 1LL << 40, "seeds model init, data order and sampling").ReadBy(kLearnerActors);
    s.String("task.name", "math", "data-plane adapter, by registered name").ReadBy(kLearnerActors);
    s.OpenSection("task.", AdapterOptionsHelp());
    s.String("model.init", "",
             "start from this model directory (Hugging Face Qwen3/Qwen2/Llama with its tokenizer, or an echelon "
             "checkpoint) instead of a new character model; the other model.* keys are then unused").ReadBy(kLearnerActors);
    // A 0.6M-parameter character model learns 2-digit arithmetic on 2 CPU cores in minutes.
    s.Int("model.hidden_size", 128, 8, 65536, "width of the residual stream").ReadBy(kLearnerActors);
    s.Int("model.num_hidden_layers", 3, 1, 256, "decoder layers").ReadBy(kLearnerActors);
    s.Int("model.num_attention_heads", 4, 1, 256, "query heads").ReadBy(kLearnerActors);
    s.Int("model.num_key_value_heads", 2, 1, 256, "key/value heads (GQA); divides the query heads").ReadBy(kLearnerActors);
    s.Int("model.head_dim", 32, 4, 1024, "width of one attention head").ReadBy(kLearnerActors);
    s.Int("model.intermediate_size", 384, 8, 262144, "SwiGLU hidden width").ReadBy(kLearnerActors);
    s.Bool("model.tie_word_embeddings", true, "share the embedding and output matrices (fewer parameters)").ReadBy(kLearnerActors);
    s.Float("model.rope_theta", 10000.0, 1.0, 1e9, "rotary base; short sequences need no large base").ReadBy(kLearnerActors);
    s.Float("model.rms_norm_eps", 1e-6, 1e-12, 1e-2, "RMSNorm epsilon").ReadBy(kLearnerActors);
    s.Int("model.max_position_embeddings", 128, 8, 1 << 20, "longest prompt + completion").ReadBy(kLearnerActors);
    // The warm-start must leave room: RL plateaus when it starts from a strong policy.
    s.Int("warmstart.steps", 450, 0, 1000000, "supervised steps before RL (0 skips)").ReadBy(kLearner);
    s.Int("warmstart.batch_size", 64, 1, 65536, "demonstrations per supervised step").ReadBy(kLearner);
    s.Float("warmstart.lr", 1e-3, 0.0, 1.0, "AdamW learning rate of the warm-start").ReadBy(kLearner);
    s.Int("rl.steps", 1500, 1, 100000000, "learner updates (policy versions) to run").ReadBy(kLearner);
    s.Int("rl.groups_per_step", 32, 1, 1 << 20, "B: prompt groups per update").ReadBy(kLearnerPlan);
    s.Int("rl.group_size", 8, 2, 4096, "G: samples per prompt (GRPO group)").ReadBy(kLearnerPlan);
    // 3e-4 learns steadily on the tiny model; 1e-3 collapsed in the prototype.
    s.Float("rl.lr", 3e-4, 0.0, 1.0, "AdamW learning rate of RL").ReadBy(kLearner);
    s.Float("rl.weight_decay", 0.0, 0.0, 1.0, "AdamW decoupled weight decay").ReadBy(kLearner);
    s.Float("rl.max_grad_norm", 1.0, 0.0, 1e6, "gradient clipping (global L2 norm)").ReadBy(kLearner);
    s.Float("rl.clip_low", 0.2, 0.0, 1.0, "PPO clip: ratio floor 1 - clip_low").ReadBy(kLearner);
    s.Float("rl.clip_high", 0.28, 0.0, 10.0, "PPO clip: ratio ceiling 1 + clip_high (DAPO clip-higher)").ReadBy(kLearner);
    s.Float("rl.clip_ratio_c", 3.0, 1.0, 1000.0,
            "dual clip: where the advantage A < 0 the token objective is at least c A, which bounds the "
            "gradient of a token whatever behaviour log-prob a worker claims").ReadBy(kLearner);
    s.Float("rl.kl_coef", 0.0, 0.0, 100.0, "KL-to-reference (the warm-start policy) coefficient; 0 = off").ReadBy(kLearner);
    s.String("rl.correction", "none", "off-policy correction for stale rollouts", {"none", "tis", "decoupled", "icepop", "m2po"}).ReadBy(kLearner);
    s.Float("rl.tis_cap", 2.0, 1.0, 1000.0, "C: cap of the truncated importance weight").ReadBy(kLearner);
    s.Float("rl.decoupled_cap", 5.0, 1.0, 1000.0,
            "decoupled: tokens whose behaviour weight pi_prox / pi_behav exceeds this are dropped").ReadBy(kLearner);
    s.Float("rl.icepop_beta", 2.0, 1.0, 1000.0,
            "icepop: tokens whose behaviour weight pi_prox / pi_behav leaves [1/beta, beta] are dropped").ReadBy(kLearner);
    s.Float("rl.m2po_tau", 0.04, 1e-6, 100.0,
            "m2po: the largest (log pi_prox / pi_behav)^2 tokens are masked until the rest's mean is at most this").ReadBy(kLearner);
    s.Float("rl.router_aux_coef", 0.0, 0.0, 10.0,
            "mixture-of-experts models: weight of the router's load-balancing loss (transformers' Qwen3-MoE uses "
            "0.001); 0: off").ReadBy(kLearner);
    s.Int("rl.minibatches", 1, 1, 1024,
          "optimizer steps per update over minibatches of whole groups; > 1 makes the PPO clip a trust "
          "region around the update's starting policy (pi_prox of the tis / decoupled corrections)").ReadBy(kLearner);
    s.Bool("rl.scale_by_std", true, "divide group advantages by the group's reward std (GRPO)").ReadBy(kLearner);
    // Where and how the update runs. fp32 on a CPU: bf16 is ~28x slower than fp32 there.
    s.String("learner.device", "cpu", "where the update runs: cpu, cuda or cuda:N (a CUDA LibTorch is needed)").ReadBy(kLearner);
    s.String("learner.precision", "fp32",
             "fp32, or bf16: bf16 parameters and activations with fp32 master weights and AdamW state",
             {"fp32", "bf16"}).ReadBy(kLearner);
    s.Int("learner.micro_batch_tokens", 0, 0, int64_t{1} << 40,
          "token budget of one forward/backward, padding included (gradients accumulated; rows sorted by "
          "length, packed or padded per micro-batch); 0: the whole minibatch at once").ReadBy(kLearner);
    s.Bool("learner.pack_sequences", true,
           "padding-free update: sequences packed back to back (attention kept inside each) where that removes "
           "at least an eighth of the rows; false pads every row to the longest").ReadBy(kLearner);
    s.Int("learner.ranks", 1, 1, 1024,
          "data-parallel learner ranks on this host (c10d Gloo); across hosts set torchrun's RANK, WORLD_SIZE, "
          "MASTER_ADDR, MASTER_PORT instead").ReadBy(kLearner);
    s.Bool("learner.shard_optimizer", false,
           "with several learner ranks, each keeps 1/ranks of the AdamW state (ZeRO stage 1)").ReadBy(kLearner);
    // Long enough for rank 0's evaluation and checkpoint between updates, while the others
    // wait; a rank that dies is noticed at once by its closed connection, not by this.
    s.Float("learner.rank_timeout_seconds", 1800.0, 1.0, 86400.0,
            "the learner ranks give up on a collective operation after this long").ReadBy(kLearner);
    s.String("rl.staleness", "2",
             "S: a rollout from version x is used at step t only if t - x <= S (an integer in [0, 1000]), or auto: "
             "the run moves S itself (rl.staleness_* below)").ReadBy(kLearnerPlan);
    // rl.staleness: auto (sched/staleness_control.h has the rules and the reasons for the defaults).
    s.Int("rl.staleness_start", 4, 0, 1000, "auto: S at the first update").ReadBy(kLearner);
    s.Int("rl.staleness_min", 0, 0, 1000, "auto: the smallest S").ReadBy(kLearner);
    s.Int("rl.staleness_max", 64, 0, 1000, "auto: the largest S").ReadBy(kLearner);
    s.Float("rl.staleness_ess_min", 0.9, 0.0, 1.0,
            "auto: S halves when the importance weights' mean ESS fraction over a window is below this").ReadBy(kLearner);
    s.Float("rl.staleness_busy_target", 0.95, 0.0, 1.0,
            "auto: S grows by one when the learner's busy share over a window is below this (and the data is healthy)").ReadBy(kLearner);
    s.Int("rl.staleness_window", 4, 1, 10000, "auto: updates per decision").ReadBy(kLearner);
    s.Bool("rl.staleness_couple_lr", true, "auto: scale the learning rate by start / S above the starting S").ReadBy(kLearner);
    s.Int("rl.publish_period", 0, 0, 1000,
          "kappa: publish a snapshot every kappa steps (0: max(1, S - 1); 1 with rl.staleness: auto)").ReadBy(kLearnerPlan);
    s.Int("rollout.actors", 1, 0, 256, "rollout workers that `echelon train` starts (remote actors may join too)").ReadBy(kTrain);
    // Processes over loopback gRPC are what a multi-host run does, so `train` exercises it;
    // threads skip the network and are what the unit tests use.
    s.String("rollout.transport", "processes", "how `echelon train` runs its actors", {"processes", "threads"}).ReadBy(kTrain);
    s.Int("rollout.wait_for_actors", 0, 0, 1000000,
          "with remote actors: hold the first update until this many actors have registered (0: start at once)").ReadBy(kLearner);
    s.String("rollout.snapshot_transport", "broadcast",
             "how remote actors get snapshots: peer-assisted broadcast (falls back to direct) or direct pulls",
             {"broadcast", "direct"}).ReadBy(kLearner);
    s.Float("rollout.temperature", 1.0, 0.0, 10.0, "sampling temperature (the learner uses the same)").ReadBy(kLearnerActors);
    s.Float("rollout.top_p", 1.0, 0.0, 1.0, "nucleus sampling mass").ReadBy(kLearnerActors);
    s.Int("rollout.top_k", 0, 0, 1 << 30, "sample among the k most likely tokens (0: off)").ReadBy(kLearnerActors);
    s.Float("rollout.min_p", 0.0, 0.0, 1.0, "drop tokens below min_p x the most likely one's probability (0: off)").ReadBy(kLearnerActors);
    s.Int("rollout.max_new_tokens", 6, 1, 1 << 20, "completion length limit").ReadBy(kLearnerActors);
    s.Int("rollout.slots", 0, 0, 1 << 20,
          "sequences the builtin engine decodes at once, a finished one's slot refilled at once (continuous "
          "batching); bounds its KV cache (0: every row of a work item)").ReadBy(kLearnerActors);
    s.Bool("rollout.chat", false,
           "give each prompt as a user turn of the model's chat template (model.init instruct models; Qwen3 thinking off)").ReadBy(kLearnerActors);
    // Reasons for both defaults: sched/tunables.h.
    s.Float("rollout.lease_seconds", sched::kDefaultLeaseSeconds, 0.1, 86400.0,
            "a group not returned in this time is re-issued (a dead actor's groups go sooner, at eviction)").ReadBy(kLearner);
    s.Int("rollout.max_leases_per_worker", sched::kMaxLeasesPerWorker, 0, 1 << 20,
          "groups one worker's actors may hold at once (0: no cap); a worker that takes work and never "
          "returns it holds at most this much of the admission window").ReadBy(kLearner);
    s.Float("rollout.stall_timeout_seconds", sched::kDefaultStallTimeoutSeconds, 1.0, 86400.0,
            "abort when no rollout arrives for this long").ReadBy(kLearner);
    s.Float("rollout.verify_fraction", 0.05, 0.0, 1.0,
            "fraction of groups whose behaviour log-probs the learner recomputes under the claimed version "
            "(every group of an actor caught forging); a mismatch refuses the group").ReadBy(kLearner);
    s.Float("rollout.verify_tolerance", 0.02, 0.0, 100.0,
            "largest mean |recomputed - claimed| log-prob of a verified group (honest actors' gap: verify_gap_max)").ReadBy(kLearner);
    s.Int("rollout.slow_actors", 0, 0, 256, "how many actors run slowed down (heterogeneity experiments)").ReadBy(kTrain);
    s.Float("rollout.slowdown", 1.0, 1.0, 1000.0, "slow actors take this many times longer per group").ReadBy(kTrain);
    s.Int("eval.every", 250, 0, 100000000, "held-out greedy evaluation every N steps (0: start and end only)").ReadBy(kLearner);
    s.Int("checkpoint.every", 50, 0, 100000000,
          "save a resumable checkpoints/step-N every N steps, and on SIGINT/SIGTERM (0: only then and at the end)").ReadBy(kLearner);
    s.Int("checkpoint.keep", 3, 1, 1000000, "resumable step-N checkpoints kept (older ones are deleted)").ReadBy(kLearner);
    return s;
  }();
  return schema;
}

Result<RunOptions> RunOptionsFromConfig(const Config& cfg) {
  RunOptions o;
  o.seed = static_cast<uint64_t>(cfg.Int("seed"));
  o.task_name = cfg.String("task.name");
  o.task_options = cfg.Section("task.");
  if (o.task_options.count("seed") == 0) o.task_options["seed"] = std::to_string(o.seed);

  o.model_init = cfg.String("model.init");
  model::ModelConfig& m = o.model;
  m.hidden_size = cfg.Int("model.hidden_size");
  m.num_hidden_layers = cfg.Int("model.num_hidden_layers");
  m.num_attention_heads = cfg.Int("model.num_attention_heads");
  m.num_key_value_heads = cfg.Int("model.num_key_value_heads");
  m.head_dim = cfg.Int("model.head_dim");
  m.intermediate_size = cfg.Int("model.intermediate_size");
  m.tie_word_embeddings = cfg.Bool("model.tie_word_embeddings");
  m.rope_theta = cfg.Float("model.rope_theta");
  m.rms_norm_eps = cfg.Float("model.rms_norm_eps");
  m.max_position_embeddings = cfg.Int("model.max_position_embeddings");
  if (m.num_attention_heads % m.num_key_value_heads != 0)
    return InvalidArgument(cfg.source() + ": model.num_attention_heads (" + std::to_string(m.num_attention_heads) +
                           ") must be a multiple of model.num_key_value_heads (" +
                           std::to_string(m.num_key_value_heads) + ")");

  o.warmstart.steps = cfg.Int("warmstart.steps");
  o.warmstart.batch_size = cfg.Int("warmstart.batch_size");
  o.warmstart.lr = cfg.Float("warmstart.lr");
  o.warmstart.seed = o.seed;

  learn::LearnerOptions& l = o.learner;
  l.lr = cfg.Float("rl.lr");
  l.weight_decay = cfg.Float("rl.weight_decay");
  l.max_grad_norm = cfg.Float("rl.max_grad_norm");
  l.loss.clip_low = cfg.Float("rl.clip_low");
  l.loss.clip_high = cfg.Float("rl.clip_high");
  l.loss.kl_coef = cfg.Float("rl.kl_coef");
  ECHELON_ASSIGN_OR_RETURN(l.loss.correction, learn::ParseCorrection(cfg.String("rl.correction")));
  l.loss.clip_ratio_c = cfg.Float("rl.clip_ratio_c");
  l.loss.tis_cap = cfg.Float("rl.tis_cap");
  l.loss.decoupled_cap = cfg.Float("rl.decoupled_cap");
  l.loss.icepop_beta = cfg.Float("rl.icepop_beta");
  l.loss.m2po_tau = cfg.Float("rl.m2po_tau");
  l.router_aux_coef = cfg.Float("rl.router_aux_coef");
  l.scale_by_std = cfg.Bool("rl.scale_by_std");
  l.minibatches = cfg.Int("rl.minibatches");
  l.device = cfg.String("learner.device");
  if (Status st = model::CheckDevice(l.device); !st.ok()) return st.WithContext(cfg.source() + ": learner.device");
  ECHELON_ASSIGN_OR_RETURN(l.precision, learn::ParsePrecision(cfg.String("learner.precision")));
  l.micro_batch_tokens = cfg.Int("learner.micro_batch_tokens");
  l.pack_sequences = cfg.Bool("learner.pack_sequences");
  o.learner_ranks = cfg.Int("learner.ranks");
  o.rank_timeout_seconds = cfg.Float("learner.rank_timeout_seconds");
  l.shard_optimizer = cfg.Bool("learner.shard_optimizer");
  const unsigned cores = std::thread::hardware_concurrency();
  if (o.learner_ranks > 1 && l.device == "cpu" && cores > 0 && o.learner_ranks > static_cast<int64_t>(cores))
    return InvalidArgument(cfg.source() + ": learner.ranks (" + std::to_string(o.learner_ranks) +
                           ") exceeds this machine's " + std::to_string(cores) +
                           " cores; more ranks than cores only share them (run ranks on more hosts)");
  l.temperature = cfg.Float("rollout.temperature");
  if (l.temperature == 0.0)
    return InvalidArgument(cfg.source() + ": rollout.temperature = 0 (greedy) gives every group the same samples; "
                           "GRPO needs temperature > 0");

  o.steps = cfg.Int("rl.steps");
  o.groups_per_step = cfg.Int("rl.groups_per_step");
  o.group_size = cfg.Int("rl.group_size");
  const std::string& staleness = cfg.String("rl.staleness");
  if (staleness == "auto") {
    sched::StalenessControlOptions& c = o.staleness_control.emplace();
    c.start = cfg.Int("rl.staleness_start");
    c.min = cfg.Int("rl.staleness_min");
    c.max = cfg.Int("rl.staleness_max");
    c.ess_min = cfg.Float("rl.staleness_ess_min");
    c.busy_target = cfg.Float("rl.staleness_busy_target");
    c.window = cfg.Int("rl.staleness_window");
    c.couple_lr = cfg.Bool("rl.staleness_couple_lr");
    if (!(c.min <= c.start && c.start <= c.max))
      return InvalidArgument(cfg.source() + ": rl.staleness: auto needs rl.staleness_min (" + std::to_string(c.min) +
                             ") <= rl.staleness_start (" + std::to_string(c.start) + ") <= rl.staleness_max (" +
                             std::to_string(c.max) + ")");
    o.staleness = c.start;
  } else {
    char* end = nullptr;
    const long long s = std::strtoll(staleness.c_str(), &end, 10);
    if (staleness.empty() || *end != '\0' || s < 0 || s > 1000)
      return InvalidArgument(cfg.source() + ": rl.staleness = '" + staleness +
                             "' is invalid; expected an integer in [0, 1000] or auto");
    o.staleness = s;
  }
  // With S moving, a snapshot every update keeps every S reachable.
  const int64_t smallest_s = o.staleness_control ? o.staleness_control->min : o.staleness;
  o.publish_period = cfg.Int("rl.publish_period");
  if (o.publish_period == 0) o.publish_period = o.staleness_control ? 1 : sched::DefaultPublishPeriod(o.staleness);
  if (o.publish_period > smallest_s + 1)
    return InvalidArgument(cfg.source() + ": rl.publish_period (" + std::to_string(o.publish_period) +
                           ") must be at most " + (o.staleness_control ? "rl.staleness_min" : "rl.staleness") +
                           " + 1 (" + std::to_string(smallest_s + 1) +
                           "): a snapshot older than S versions makes its rollouts unusable");
  o.actors = cfg.Int("rollout.actors");
  o.thread_actors = cfg.String("rollout.transport") == "threads";
  o.temperature = l.temperature;
  o.top_p = cfg.Float("rollout.top_p");
  o.top_k = cfg.Int("rollout.top_k");
  o.min_p = cfg.Float("rollout.min_p");
  o.max_new_tokens = cfg.Int("rollout.max_new_tokens");
  o.slots = cfg.Int("rollout.slots");
  if (l.micro_batch_tokens > 0 && l.micro_batch_tokens < o.max_new_tokens + 1)
    return InvalidArgument(cfg.source() + ": learner.micro_batch_tokens (" + std::to_string(l.micro_batch_tokens) +
                           ") is smaller than one sequence (a prompt token + rollout.max_new_tokens = " +
                           std::to_string(o.max_new_tokens + 1) + "); raise it or use 0");
  o.chat = cfg.Bool("rollout.chat");
  if (o.chat && o.model_init.empty())
    return InvalidArgument(cfg.source() + ": rollout.chat needs model.init (a new character model has no chat template)");
  o.lease_seconds = cfg.Float("rollout.lease_seconds");
  o.max_leases_per_worker = cfg.Int("rollout.max_leases_per_worker");
  o.stall_timeout_seconds = cfg.Float("rollout.stall_timeout_seconds");
  o.verify_fraction = cfg.Float("rollout.verify_fraction");
  o.verify_tolerance = cfg.Float("rollout.verify_tolerance");
  const int64_t slow = cfg.Int("rollout.slow_actors");
  if (slow > o.actors)
    return InvalidArgument(cfg.source() + ": rollout.slow_actors (" + std::to_string(slow) +
                           ") exceeds rollout.actors (" + std::to_string(o.actors) + ")");
  o.actor_slowdowns.assign(o.actors, 1.0);
  for (int64_t i = 0; i < slow; ++i) o.actor_slowdowns[o.actors - 1 - i] = cfg.Float("rollout.slowdown");
  o.eval_every = cfg.Int("eval.every");
  o.checkpoint_every = cfg.Int("checkpoint.every");
  o.checkpoint_keep = cfg.Int("checkpoint.keep");
  o.snapshot_broadcast = cfg.String("rollout.snapshot_transport") == "broadcast";
  o.wait_for_actors = cfg.Int("rollout.wait_for_actors");
  return o;
}

}  // namespace echelon::cli
