#include "echelon/learn/run_start.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>

#include "echelon/common/fs.h"
#include "echelon/learn/warmstart.h"
#include "echelon/model/checkpoint.h"
#include "echelon/model/hf_model.h"
#include "echelon/model/tokenizer.h"

namespace echelon::learn {
namespace fs = std::filesystem;
namespace {

Status PrepareRunDir(const std::string& run_dir) {
  std::error_code ec;
  if (!IsFreshRunDir(run_dir))
    return FailedPrecondition("run directory " + run_dir + " already exists and is not empty; choose another --out");
  fs::create_directories(fs::path(run_dir) / "checkpoints", ec);
  if (ec) return Internal("cannot create " + run_dir + ": " + ec.message());
  return Status::Ok();
}

// The model a fresh run starts from: a new character model over the task's alphabet, or the
// directory of model.init with its own tokenizer.
struct InitialModel {
  model::ModelConfig config;
  model::Vocabulary vocab;
  model::Qwen3Model weights{nullptr};  // null: initialise from the seed
};

model::ModelConfig CharacterModelConfig(const RunOptions& options, const model::Vocabulary& vocab) {
  model::ModelConfig mcfg = options.model;
  mcfg.vocab_size = vocab.id_end();
  mcfg.bos_token_id = model::CharTokenizer::kBos;
  mcfg.eos_token_id = model::CharTokenizer::kEos;
  mcfg.pad_token_id = model::CharTokenizer::kPad;
  mcfg.lora = options.lora;  // what the run's checkpoints hold (the warm-start's has none)
  return mcfg;
}

Result<InitialModel> LoadInitialModel(const RunOptions& options, const data::TaskAdapter& task) {
  InitialModel m;
  if (options.model_init.empty()) {
    m.vocab = model::Vocabulary::Characters(task.Alphabet());
    m.config = CharacterModelConfig(options, m.vocab);
    m.config.lora = {};  // added after the warm-start
    ECHELON_RETURN_IF_ERROR(m.config.Validate().WithContext("model config"));
    return m;
  }
  const std::string where = "model.init " + options.model_init;
  ECHELON_ASSIGN_OR_RETURN(model::TextModel dir, model::LoadModelDir(options.model_init));
  if (!dir.vocab) return NotFound(where + ": no tokenizer.json, so prompts cannot be encoded");
  if (dir.vocab->stop_ids().empty())
    return InvalidArgument(where + ": config.json and generation_config.json name no eos_token_id, so completions never end");
  m.config = dir.config;
  m.vocab = *dir.vocab;
  if (options.chat) {
    Result<model::Vocabulary> chat = m.vocab.WithChat(options.enable_thinking);
    if (!chat.ok()) return chat.status().WithContext(where + " (rollout.chat)");
    m.vocab = std::move(chat).value();
  }
  m.weights = dir.model;
  // Every prompt of the task must encode (a character tokenizer has a fixed alphabet).
  const data::Prompt first = task.TrainPrompt(0);
  if (Result<std::vector<int64_t>> probe = m.vocab.EncodePrompt(first.system, first.text); !probe.ok())
    return InvalidArgument(where + ": its tokenizer cannot encode the task's prompts: " + probe.status().message());
  return m;
}

}  // namespace

bool IsFreshRunDir(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::exists(run_dir, ec)) return true;
  for (const fs::directory_entry& e : fs::directory_iterator(run_dir, ec))
    if (e.path().filename() != "learner.log") return false;
  return !ec;
}

Result<RunSecret> RunSecretFor(const RunOptions& options, const std::string& run_dir, bool resume,
                               std::ostream& progress) {
  if (options.secret_from_seed) return RunSecret::FromSeed(options.seed);
  const std::string file = (fs::path(run_dir) / "secret").string();
  if (resume && fs::exists(file)) {
    ECHELON_ASSIGN_OR_RETURN(std::string text, ReadFile(file));
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return RunSecret::FromHex(text, file);
  }
  if (resume) progress << file << " is missing: a new secret is drawn, and groups are seeded anew" << std::endl;
  return RunSecret::Random();
}

Status KeepRunSecret(const RunOptions& options, const std::string& run_dir, const RunSecret& secret) {
  if (options.secret_from_seed) return Status::Ok();
  return WriteFileAtomic((fs::path(run_dir) / "secret").string(), secret.Hex() + "\n", 0600);
}

Result<RunStart> StartFresh(const RunOptions& options, const data::TaskAdapter& task, const std::string& run_dir,
                            const std::string& resolved_yaml, const ModelEvaluator& evaluate,
                            obs::MetricsLog& metrics, std::ostream& progress, const Clock& clock, double t_start) {
  ECHELON_ASSIGN_OR_RETURN(InitialModel init, LoadInitialModel(options, task));
  ECHELON_RETURN_IF_ERROR(PrepareRunDir(run_dir));
  ECHELON_RETURN_IF_ERROR(WriteFileAtomic((fs::path(run_dir) / "config.yaml").string(), resolved_yaml));
  ECHELON_RETURN_IF_ERROR(task.ExportHeldOut((fs::path(run_dir) / "heldout.jsonl").string()));
  ECHELON_RETURN_IF_ERROR(metrics.Open((fs::path(run_dir) / "metrics.jsonl").string()));
  ECHELON_RETURN_IF_ERROR(metrics.MirrorToTensorBoard(run_dir));
  RunStart start;
  start.vocab = init.vocab;
  const model::Vocabulary& vocab = start.vocab;
  if (init.weights) {
    start.model = init.weights;
    int64_t params = 0;
    for (const at::Tensor& p : start.model->parameters()) params += p.numel();
    progress << "starting from " << options.model_init << " (" << init.config.architecture() << ", " << params
             << " parameters)" << std::endl;
  } else {
    start.model = model::Qwen3Model(init.config);
    start.model->InitWeights(options.seed);
  }
  if (options.warmstart.steps > 0) {
    progress << "warm-start: " << options.warmstart.steps << " supervised steps" << std::endl;
    const int64_t every = std::max<int64_t>(1, options.warmstart.steps / 5);
    ECHELON_ASSIGN_OR_RETURN(
        double loss, Warmstart(start.model, vocab, task, options.warmstart, [&](int64_t step, double l) {
          if ((step + 1) % every == 0)
            progress << "  warm-start step " << step + 1 << "/" << options.warmstart.steps << " loss " << std::fixed
                     << std::setprecision(3) << l << std::endl;
        }));
    (void)loss;
  }
  ECHELON_RETURN_IF_ERROR(
      model::SaveCheckpoint((fs::path(run_dir) / "checkpoints" / "warmstart").string(), start.model, vocab));
  ECHELON_ASSIGN_OR_RETURN(const data::EvalResult before, evaluate(start.model, vocab, task, options.max_new_tokens));
  start.state.warmstart_accuracy = before.accuracy;
  start.state.heldout_n = before.n;
  if (!std::isnan(before.accuracy))
    progress << "warm-start held-out accuracy " << std::fixed << std::setprecision(3) << before.accuracy << " (n="
             << before.n << ")" << std::endl;
  ECHELON_RETURN_IF_ERROR(metrics.Write({{"event", "warmstart"},
                                         {"steps", options.warmstart.steps},
                                         {"heldout_accuracy", before.accuracy},
                                         {"heldout_n", before.n},
                                         {"wall_s", clock.Now() - t_start}}));
  if (options.lora.on()) {
    ECHELON_ASSIGN_OR_RETURN(start.model, model::WithLora(start.model, options.lora, options.seed));
    int64_t adapter = 0, all = 0;
    for (const auto& [name, t] : start.model->StateDict()) (model::IsLoraTensor(name) ? adapter : all) += t.numel();
    std::string targets;
    for (const std::string& t : options.lora.targets) targets += (targets.empty() ? "" : ",") + t;
    std::ostringstream line;  // alpha as written, whatever the progress stream's format
    line << "LoRA rank " << options.lora.rank << " alpha " << options.lora.alpha << " on " << targets << ": " << adapter
         << " adapter parameters trained over " << all << " frozen";
    progress << line.str() << std::endl;
  }
  start.state.wall_seconds = clock.Now() - t_start;
  return start;
}

// Resumed run: the newest whole checkpoint; metrics.jsonl cut back to where it was then.
Result<RunStart> StartFromCheckpoint(const RunOptions& options, const data::TaskAdapter& task,
                                     const std::string& run_dir, obs::MetricsLog& metrics, std::ostream& progress,
                                     bool mapped) {
  const fs::path ckpt_dir = fs::path(run_dir) / "checkpoints";
  RunStart start;
  Result<ResumePoint> point = LoadNewestRunCheckpoint(ckpt_dir.string(), &start.skipped, mapped);
  for (const std::string& why : start.skipped) progress << "skipping checkpoint " << why << std::endl;
  if (!point.ok())
    return NotFound("cannot resume " + run_dir + ": " + point.status().message() +
                    "; the run died before its first checkpoint, so start it again with another --out");
  // A run from model.init keeps the model and tokenizer its checkpoints carry.
  if (options.model_init.empty() &&
      point->checkpoint.config.ToJson() !=
          CharacterModelConfig(options, model::Vocabulary::Characters(task.Alphabet())).ToJson())
    return FailedPrecondition(point->dir + "/config.json describes another model than the run's config.yaml");
  if (!(point->checkpoint.config.lora == options.lora))
    return FailedPrecondition(point->dir + "/config.json holds other LoRA adapters (echelon_lora) than the run's "
                              "learner.lora keys");
  start.model = point->checkpoint.model;
  start.vocab = point->checkpoint.vocab;
  if (options.chat) {
    Result<model::Vocabulary> chat = start.vocab.WithChat(options.enable_thinking);
    if (!chat.ok()) return chat.status().WithContext(point->dir + " (rollout.chat)");
    start.vocab = std::move(chat).value();
  }
  start.state = point->state;
  start.resumed_from = point->dir;
  start.optimizer = std::move(point->optimizer);
  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  ECHELON_ASSIGN_OR_RETURN(start.discarded_lines,
                           obs::MetricsLog::RollBack(metrics_path, start.state.metrics_bytes,
                                                     (fs::path(run_dir) / "metrics.discarded.jsonl").string()));
  ECHELON_RETURN_IF_ERROR(metrics.Open(metrics_path));
  // A new event file; TensorBoard drops what the older ones hold from the redone steps on.
  ECHELON_RETURN_IF_ERROR(metrics.MirrorToTensorBoard(run_dir, start.state.version));
  progress << "resuming from " << point->dir << " (version " << start.state.version << "); "
           << start.discarded_lines << " metrics lines after it moved to metrics.discarded.jsonl" << std::endl;
  return start;
}

uint64_t FreshLeaseBase(uint64_t saved_next_lease) {
  std::random_device rd;
  const uint64_t salt = (static_cast<uint64_t>(rd()) & 0x7fffu) + 1;
  return saved_next_lease + (salt << 40);
}


}  // namespace echelon::learn
