// The training schema walked against its reader, --help and docs/CONFIG.md: every declared key
// changes the RunOptions it is read into (or is refused naming itself), --help lists every key
// and every adapter option once, and the docs table is the generated one.
#include "echelon/cli/train_config.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "echelon/data/adapter.h"

namespace echelon::cli {
namespace {

// Every RunOptions member, as text: two options differ iff their prints differ.
std::string Print(const RunOptions& o) {
  std::ostringstream s;
  s.precision(17);
  s << o.seed << '|' << o.secret_from_seed << '|' << o.task_name << '|';
  for (const auto& [k, v] : o.task_options) s << k << '=' << v << ',';
  const model::ModelConfig& m = o.model;
  s << '|' << o.model_init << '|' << m.hidden_size << ',' << m.num_hidden_layers << ',' << m.num_attention_heads << ','
    << m.num_key_value_heads << ',' << m.head_dim << ',' << m.intermediate_size << ',' << m.tie_word_embeddings << ','
    << m.rope_theta << ',' << m.rms_norm_eps << ',' << m.max_position_embeddings;
  s << '|' << o.warmstart.steps << ',' << o.warmstart.batch_size << ',' << o.warmstart.lr << ',' << o.warmstart.seed;
  const learn::LearnerOptions& l = o.learner;
  s << '|' << l.lr << ',' << l.weight_decay << ',' << l.max_grad_norm << ',' << l.temperature << ',' << l.scale_by_std
    << ',' << l.minibatches << ',' << l.device << ',' << static_cast<int>(l.precision) << ',' << l.micro_batch_tokens
    << ',' << l.pack_sequences << ',' << static_cast<int>(l.shard) << ',' << l.activation_checkpointing << ',' << l.router_aux_coef
    << ',' << static_cast<int>(l.loss_aggregation) << ',' << l.max_group_share << ',' << l.overlong.buffer << ','
    << l.overlong.penalty << ','
    << l.overlong.filter << ',' << l.router_replay << ',' << l.router_replay_trust << ',' << o.router_replay_margin;
  s << '|' << o.lora.rank << ',' << o.lora.alpha;
  for (const std::string& t : o.lora.targets) s << ',' << t;
  s << '|' << l.loss.clip_low << ',' << l.loss.clip_high << ',' << l.loss.clip_ratio_c << ',' << l.loss.kl_coef << ','
    << static_cast<int>(l.loss.correction) << ',' << l.loss.tis_cap << ',' << l.loss.decoupled_cap << ','
    << l.loss.icepop_beta << ',' << l.loss.m2po_tau << ',' << l.loss.m2po_within_clip << ','
    << static_cast<int>(l.loss.ratio);
  s << '|' << o.steps << ',' << o.groups_per_step << ',' << o.group_size << ',' << o.staleness << ',' << o.publish_period;
  if (o.staleness_control) {
    const sched::StalenessControlOptions& c = *o.staleness_control;
    s << "|auto " << c.start << ',' << c.min << ',' << c.max << ',' << c.ess_min << ',' << c.busy_target << ','
      << c.window << ',' << c.couple_lr;
  }
  s << '|' << o.actors << ',' << o.thread_actors << ',' << o.temperature << ',' << o.top_p << ',' << o.top_k << ',' << o.min_p << ','
    << o.max_new_tokens << ',' << o.slots << ',' << o.chat << ',' << o.enable_thinking << ',' << o.partial << ',' << o.dynamic_sampling << ','
    << o.dynamic_sampling_max << ',' << o.lease_seconds << ',' << o.max_leases_per_worker << o.dispatch << ',' << o.resume << ',' << o.untrusted_workers
    << ',' << o.stall_timeout_seconds << ',' << o.verify_fraction << ',' << o.verify_tolerance << ','
       << o.verify_draws << ',' << o.verify_draw_tolerance << ',' << o.verify_token_tolerance << ','
       << o.verify_memory_mb << '|';
  for (double d : o.actor_slowdowns) s << d << ',';
  s << '|' << o.eval_every << ',' << o.eval_heldout << ',';
  for (const auto& e : o.eval_sets) s << e.name << ':' << e.file << ':' << e.k << ':' << e.temperature << ';';
  s << ',' << o.canary_file << ',' << o.canary_share << ',' << o.checkpoint_every << ',' << o.checkpoint_keep << ','
    << o.checkpoint_shard_mb << ',' << o.snapshot_broadcast << ','
    << o.wait_for_actors << ',' << o.learner_ranks << ',' << o.rank_timeout_seconds;
  return s.str();
}

// A value of `f` other than its default, inside its range.
std::string OtherValue(const FieldSpec& f) {
  std::ostringstream s;
  s.precision(17);
  switch (f.type) {
    case FieldType::kBool: return f.default_value == "true" ? "false" : "true";
    case FieldType::kInt: {
      const int64_t def = std::stoll(f.default_value), max = static_cast<int64_t>(f.max);
      s << (def < max ? def + 1 + (max - def) / 2 : def - 1);
      return s.str();
    }
    case FieldType::kFloat: {
      const double def = std::stod(f.default_value);
      s << (def < f.max ? (def + f.max) / 2 : (def + f.min) / 2);
      return s.str();
    }
    case FieldType::kString:
      for (const std::string& c : f.choices)
        if (c != f.default_value) return c;
      if (f.key == "task.name") return "poker";
      if (f.key == "rl.staleness") return "3";
      if (f.key == "learner.device") return "cuda";  // refused naming the key without a CUDA LibTorch
      return f.default_value + "/other";
  }
  return "";
}

// Keys that only take effect beside another key's value.
std::vector<std::string> Companions(const std::string& key) {
  if (key.rfind("rl.staleness_", 0) == 0) return {"rl.staleness=auto"};
  if (key == "rollout.slowdown") return {"rollout.slow_actors=1"};
  if (key == "learner.lora.alpha" || key == "learner.lora.targets") return {"learner.lora.rank=8"};
  return {};
}

TEST(TrainSchema, EveryKeyIsReadIntoTheRunOptions) {
  const ConfigSchema& schema = TrainSchema();
  ASSERT_GE(schema.fields().size(), 60u);
  for (const FieldSpec& f : schema.fields()) {
    std::vector<std::string> overrides = Companions(f.key);
    Result<Config> base_cfg = Config::Load(schema, "", overrides);
    ASSERT_TRUE(base_cfg.ok()) << f.key << ": " << base_cfg.status().message();
    Result<RunOptions> base = RunOptionsFromConfig(base_cfg.value());
    ASSERT_TRUE(base.ok()) << f.key << ": " << base.status().message();
    overrides.push_back(f.key + "=" + OtherValue(f));
    Result<Config> cfg = Config::Load(schema, "", overrides);
    ASSERT_TRUE(cfg.ok()) << f.key << ": " << cfg.status().message();
    Result<RunOptions> changed = RunOptionsFromConfig(cfg.value());
    if (!changed.ok()) {  // a joint check refused it: the message must name the key
      EXPECT_NE(changed.status().message().find(f.key), std::string::npos) << changed.status().message();
      continue;
    }
    EXPECT_NE(Print(changed.value()), Print(base.value())) << f.key << " = " << OtherValue(f) << " changed nothing";
  }
}

TEST(TrainSchema, EveryKeyStatesItsReaders) {
  for (const FieldSpec& f : TrainSchema().fields()) EXPECT_FALSE(f.readers.empty()) << f.key;
}

TEST(TrainSchema, HelpListsEveryKeyAndEveryAdapterOptionOnce) {
  const std::string help = TrainSchema().Describe();
  for (const FieldSpec& f : TrainSchema().fields()) {
    const std::string line = "\n  " + f.key + " (";
    const size_t at = ("\n" + help).find(line);
    EXPECT_NE(at, std::string::npos) << f.key;
    EXPECT_EQ(("\n" + help).find(line, at + 1), std::string::npos) << f.key << " listed twice";
  }
  const size_t task = help.find("  task.*\n");
  ASSERT_NE(task, std::string::npos);
  for (const std::string& name : data::AdapterNames()) {
    const size_t at = help.find("      " + name + ":\n", task);
    ASSERT_NE(at, std::string::npos) << name;
    const size_t next = help.find(":\n", at + name.size() + 8);
    const std::string block = help.substr(at, next == std::string::npos ? std::string::npos : next - at);
    for (const data::OptionSpec& o : *data::AdapterOptionTable(name))
      EXPECT_NE(block.find("        " + o.name + " (default "), std::string::npos) << name << "." << o.name;
  }
}

TEST(TrainSchema, AnAdapterRefusesNoOptionItsTableNames) {
  // The table and the adapter's own name check are one list: every named option is accepted
  // by name (its value may still be refused, naming it).
  for (const std::string& name : data::AdapterNames()) {
    for (const data::OptionSpec& o : *data::AdapterOptionTable(name)) {
      Result<std::unique_ptr<data::TaskAdapter>> a = data::CreateAdapter(name, {{o.name, o.default_value}});
      if (!a.ok()) {
        EXPECT_EQ(a.status().message().find("unknown option"), std::string::npos) << a.status().message();
      }
    }
  }
}

// docs/CONFIG.md's table is the generated one (`echelon train --config-keys markdown`).
TEST(TrainSchema, ConfigDocTableIsTheGeneratedOne) {
  const std::string path = std::string(ECHELON_TEST_DATA) + "/../../docs/CONFIG.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::string line, table;
  bool in_section = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## Keys";
    if (in_section && line.rfind("|", 0) == 0) table += line + "\n";
  }
  EXPECT_EQ(table, TrainSchema().Markdown())
      << "regenerate the table in docs/CONFIG.md with `echelon train --config-keys markdown`";
}

}  // namespace
}  // namespace echelon::cli

namespace echelon::cli {
namespace {

// rollout.transport was declared in the schema but read beside the reader (launch.cc), so
// RunOptions did not carry it; it is now RunOptions::thread_actors.
TEST(TrainSchema, RolloutTransportIsReadIntoTheRunOptions) {
  for (const auto& [value, threads] : std::vector<std::pair<std::string, bool>>{{"threads", true}, {"processes", false}}) {
    Result<Config> cfg = Config::Load(TrainSchema(), "", {"rollout.transport=" + value});
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    Result<RunOptions> o = RunOptionsFromConfig(cfg.value());
    ASSERT_TRUE(o.ok()) << o.status().message();
    EXPECT_EQ(o->thread_actors, threads) << value;
  }
}

// rollout.verify_draw_tolerance was read into the run's options but never handed to the
// verifier, which kept its own default: every rollout.verify_* key now reaches it.
TEST(TrainSchema, VerifyDrawToleranceReachesTheVerifier) {
  Result<Config> cfg = Config::Load(TrainSchema(), "",
                                    {"rollout.verify_draw_tolerance=0.07", "rollout.verify_token_tolerance=2.5",
                                     "rollout.verify_tolerance=0.03", "rollout.verify_fraction=0.3",
                                     "rollout.verify_draws=true", "rl.staleness=5", "rollout.verify_memory_mb=64"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  Result<RunOptions> o = RunOptionsFromConfig(cfg.value());
  ASSERT_TRUE(o.ok()) << o.status().message();
  const RunSecret secret = RunSecret::FromSeed(4);
  const learn::VerifyOptions v = learn::VerifierOptions(o.value(), secret, /*task_draws=*/true, "run/verifier");
  EXPECT_EQ(v.draw_tolerance, 0.07);
  EXPECT_EQ(v.token_tolerance, 2.5);
  EXPECT_EQ(v.tolerance, 0.03);
  EXPECT_EQ(v.fraction, 0.3);
  EXPECT_EQ(v.window, 5);
  EXPECT_TRUE(v.draws);
  EXPECT_EQ(v.spill_dir, "run/verifier");
  EXPECT_EQ(v.memory_bytes, int64_t{64} << 20);
  EXPECT_EQ(v.secret, secret);
  EXPECT_FALSE(learn::VerifierOptions(o.value(), secret, /*task_draws=*/false).draws);
}

// eval.sets.NAME.*: each set with its file, k and temperature (the run's when not given), in
// name order; a set without a file, an unknown field, or a k out of range is one clear error.
TEST(TrainSchema, EvalSetsAreReadWithTheirKAndTemperature) {
  Result<Config> cfg = Config::Load(TrainSchema(), "",
                                    {"eval.sets.hard.file=h.jsonl", "eval.sets.hard.k=16", "eval.sets.hard.temperature=0.6",
                                     "eval.sets.easy.file=e.jsonl", "rollout.temperature=0.9"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  Result<RunOptions> o = RunOptionsFromConfig(cfg.value());
  ASSERT_TRUE(o.ok()) << o.status().message();
  ASSERT_EQ(o->eval_sets.size(), 2u);
  EXPECT_EQ(o->eval_sets[0].name, "easy");
  EXPECT_EQ(o->eval_sets[0].file, "e.jsonl");
  EXPECT_EQ(o->eval_sets[0].k, 4);
  EXPECT_EQ(o->eval_sets[0].temperature, 0.9);
  EXPECT_EQ(o->eval_sets[1].name, "hard");
  EXPECT_EQ(o->eval_sets[1].k, 16);
  EXPECT_EQ(o->eval_sets[1].temperature, 0.6);
  for (const auto& [set, error] : std::vector<std::pair<std::string, std::string>>{
           {"eval.sets.a.k=3", "eval.sets.a.file is missing"},
           {"eval.sets.a.n=3", "eval.sets.a.n: unknown"},
           {"eval.sets.a.k=0", "eval.sets.a.k = 0: an integer in [1, 1024]"},
           {"eval.sets.a.temperature=-1", "eval.sets.a.temperature = -1: a number in [0, 10]"},
           {"eval.sets.a b.file=x", "a set's name is"}}) {
    Result<Config> bad = Config::Load(TrainSchema(), "", {set});
    ASSERT_TRUE(bad.ok()) << bad.status().message();
    Result<RunOptions> r = RunOptionsFromConfig(bad.value());
    ASSERT_FALSE(r.ok()) << set;
    EXPECT_NE(r.status().message().find(error), std::string::npos) << set << ": " << r.status().message();
  }
}

// m2po under rl.staleness: auto keeps PPO's clip as its widest (auto holds S where M2PO's budget
// alone clips nothing); a fixed S leaves the paper's clip unless asked.
TEST(TrainSchema, AutoStalenessKeepsM2poWithinThePpoClip) {
  for (const auto& [staleness, within] : std::vector<std::pair<std::string, bool>>{{"auto", true}, {"64", false}}) {
    Result<Config> cfg = Config::Load(TrainSchema(), "", {"rl.correction=m2po", "rl.staleness=" + staleness});
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    Result<RunOptions> o = RunOptionsFromConfig(cfg.value());
    ASSERT_TRUE(o.ok()) << o.status().message();
    EXPECT_EQ(o->learner.loss.m2po_within_clip, within) << staleness;
  }
}

// Every shipped training config reads without an error (one for a GPU fleet with learner.device
// cpu where this LibTorch has no CUDA). The DAPO ones set the recipe's keys and an evaluation set.
TEST(TrainSchema, ShippedTrainingConfigsRead) {
  const std::string dir = std::string(ECHELON_TEST_DATA) + "/../../configs/";
  for (const std::string name : {"math-tiny", "poker-tiny", "gsm8k-style", "dapo-tiny", "dapo-qwen3"}) {
    Result<Config> cfg = Config::Load(TrainSchema(), dir + name + ".yaml", {});
    ASSERT_TRUE(cfg.ok()) << name << ": " << cfg.status().message();
    Result<RunOptions> o = RunOptionsFromConfig(cfg.value());
    if (!o.ok() && !at::hasCUDA() && o.status().message().find("learner.device") != std::string::npos) {
      // The rest of it, on this machine (its cores bound the ranks).
      cfg = Config::Load(TrainSchema(), dir + name + ".yaml", {"learner.device=cpu", "learner.ranks=1"});
      ASSERT_TRUE(cfg.ok()) << name << ": " << cfg.status().message();
      o = RunOptionsFromConfig(cfg.value());
    }
    ASSERT_TRUE(o.ok()) << name << ": " << o.status().message();
    if (name.rfind("dapo", 0) == 0) {
      EXPECT_TRUE(o->dynamic_sampling) << name;
      EXPECT_GT(o->learner.overlong.buffer, 0) << name;
      EXPECT_EQ(o->learner.loss.clip_high, 0.28) << name;
      ASSERT_EQ(o->eval_sets.size(), 1u) << name;  // mean@k and pass@k on the actors
      EXPECT_GE(o->eval_sets[0].k, 8) << name;
    }
  }
}

}  // namespace
}  // namespace echelon::cli
