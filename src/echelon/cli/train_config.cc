#include "echelon/cli/train_config.h"

#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>
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
  std::string help =
      "options of the selected adapter (read by the learner; actors get them in the run spec, less what only the "
      "learner reads: seed, secret, server and every *_file and *_url):";
  for (const std::string& name : data::AdapterNames()) {
    help += "\n      " + name + ":\n";
    help += data::DescribeOptions(*data::AdapterOptionTable(name), "        ");
    help.pop_back();
  }
  return help;
}

// Where a key's value goes: writes it into RunOptions, or refuses it naming the key. Run in
// declaration order, so a key may depend on one declared before it (rl.staleness_* on
// rl.staleness).
using Apply = std::function<Status(const Config& cfg, const std::string& key, RunOptions& o)>;

// A plain member: `AT(learner.loss.clip_low)` reads the key by the member's type.
template <typename Member>
Apply Into(Member member) {
  return [member](const Config& cfg, const std::string& key, RunOptions& o) {
    auto& field = member(o);
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, bool>) field = cfg.Bool(key);
    else if constexpr (std::is_integral_v<T>) field = static_cast<T>(cfg.Int(key));
    else if constexpr (std::is_floating_point_v<T>) field = cfg.Float(key);
    else field = cfg.String(key);
    return Status::Ok();
  };
}
#define AT(path) Into([](RunOptions& o) -> auto& { return o.path; })
// rl.staleness_*: a member of the controller's options, used with rl.staleness: auto only.
#define AUTO(member)                                                                     \
  Apply([](const Config& cfg, const std::string& key, RunOptions& o) {                    \
    if (!o.staleness_control) return Status::Ok();                                        \
    return Into([](RunOptions& r) -> auto& { return r.staleness_control->member; })(cfg, key, o); \
  })

Status ReadCorrection(const Config& cfg, const std::string& key, RunOptions& o) {
  ECHELON_ASSIGN_OR_RETURN(o.learner.loss.correction, learn::ParseCorrection(cfg.String(key)));
  return Status::Ok();
}

Status ReadSecretSource(const Config& cfg, const std::string& key, RunOptions& o) {
  o.secret_from_seed = cfg.String(key) == "seed";
  return Status::Ok();
}

Status ReadRatio(const Config& cfg, const std::string& key, RunOptions& o) {
  ECHELON_ASSIGN_OR_RETURN(o.learner.loss.ratio, learn::ParseRatioLevel(cfg.String(key)));
  return Status::Ok();
}

Status ReadLossAggregation(const Config& cfg, const std::string& key, RunOptions& o) {
  ECHELON_ASSIGN_OR_RETURN(o.learner.loss_aggregation, learn::ParseLossAggregation(cfg.String(key)));
  return Status::Ok();
}

Status ReadPrecision(const Config& cfg, const std::string& key, RunOptions& o) {
  ECHELON_ASSIGN_OR_RETURN(o.learner.precision, learn::ParsePrecision(cfg.String(key)));
  return Status::Ok();
}

Status ReadShard(const Config& cfg, const std::string& key, RunOptions& o) {
  ECHELON_ASSIGN_OR_RETURN(o.learner.shard, learn::ParseShard(cfg.String(key)));
  return Status::Ok();
}

// learner.lora.rank with .alpha and .targets (declared before it, read here).
Status ReadLora(const Config& cfg, const std::string& key, RunOptions& o) {
  o.lora.rank = cfg.Int(key);
  if (!o.lora.on()) return Status::Ok();
  if (o.learner.shard == learn::Shard::kParams)
    return InvalidArgument(cfg.source() + ": " + key + ": LoRA does not take learner.shard: params (the adapters' "
                           "state is small: shard none or optimizer)");
  o.lora.alpha = cfg.Float("learner.lora.alpha");
  Result<std::vector<std::string>> targets = model::ParseLoraTargets(cfg.String("learner.lora.targets"));
  if (!targets.ok()) return targets.status().WithContext(cfg.source() + ": learner.lora.targets");
  o.lora.targets = std::move(targets).value();
  return Status::Ok();
}

Status ReadDevice(const Config& cfg, const std::string& key, RunOptions& o) {
  o.learner.device = cfg.String(key);
  if (Status st = model::CheckDevice(o.learner.device); !st.ok()) return st.WithContext(cfg.source() + ": " + key);
  return Status::Ok();
}

// "auto" engages the controller (its rl.staleness_* keys follow); otherwise an integer S.
Status ReadStaleness(const Config& cfg, const std::string& key, RunOptions& o) {
  const std::string& text = cfg.String(key);
  if (text == "auto") {
    o.staleness_control.emplace();
    return Status::Ok();
  }
  char* end = nullptr;
  const long long s = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || s < 0 || s > 1000)
    return InvalidArgument(cfg.source() + ": " + key + " = '" + text +
                           "' is invalid; expected an integer in [0, 1000] or auto");
  o.staleness = s;
  return Status::Ok();
}

Status ReadTransport(const Config& cfg, const std::string& key, RunOptions& o) {
  o.thread_actors = cfg.String(key) == "threads";
  return Status::Ok();
}

Status ReadSnapshotTransport(const Config& cfg, const std::string& key, RunOptions& o) {
  o.snapshot_broadcast = cfg.String(key) == "broadcast";
  return Status::Ok();
}

// rollout.slow_actors with rollout.slowdown: the last slow_actors actors run that much slower.
Status ReadSlowActors(const Config& cfg, const std::string& key, RunOptions& o) {
  const int64_t slow = cfg.Int(key);
  if (slow > o.actors)
    return InvalidArgument(cfg.source() + ": " + key + " (" + std::to_string(slow) + ") exceeds rollout.actors (" +
                           std::to_string(o.actors) + ")");
  o.actor_slowdowns.assign(o.actors, 1.0);
  for (int64_t i = 0; i < slow; ++i) o.actor_slowdowns[o.actors - 1 - i] = cfg.Float("rollout.slowdown");
  return Status::Ok();
}

// The schema and each key's Apply, declared together.
struct TrainKeys {
  ConfigSchema schema;
  std::vector<std::pair<std::string, Apply>> apply;

  // `to` nullptr: another key's Apply reads this one (a comment at the declaration says which).
  TrainKeys& Int(const char* key, int64_t def, int64_t min, int64_t max, const char* help, const char* readers,
                 Apply to) {
    schema.Int(key, def, min, max, help).ReadBy(readers);
    return Bind(key, std::move(to));
  }
  TrainKeys& Float(const char* key, double def, double min, double max, const char* help, const char* readers,
                   Apply to) {
    schema.Float(key, def, min, max, help).ReadBy(readers);
    return Bind(key, std::move(to));
  }
  TrainKeys& Bool(const char* key, bool def, const char* help, const char* readers, Apply to) {
    schema.Bool(key, def, help).ReadBy(readers);
    return Bind(key, std::move(to));
  }
  TrainKeys& String(const char* key, const char* def, const char* help, const char* readers, Apply to) {
    return String(key, def, help, {}, readers, std::move(to));
  }
  TrainKeys& String(const char* key, const char* def, const char* help, std::vector<std::string> choices,
                    const char* readers, Apply to) {
    schema.String(key, def, help, std::move(choices)).ReadBy(readers);
    return Bind(key, std::move(to));
  }

 private:
  TrainKeys& Bind(const char* key, Apply to) {
    apply.emplace_back(key, std::move(to));
    return *this;
  }
};

const TrainKeys& Keys() {
  static const TrainKeys keys = [] {
    TrainKeys k;
    k.Int("seed", 1, 0, 1LL << 40, "seeds model init, data order and held-out sets (and, with secret: seed, sampling)", kLearner, AT(seed));
    k.String("secret", "random",
             "what the learner's secret comes from, from which each group's sampling seed and a task's training deals "
             "or episodes are drawn: random (32 bytes from the OS, kept in the run directory's `secret` file; a worker "
             "cannot know a group's draws before the group is handed to it) or seed (derived from `seed`: a run "
             "repeats exactly, and anyone who knows the seed knows every draw)",
             {"random", "seed"}, kLearner, ReadSecretSource);
    k.String("task.name", "math", "data-plane adapter, by registered name", kLearnerActors, AT(task_name));
    k.schema.OpenSection("task.", AdapterOptionsHelp());
    k.String("model.init", "",
             "start from this model directory (Hugging Face Qwen3/Qwen2/Llama with its tokenizer, or an echelon "
             "checkpoint) instead of a new character model; the other model.* keys are then unused", kLearnerActors, AT(model_init));
    // A 0.6M-parameter character model learns 2-digit arithmetic on 2 CPU cores in minutes.
    k.Int("model.hidden_size", 128, 8, 65536, "width of the residual stream", kLearnerActors, AT(model.hidden_size));
    k.Int("model.num_hidden_layers", 3, 1, 256, "decoder layers", kLearnerActors, AT(model.num_hidden_layers));
    k.Int("model.num_attention_heads", 4, 1, 256, "query heads", kLearnerActors, AT(model.num_attention_heads));
    k.Int("model.num_key_value_heads", 2, 1, 256, "key/value heads (GQA); divides the query heads", kLearnerActors, AT(model.num_key_value_heads));
    k.Int("model.head_dim", 32, 4, 1024, "width of one attention head", kLearnerActors, AT(model.head_dim));
    k.Int("model.intermediate_size", 384, 8, 262144, "SwiGLU hidden width", kLearnerActors, AT(model.intermediate_size));
    k.Bool("model.tie_word_embeddings", true, "share the embedding and output matrices (fewer parameters)", kLearnerActors, AT(model.tie_word_embeddings));
    k.Float("model.rope_theta", 10000.0, 1.0, 1e9, "rotary base; short sequences need no large base", kLearnerActors, AT(model.rope_theta));
    k.Float("model.rms_norm_eps", 1e-6, 1e-12, 1e-2, "RMSNorm epsilon", kLearnerActors, AT(model.rms_norm_eps));
    k.Int("model.max_position_embeddings", 128, 8, 1 << 20, "longest prompt + completion", kLearnerActors, AT(model.max_position_embeddings));
    // The warm-start must leave room: RL plateaus when it starts from a strong policy.
    k.Int("warmstart.steps", 450, 0, 1000000, "supervised steps before RL (0 skips)", kLearner, AT(warmstart.steps));
    k.Int("warmstart.batch_size", 64, 1, 65536, "demonstrations per supervised step", kLearner, AT(warmstart.batch_size));
    k.Float("warmstart.lr", 1e-3, 0.0, 1.0, "AdamW learning rate of the warm-start", kLearner, AT(warmstart.lr));
    k.Int("rl.steps", 1500, 1, 100000000, "learner updates (policy versions) to run", kLearner, AT(steps));
    k.Int("rl.groups_per_step", 32, 1, 1 << 20, "B: prompt groups per update", kLearnerPlan, AT(groups_per_step));
    k.Int("rl.group_size", 8, 2, 4096, "G: samples per prompt (GRPO group)", kLearnerPlan, AT(group_size));
    // 3e-4 learns steadily on the tiny model; 1e-3 collapsed in the prototype.
    k.Float("rl.lr", 3e-4, 0.0, 1.0, "AdamW learning rate of RL", kLearner, AT(learner.lr));
    k.Float("rl.weight_decay", 0.0, 0.0, 1.0, "AdamW decoupled weight decay", kLearner, AT(learner.weight_decay));
    k.Float("rl.max_grad_norm", 1.0, 0.0, 1e6, "gradient clipping (global L2 norm)", kLearner, AT(learner.max_grad_norm));
    k.Float("rl.clip_low", 0.2, 0.0, 1.0, "PPO clip: ratio floor 1 - clip_low", kLearner, AT(learner.loss.clip_low));
    k.Float("rl.clip_high", 0.28, 0.0, 10.0, "PPO clip: ratio ceiling 1 + clip_high (DAPO clip-higher)", kLearner, AT(learner.loss.clip_high));
    k.Float("rl.clip_ratio_c", 3.0, 1.0, 1000.0,
            "dual clip: where the advantage A < 0 the token objective is at least c A, which bounds the "
            "gradient of a token whatever behaviour log-prob a worker claims", kLearner, AT(learner.loss.clip_ratio_c));
    k.Float("rl.kl_coef", 0.0, 0.0, 100.0, "KL-to-reference (the warm-start policy) coefficient; 0 = off", kLearner, AT(learner.loss.kl_coef));
    k.String("rl.correction", "none", "off-policy correction for stale rollouts", {"none", "tis", "decoupled", "icepop", "m2po"}, kLearner, ReadCorrection);
    k.Float("rl.tis_cap", 2.0, 1.0, 1000.0, "C: cap of the truncated importance weight", kLearner, AT(learner.loss.tis_cap));
    k.Float("rl.decoupled_cap", 5.0, 1.0, 1000.0,
            "decoupled: tokens whose behaviour weight pi_prox / pi_behav exceeds this are dropped", kLearner, AT(learner.loss.decoupled_cap));
    k.Float("rl.icepop_beta", 2.0, 1.0, 1000.0,
            "icepop: tokens whose behaviour weight pi_prox / pi_behav leaves [1/beta, beta] are dropped", kLearner, AT(learner.loss.icepop_beta));
    k.Float("rl.m2po_tau", 0.04, 1e-6, 100.0,
            "m2po: the budget of the harmful tokens' mean (log pi_theta / pi_behav)^2 that sets its clip's width", kLearner, AT(learner.loss.m2po_tau));
    k.Float("rl.max_group_share", 0.0, 0.0, 1.0,
            "the largest share of an update's loss one group may carry whatever its completions' length (0: no "
            "cap); with untrusted workers, a few times 1 / rl.groups_per_step bounds a worker's long groups",
            kLearner, AT(learner.max_group_share));
    k.Bool("rl.m2po_within_clip", false,
           "m2po: its clip is never wider than rl.clip_low / rl.clip_high (the budget only tightens it); "
           "rl.staleness: auto turns it on", kLearner, AT(learner.loss.m2po_within_clip));
    k.Float("rl.router_aux_coef", 0.0, 0.0, 10.0,
            "mixture-of-experts models: weight of the router's load-balancing loss (transformers' Qwen3-MoE uses "
            "0.001); 0: off", kLearner, AT(learner.router_aux_coef));
    k.Bool("rl.router_replay", false,
           "mixture-of-experts models: actors send the experts they chose where the choice was close and the "
           "learner trains with those routes (R3, rollout routing replay); the rest it recomputes", kLearner,
           AT(learner.router_replay));
    k.Float("rl.router_replay_margin", 0.1, 0.0, 1e9,
            "router replay: an actor sends a position's routes when the router logit of its k-th chosen expert is "
            "within this many nats of the best one left out, where another engine's arithmetic may choose "
            "otherwise (0.1 covered every bf16-against-fp32 disagreement in bench/route_replay_bench; 1e9: every "
            "route)", kLearner, AT(router_replay_margin));
    k.Float("rl.router_replay_trust", 0.1, 0.0, 1.0,
            "router replay: the learner trains with a sent route only where its own router gives the route's "
            "experts at most this much less probability than its own top-k; a worse claim is refused and counted",
            kLearner, AT(learner.router_replay_trust));
    k.Int("rl.minibatches", 1, 1, 1024,
          "optimizer steps per update over minibatches of whole groups; > 1 makes the PPO clip a trust "
          "region around the update's starting policy (pi_prox of the tis / decoupled corrections)", kLearner, AT(learner.minibatches));
    k.Bool("rl.scale_by_std", true, "divide group advantages by the group's reward std (GRPO)", kLearner, AT(learner.scale_by_std));
    k.Bool("rl.dynamic_sampling", false,
           "DAPO's dynamic sampling: groups whose task rewards have no spread are dropped before the update and "
           "more prompts are drawn until the batch is full (within the staleness bound)", kLearner,
           AT(dynamic_sampling));
    k.Int("rl.dynamic_sampling_max", 8, 1, 100000,
          "dynamic sampling drops at most this many x rl.groups_per_step groups for one update; past it, groups "
          "without a spread enter the batch", kLearner, AT(dynamic_sampling_max));
    k.String("rl.loss_aggregation", "token_mean",
             "how token losses add up to an update's: token_mean (every token alike, DAPO), seq_mean_token_mean (every "
             "completion one vote), seq_mean_token_sum_norm (token sums over rollout.max_new_tokens, Dr. GRPO)",
             {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"}, kLearner, ReadLossAggregation);
    k.String("rl.ratio", "token",
             "importance ratios and behaviour weights per token, or per completion (sequence: GSPO's length-normalised "
             "ratio; set rl.clip_low / rl.clip_high to its narrow band, e.g. 0.0003 / 0.0004)",
             {"token", "sequence"}, kLearner, ReadRatio);
    k.Int("rl.overlong.buffer", 0, 0, 1 << 20,
          "DAPO's soft overlong punishment: a completion longer than rollout.max_new_tokens - buffer tokens loses up to "
          "rl.overlong.penalty of its reward, linearly to the limit (0: off)", kLearner, AT(learner.overlong.buffer));
    k.Float("rl.overlong.penalty", 1.0, 0.0, 1000.0, "the overlong punishment at the token limit", kLearner,
            AT(learner.overlong.penalty));
    k.Bool("rl.overlong.filter", false,
           "completions cut at rollout.max_new_tokens (no stop token) carry no loss (DAPO's overlong filtering)",
           kLearner, AT(learner.overlong.filter));
    // Where and how the update runs. fp32 on a CPU: bf16 is ~28x slower than fp32 there.
    k.String("learner.device", "cpu", "where the update runs: cpu, cuda or cuda:N (a CUDA LibTorch is needed)", kLearner, ReadDevice);
    k.String("learner.precision", "fp32",
             "fp32, or bf16: bf16 parameters and activations with fp32 master weights and AdamW state",
             {"fp32", "bf16"}, kLearner, ReadPrecision);
    k.Int("learner.micro_batch_tokens", 0, 0, int64_t{1} << 40,
          "token budget of one forward/backward, padding included (gradients accumulated; rows sorted by "
          "length, packed or padded per micro-batch); 0: the whole minibatch at once", kLearner, AT(learner.micro_batch_tokens));
    k.Bool("learner.pack_sequences", true,
           "padding-free update: sequences packed back to back (attention kept inside each) where that removes "
           "at least an eighth of the rows; false pads every row to the longest", kLearner, AT(learner.pack_sequences));
    k.Int("learner.ranks", 1, 1, 1024,
          "data-parallel learner ranks on this host (c10d Gloo); across hosts set torchrun's RANK, WORLD_SIZE, "
          "MASTER_ADDR, MASTER_PORT instead", kLearner, AT(learner_ranks));
    k.String("learner.shard", "none",
             "what several learner ranks divide: none; optimizer: 1/ranks of the AdamW state each (ZeRO stage 1); "
             "params: 1/ranks of every weight, gradient and AdamW state, each layer gathered while it runs and "
             "recomputed in the backward pass (ZeRO stage 3); rank 0 keeps the whole fp32 weights in host memory. "
             "One rank: nothing is divided",
             {"none", "optimizer", "params"}, kLearner, ReadShard);
    k.Bool("learner.activation_checkpointing", false,
           "keep only each layer's input for the backward pass, which runs the layer again (about a third more "
           "compute, activations of one layer); always on with learner.shard: params over several ranks",
           kLearner, AT(learner.activation_checkpointing));
    // LoRA: learner.lora.rank declared after learner.shard, whose params it refuses.
    k.Float("learner.lora.alpha", 16.0, 1e-6, 1e6, "LoRA: the adapters' output is scaled by alpha / rank", kLearner,
            nullptr);  // read by learner.lora.rank's ReadLora, below
    k.String("learner.lora.targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
             "LoRA: the projections adapted, comma-separated (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
             "down_proj; an MLP target skips a mixture-of-experts layer's experts)", kLearner,
             nullptr);  // read by learner.lora.rank's ReadLora, below
    k.Int("learner.lora.rank", 0, 0, 65536,
          "LoRA: train rank-r adapters on the projections of learner.lora.targets over the frozen model RL starts "
          "from (after the warm-start); snapshots then carry the adapters alone. 0: train every weight",
          kLearnerActors, ReadLora);
    // Long enough for rank 0's evaluation and checkpoint between updates, while the others
    // wait; a rank that dies is noticed at once by its closed connection, not by this.
    k.Float("learner.rank_timeout_seconds", 1800.0, 1.0, 86400.0,
            "the learner ranks give up on a collective operation after this long", kLearner, AT(rank_timeout_seconds));
    k.String("rl.staleness", "2",
             "S: a rollout from version x is used at step t only if t - x <= S (an integer in [0, 1000]), or auto: "
             "the run moves S itself (rl.staleness_* below)", kLearnerPlan, ReadStaleness);
    // rl.staleness: auto (sched/staleness_control.h has the rules and the reasons for the defaults).
    k.Int("rl.staleness_start", 4, 0, 1000, "auto: S at the first update", kLearner, AUTO(start));
    k.Int("rl.staleness_min", 0, 0, 1000, "auto: the smallest S", kLearner, AUTO(min));
    k.Int("rl.staleness_max", 64, 0, 1000, "auto: the largest S", kLearner, AUTO(max));
    k.Float("rl.staleness_ess_min", 0.9, 0.0, 1.0,
            "auto: S halves when the importance weights' mean ESS fraction over a window is below this", kLearner, AUTO(ess_min));
    k.Float("rl.staleness_busy_target", 0.95, 0.0, 1.0,
            "auto: S grows by one when the learner's busy share over a window is below this (and the data is healthy)", kLearner, AUTO(busy_target));
    k.Int("rl.staleness_window", 4, 1, 10000, "auto: updates per decision", kLearner, AUTO(window));
    k.Bool("rl.staleness_couple_lr", true, "auto: scale the learning rate by start / S above the starting S", kLearner, AUTO(couple_lr));
    k.Int("rl.publish_period", 0, 0, 1000,
          "kappa: publish a snapshot every kappa steps (0: max(1, S - 1); 1 with rl.staleness: auto)", kLearnerPlan, AT(publish_period));
    k.Int("rollout.actors", 1, 0, 256, "rollout workers that `echelon train` starts (remote actors may join too)", kTrain, AT(actors));
    // Processes over loopback gRPC are what a multi-host run does, so `train` exercises it;
    // threads skip the network and are what the unit tests use.
    k.String("rollout.transport", "processes", "how `echelon train` runs its actors", {"processes", "threads"}, kTrain, ReadTransport);
    k.Int("rollout.wait_for_actors", 0, 0, 1000000,
          "with remote actors: hold the first update until this many actors have registered (0: start at once)", kLearner, AT(wait_for_actors));
    k.String("rollout.snapshot_transport", "broadcast",
             "how remote actors get snapshots: peer-assisted broadcast (falls back to direct) or direct pulls",
             {"broadcast", "direct"}, kLearner, ReadSnapshotTransport);
    k.Float("rollout.temperature", 1.0, 0.0, 10.0, "sampling temperature (the learner uses the same)", kLearnerActors, AT(temperature));
    k.Float("rollout.top_p", 1.0, 0.0, 1.0, "nucleus sampling mass", kLearnerActors, AT(top_p));
    k.Int("rollout.top_k", 0, 0, 1 << 30, "sample among the k most likely tokens (0: off)", kLearnerActors, AT(top_k));
    k.Float("rollout.min_p", 0.0, 0.0, 1.0, "drop tokens below min_p x the most likely one's probability (0: off)", kLearnerActors, AT(min_p));
    k.Int("rollout.max_new_tokens", 6, 1, 1 << 20, "completion length limit", kLearnerActors, AT(max_new_tokens));
    k.Int("rollout.slots", 0, 0, 1 << 20,
          "sequences the builtin engine decodes at once, a finished one's slot refilled at once (continuous "
          "batching); bounds its KV cache (0: every row of a work item)", kLearnerActors, AT(slots));
    k.Bool("rollout.partial", false,
           "a snapshot published while a group generates is taken at once and the group's unfinished samples "
           "continue on it (interruptible generation); every token records its version (builtin backend)",
           kLearnerActors, AT(partial));
    k.Bool("rollout.chat", false,
           "give each prompt as a user turn of the model's chat template (model.init instruct models)", kLearnerActors, AT(chat));
    k.Bool("rollout.enable_thinking", false,
           "with rollout.chat: the template's thinking mode (Qwen3's enable_thinking; off: an empty think block "
           "opens the answer)", kLearnerActors, AT(enable_thinking));
    // Reasons for both defaults: sched/tunables.h.
    k.Float("rollout.lease_seconds", sched::kDefaultLeaseSeconds, 0.1, 86400.0,
            "a group not returned in this time is re-issued (a dead actor's groups go sooner, at eviction); an actor "
            "that reports progress keeps it up to 10 x as long", kLearner, AT(lease_seconds));
    k.Int("rollout.max_leases_per_worker", sched::kMaxLeasesPerWorker, 0, 1 << 20,
          "groups one worker's actors may hold at once (0: no cap); a worker that takes work and never "
          "returns it holds at most this much of the admission window", kLearner, AT(max_leases_per_worker));
    k.String("rollout.dispatch", "fifo",
             "which waiting group goes to which worker: fifo (in order) or deadline (only a group the worker is "
             "predicted to return before it would go stale, from its measured rate and snapshot lag and the prompt's "
             "measured lengths; long prompts to fast workers, short ones to slow ones: sched/dispatcher.h)",
             {"fifo", "deadline"}, kLearner, AT(dispatch));
    k.Bool("rollout.resume", true,
           "resumable groups: single-turn groups' samples are reported to the learner as they grow (every 10 s), and "
           "a group whose worker was preempted or went silent is continued from there by the next one (verified, "
           "within the staleness bound) instead of from the start", kLearner, AT(resume));
    k.Bool("rollout.untrusted_workers", false,
           "the run is open to workers it does not trust: `echelon learner` then refuses --insecure and a token file "
           "with one shared token (a worker's name would be its own choice), so every worker needs its own token "
           "(`echelon tokens`)", kLearner, AT(untrusted_workers));
    k.Float("rollout.stall_timeout_seconds", sched::kDefaultStallTimeoutSeconds, 1.0, 86400.0,
            "abort when no rollout arrives for this long", kLearner, AT(stall_timeout_seconds));
    k.Float("rollout.verify_fraction", 0.05, 0.0, 1.0,
            "fraction of groups whose behaviour log-probs the learner recomputes under the claimed version "
            "(every group of an actor caught forging); a mismatch refuses the group", kLearner, AT(verify_fraction));
    k.Float("rollout.verify_tolerance", 0.02, 0.0, 100.0,
            "largest mean |recomputed - claimed| log-prob of a verified group (honest actors' gap: verify_gap_max)", kLearner, AT(verify_tolerance));
    k.Bool("rollout.verify_draws", true,
           "a verified group's tokens must each be the draw its seed, sample and position give under the claimed "
           "version (single-turn tasks; multi-turn turns the learner plays, by each turn's seed and row), so a worker "
           "cannot choose its samples; actors on the openai-http backend "
           "cannot draw them and are refused at start: set false to admit them", kLearner, AT(verify_draws));
    k.Float("rollout.verify_token_tolerance", 1.0, 0.0, 1000.0,
            "largest |recomputed - claimed| log-prob of any one token of a verified group (a sparse lie hides under "
            "the group mean; honest actors' largest: verify_token_gap_max)", kLearner, AT(verify_token_tolerance));
    k.Float("rollout.verify_draw_tolerance", 0.02, 0.0, 1.0,
            "probability mass by which a token may miss its seeded draw and pass (near-ties of another engine's "
            "rounding; counted as verify_near_ties)", kLearner, AT(verify_draw_tolerance));
    k.Int("rollout.verify_memory_mb", 0, 0, int64_t{1} << 30,
          "MiB of older snapshots the verifier keeps in memory besides the newest; the others it keeps in "
          "RUN_DIR/verifier on disk (one per version within the staleness bound) and maps when a check needs one",
          kLearner, AT(verify_memory_mb));
    k.Int("rollout.slow_actors", 0, 0, 256, "how many actors run slowed down (heterogeneity experiments)", kTrain, ReadSlowActors);
    // rollout.slowdown: read by ReadSlowActors.
    k.Float("rollout.slowdown", 1.0, 1.0, 1000.0, "slow actors take this many times longer per group", kTrain, nullptr);
    k.Int("eval.every", 250, 0, 100000000,
          "held-out greedy evaluation, and a round of eval.sets, every N steps (0: start and end only)", kLearner,
          AT(eval_every));
    k.Bool("eval.heldout", true,
           "the learner's greedy held-out accuracy after the warm-start, every eval.every versions and at the end; "
           "false: none (the learner never builds an evaluation copy; eval.sets on the actors measure the run)",
           kLearner, AT(eval_heldout));
    k.schema.OpenSection("eval.sets.",
                         "evaluation sets sampled by the actors every eval.every versions, mean@k and pass@k each: "
                         "eval.sets.NAME.file (the task's held-out file format), eval.sets.NAME.k (samples a prompt, "
                         "default 4, at most 1024) and eval.sets.NAME.temperature (default rollout.temperature)");
    k.String("eval.canaries.file", "",
             "known-answer canary prompts (the task's held-out file format) mixed into training work, which a worker "
             "cannot tell from training groups; each worker's pass rate on them is in actor_stats (canary_pass), "
             "flagged where it differs from the rest of the fleet's (a smaller model, another temperature); never "
             "trained on", kLearner, AT(canary_file));
    k.Float("eval.canaries.share", 0.02, 0.0, 1.0, "the share of new training groups that are canaries", kLearner,
            AT(canary_share));
    k.Int("checkpoint.every", 50, 0, 100000000,
          "save a resumable checkpoints/step-N every N steps, and on SIGINT/SIGTERM (0: only then and at the end)", kLearner, AT(checkpoint_every));
    k.Int("checkpoint.keep", 3, 1, 1000000, "resumable step-N checkpoints kept (older ones are deleted)", kLearner, AT(checkpoint_keep));
    k.Float("checkpoint.shard_mb", 5000.0, 0.001, 1e9,
          "checkpoints/final's weights as Hugging Face's sharded files of at most this many MB (10^6 bytes) each, "
          "listed by model.safetensors.index.json (save_pretrained's max_shard_size); one model.safetensors when "
          "they fit", kLearner, AT(checkpoint_shard_mb));
    return k;
  }();
  return keys;
}

#undef AT
#undef AUTO

// eval.sets.NAME.{file,k,temperature}, in name order; every set needs its file, and takes the
// run's `temperature` unless it names its own.
Result<std::vector<learn::RunOptions::EvalSetOptions>> ReadEvalSets(const Config& cfg, double temperature) {
  std::map<std::string, learn::RunOptions::EvalSetOptions> sets;
  std::set<std::string> own_temperature;
  for (const auto& [key, value] : cfg.Section("eval.sets.")) {
    const std::string where = cfg.source() + ": eval.sets." + key;
    const size_t dot = key.find('.');
    if (dot == std::string::npos || dot == 0)
      return InvalidArgument(where + ": expected eval.sets.NAME.file, .k or .temperature");
    const std::string name = key.substr(0, dot), field = key.substr(dot + 1);
    for (char c : name)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-')
        return InvalidArgument(where + ": a set's name is letters, digits, '_' and '-'");
    learn::RunOptions::EvalSetOptions& set = sets[name];
    set.name = name;
    char* end = nullptr;
    if (field == "file") {
      set.file = value;
    } else if (field == "k") {
      const long long k = std::strtoll(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0' || k < 1 || k > 1024)
        return InvalidArgument(where + " = " + value + ": an integer in [1, 1024]");
      set.k = k;
    } else if (field == "temperature") {
      set.temperature = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0' || !(set.temperature >= 0.0 && set.temperature <= 10.0))
        return InvalidArgument(where + " = " + value + ": a number in [0, 10]");
      own_temperature.insert(name);
    } else {
      return InvalidArgument(where + ": unknown; a set has file, k and temperature");
    }
  }
  std::vector<learn::RunOptions::EvalSetOptions> out;
  for (auto& [name, set] : sets) {
    if (set.file.empty()) return InvalidArgument(cfg.source() + ": eval.sets." + name + ".file is missing");
    if (own_temperature.count(name) == 0) set.temperature = temperature;
    out.push_back(std::move(set));
  }
  return out;
}

}  // namespace

const ConfigSchema& TrainSchema() { return Keys().schema; }

Result<RunOptions> RunOptionsFromConfig(const Config& cfg) {
  RunOptions o;
  for (const auto& [key, to] : Keys().apply)
    if (to) ECHELON_RETURN_IF_ERROR(to(cfg, key, o));

  // What one key does to another's component, and the checks across keys.
  o.task_options = cfg.Section("task.");
  ECHELON_ASSIGN_OR_RETURN(o.eval_sets, ReadEvalSets(cfg, o.temperature));
  if (o.task_options.count("seed") == 0) o.task_options["seed"] = std::to_string(o.seed);
  if (o.task_options.count("secret"))
    return InvalidArgument(cfg.source() + ": task.secret is the learner's own (drawn as the key `secret` says); it is "
                           "not set in a config");
  o.warmstart.seed = o.seed;
  o.learner.temperature = o.temperature;
  const model::ModelConfig& m = o.model;
  if (m.num_attention_heads % m.num_key_value_heads != 0)
    return InvalidArgument(cfg.source() + ": model.num_attention_heads (" + std::to_string(m.num_attention_heads) +
                           ") must be a multiple of model.num_key_value_heads (" +
                           std::to_string(m.num_key_value_heads) + ")");
  const unsigned cores = std::thread::hardware_concurrency();
  if (o.learner_ranks > 1 && o.learner.device == "cpu" && cores > 0 && o.learner_ranks > static_cast<int64_t>(cores))
    return InvalidArgument(cfg.source() + ": learner.ranks (" + std::to_string(o.learner_ranks) +
                           ") exceeds this machine's " + std::to_string(cores) +
                           " cores; more ranks than cores only share them (run ranks on more hosts)");
  if (o.temperature == 0.0)
    return InvalidArgument(cfg.source() + ": rollout.temperature = 0 (greedy) gives every group the same samples; "
                           "GRPO needs temperature > 0");
  if (o.staleness_control) {
    const sched::StalenessControlOptions& c = *o.staleness_control;
    if (!(c.min <= c.start && c.start <= c.max))
      return InvalidArgument(cfg.source() + ": rl.staleness: auto needs rl.staleness_min (" + std::to_string(c.min) +
                             ") <= rl.staleness_start (" + std::to_string(c.start) + ") <= rl.staleness_max (" +
                             std::to_string(c.max) + ")");
    o.staleness = c.start;
    // auto keeps S where the harmful tokens' second moment is mostly within M2PO's budget, and
    // there M2PO alone clips nothing: one unclipped step per update (docs/RESULTS.md, m2po).
    if (o.learner.loss.correction == learn::Correction::kM2po) o.learner.loss.m2po_within_clip = true;
  }
  // With S moving, a snapshot every update keeps every S reachable.
  const int64_t smallest_s = o.staleness_control ? o.staleness_control->min : o.staleness;
  if (o.publish_period == 0) o.publish_period = o.staleness_control ? 1 : sched::DefaultPublishPeriod(o.staleness);
  if (o.publish_period > smallest_s + 1)
    return InvalidArgument(cfg.source() + ": rl.publish_period (" + std::to_string(o.publish_period) +
                           ") must be at most " + (o.staleness_control ? "rl.staleness_min" : "rl.staleness") +
                           " + 1 (" + std::to_string(smallest_s + 1) +
                           "): a snapshot older than S versions makes its rollouts unusable");
  if (o.learner.micro_batch_tokens > 0 && o.learner.micro_batch_tokens < o.max_new_tokens + 1)
    return InvalidArgument(cfg.source() + ": learner.micro_batch_tokens (" + std::to_string(o.learner.micro_batch_tokens) +
                           ") is smaller than one sequence (a prompt token + rollout.max_new_tokens = " +
                           std::to_string(o.max_new_tokens + 1) + "); raise it or use 0");
  if (o.learner.overlong.buffer > o.max_new_tokens)
    return InvalidArgument(cfg.source() + ": rl.overlong.buffer (" + std::to_string(o.learner.overlong.buffer) +
                           ") is more than rollout.max_new_tokens (" + std::to_string(o.max_new_tokens) + ")");
  if (o.enable_thinking && !o.chat)
    return InvalidArgument(cfg.source() + ": rollout.enable_thinking needs rollout.chat (it is the chat template's mode)");
  if (o.chat && o.model_init.empty())
    return InvalidArgument(cfg.source() + ": rollout.chat needs model.init (a new character model has no chat template)");
  return o;
}

}  // namespace echelon::cli
