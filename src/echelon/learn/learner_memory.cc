#include "echelon/learn/learner_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "echelon/model/attention.h"
#include "echelon/model/token_logprobs.h"

namespace echelon::learn {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// `n` rounded up to a multiple of `ranks` (a unit's flat length, padded).
double Padded(int64_t n, int64_t ranks) { return static_cast<double>((n + ranks - 1) / ranks * ranks); }

// Bytes one decoder layer's forward keeps for its backward over `t` tokens.
double LayerActivations(const model::ModelConfig& c, int64_t layer, double t, double d) {
  const double e = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  double bytes = 2 * t * e * (3 * 4);                 // two RMSNorms, computed in fp32
  bytes += t * (q + 2 * kv) * d * 3;                  // projections, norms, rotary
  bytes += c.num_attention_heads * t * 4;             // tiled attention: a log-sum-exp per query and head
  bytes += t * (q + 3 * e) * d;                       // attention output, o_proj, residuals
  if (c.is_sparse(layer)) {
    const double k = c.num_experts_per_tok;
    bytes += t * c.num_experts * 4 * 2;                       // router logits and probabilities, fp32
    bytes += t * k * (4 * c.moe_intermediate_size + 2 * e) * d;  // expert inputs, gate, up, product, outputs
  } else {
    bytes += t * 4 * c.intermediate_size * d;  // gate, up, silu, product
  }
  return bytes;
}

std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / kGiB);
  return buf;
}

// Bytes with a unit: MiB below a GiB, so a small model's terms are not all "0.0".
std::string Bytes(double bytes) {
  char buf[32];
  if (bytes < kGiB)
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  else
    std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / kGiB);
  return buf;
}

}  // namespace

int64_t LoraParameters(const model::ModelConfig& c, const model::LoraConfig& lora) {
  if (!lora.on()) return 0;
  const int64_t e = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const int64_t inter = c.intermediate_size;
  int64_t total = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (const std::string& t : lora.targets) {
      const bool mlp = t == "gate_proj" || t == "up_proj" || t == "down_proj";
      if (mlp && c.is_sparse(l)) continue;  // experts take no adapter
      const int64_t width = t == "q_proj" || t == "o_proj" ? e + q : t == "k_proj" || t == "v_proj" ? e + kv : e + inter;
      total += lora.rank * width;
    }
  }
  return total;
}

LearnerMemory EstimateLearnerMemory(const model::ModelConfig& c, const LearnerSetup& setup) {
  LearnerMemory m;
  const double p = static_cast<double>(c.NumParameters());
  const int64_t n = std::max<int64_t>(1, setup.ranks);
  const bool bf16 = setup.precision == Precision::kBf16;
  const double d = bf16 ? 2 : 4;
  const bool params = setup.shard == Shard::kParams && n > 1;
  if (params) {
    double shard = 0, gathered = 0;
    const int64_t outer = c.OuterParameters();
    // The head's gradients (the final norm's, and lm_head's unless tied: a tied embedding's
    // gradient waits for its second use), computed first in the backward pass, wait beside
    // every layer's.
    const double head =
        d * static_cast<double>((c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size) + c.hidden_size);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const int64_t layer = c.LayerParameters(l);
      shard += Padded(layer, n) / n;
      // The backward of this layer: the outer unit and the layer gathered, the layer's gradients
      // from autograd and in one fp32 buffer, and the head's.
      gathered = std::max(gathered,
                          d * Padded(outer, n) + d * Padded(layer, n) + d * layer + 4 * Padded(layer, n) + head);
    }
    shard += Padded(outer, n) / n;
    // The end of a micro-batch: the outer unit's gradients, as the layer's above.
    gathered = std::max(gathered, d * Padded(outer, n) + d * outer + 4 * Padded(outer, n));
    m.weights = 4 * shard;
    m.gradients = 4 * shard;
    m.optimizer = 8 * shard;
    m.gathered = gathered;
  } else if (setup.lora.on()) {
    const double a = static_cast<double>(LoraParameters(c, setup.lora));
    m.weights = d * p + 4 * a;
    m.gradients = 4 * a;
    m.optimizer = setup.shard == Shard::kOptimizer && n > 1 ? 8 * a / n : 8 * a;
  } else {
    m.weights = 4 * p + (bf16 ? 2 * p : 0);
    m.gradients = 4 * p + (bf16 ? 2 * p : 0);
    m.optimizer = setup.shard == Shard::kOptimizer && n > 1 ? 8 * p / n : 8 * p;
  }
  // LoRA's reference is its own base, adapters off (learner.h ReferenceState): no copy.
  // Sharded parameters shard the reference as the weights (fp32 shards).
  if (setup.kl_reference && !setup.lora.on()) m.reference = params ? m.weights : d * p;
  // Activations of one micro-batch on one rank.
  const double t = static_cast<double>(setup.micro_batch_tokens);
  double all = 0, largest = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const double a = LayerActivations(c, l, t, d);
    all += a;
    largest = std::max(largest, a);
  }
  const bool checkpointing = setup.activation_checkpointing || params;
  m.activations = checkpointing ? c.num_hidden_layers * t * c.hidden_size * d + 2 * largest : all;
  // The final hidden states (and their norm's input, fp32) and a log-sum-exp per token, what the
  // chunked log-probs keep.
  m.activations += t * c.hidden_size * (d + 4) + t * 4;
  // The largest transient: a tile of attention scores (at most the whole sequence's) with its
  // probabilities and their two gradients in fp32, or a chunk of logits (fp32, its gradient, cast) with the head's fp32
  // gradient accumulator (none when the head is frozen: LoRA).
  const double vocab = static_cast<double>(c.vocab_size);
  const double chunk = std::min(t, std::max(1.0, std::floor(model::kLogitChunkElements / vocab))) * vocab;
  const double head = setup.lora.on() ? 0 : 4 * vocab * c.hidden_size;
  const double tile = std::min(static_cast<double>(model::kTileElements), c.num_attention_heads * t * t);
  m.activations += std::max(4.0 * 4 * tile, chunk * (4 + 4 + d) + head);
  return m;
}

VerifierMemory EstimateVerifierMemory(const model::ModelConfig& c, int64_t window, double memory_bytes) {
  VerifierMemory m;
  const double adapters = static_cast<double>(LoraParameters(c, c.lora));
  const double whole = (static_cast<double>(c.NumParameters()) + adapters) * 4;
  const double snapshot = c.lora.on() ? adapters * 4 : whole;
  if (c.lora.on()) m.model = m.base = whole;  // the base snapshot is the whole storage state
  m.newest = snapshot;
  const double older = static_cast<double>(std::max<int64_t>(window, 0)) * snapshot;
  // Whole snapshots stay in RAM while they fit the budget (BehaviourVerifier::Remember).
  const double fit = memory_bytes < 0 ? older : std::min(older, std::floor(memory_bytes / snapshot) * snapshot);
  m.older = fit;
  m.on_disk = older - fit;
  if (m.on_disk > 0) m.mapped = snapshot;
  return m;
}

std::string VerifierMemoryLine(const model::ModelConfig& c, int64_t window, double memory_bytes) {
  const VerifierMemory m = EstimateVerifierMemory(c, window, memory_bytes);
  std::ostringstream out;
  out << "verifier, rank 0's host memory, rl.staleness " << window << ", rollout.verify_memory_mb "
      << (memory_bytes < 0 ? std::string("unbounded") : std::to_string(static_cast<int64_t>(memory_bytes / (1 << 20))))
      << ": ";
  if (m.model > 0) out << "model copy " << Bytes(m.model) << ", LoRA base " << Bytes(m.base) << ", ";
  out << "newest snapshot " << Bytes(m.newest) << " (the publisher's), older snapshots " << Bytes(m.older)
      << " in RAM + " << Bytes(m.on_disk) << " on disk (" << Bytes(m.mapped) << " mapped); in RAM " << Bytes(m.ram())
      << "\n";
  return out.str();
}

std::string LearnerMemoryTable(const model::ModelConfig& c, const std::vector<LearnerSetup>& setups,
                               const std::vector<std::pair<std::string, double>>& gpus, double headroom) {
  std::ostringstream out;
  out << "ranks precision shard     ckpt lora tokens | weights grads  adamw gathered activ. | total GiB/rank";
  for (const auto& [name, gib] : gpus) out << " | " << name << " (" << gib << " GB)";
  out << "\n";
  for (const LearnerSetup& s : setups) {
    const LearnerMemory m = EstimateLearnerMemory(c, s);
    const char* shard = s.shard == Shard::kParams ? "params" : s.shard == Shard::kOptimizer ? "optimizer" : "none";
    char line[256];
    const std::string lora = s.lora.on() ? std::to_string(s.lora.rank) : "-";
    std::snprintf(line, sizeof line, "%5lld %-9s %-9s %-4s %4s %6lld | %7s %6s %6s %8s %6s | %14s",
                  static_cast<long long>(s.ranks), s.precision == Precision::kBf16 ? "bf16" : "fp32", shard,
                  s.activation_checkpointing || (s.shard == Shard::kParams && s.ranks > 1) ? "yes" : "no", lora.c_str(),
                  static_cast<long long>(s.micro_batch_tokens),
                  Gib(m.weights).c_str(), Gib(m.gradients).c_str(), Gib(m.optimizer).c_str(),
                  Gib(m.gathered).c_str(), Gib(m.activations).c_str(), Gib(m.total() ).c_str());
    out << line;
    for (const auto& [name, gb] : gpus) {
      const double usable = gb * 1e9 * (1 - headroom);
      out << " | " << (m.total() <= usable ? "fits" : "no");
    }
    out << "\n";
  }
  return out.str();
}

double EstimateHostPeak(const model::ModelConfig& c, const LearnerSetup& setup, const std::string& phase, int rank,
                        double runtime_mb) {
  const LearnerMemory m = EstimateLearnerMemory(c, setup);
  const int64_t n = std::max<int64_t>(1, setup.ranks);
  const bool params = setup.shard == Shard::kParams && n > 1, lora = setup.lora.on();
  const bool bf16 = setup.precision == Precision::kBf16, several = n > 1;
  const double p = static_cast<double>(c.NumParameters());
  const double trained = lora ? static_cast<double>(LoraParameters(c, setup.lora)) : p;
  const double whole = 4 * p;            // the fp32 weights, whole
  const double adamw = 8 * trained;      // the AdamW state, whole
  const double storage = static_cast<double>(at::elementSize(model::StorageDtype(c))) * p;
  double unit = static_cast<double>(c.OuterParameters());  // the largest unit, fp32, padded
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) unit = std::max(unit, static_cast<double>(c.LayerParameters(l)));
  unit = 4 * Padded(static_cast<int64_t>(unit), n);
  // Between updates: the weights, gradients and AdamW state the learner keeps (under params
  // no rank keeps more: snapshots and checkpoints gather the weights unit by unit).
  const double held = m.weights + m.gradients + m.optimizer;
  double bytes = 0;
  if (phase == "set-up") {
    // The whole fp32 model (rank 0's own; a worker's received, except under params, where each
    // unit comes in turn and the worker keeps its shard); with LoRA, the adapted copy beside the
    // base it was made from (model/qwen3.h WithLora); then the shards cut unit by unit (params),
    // or the bf16 compute copy.
    if (params) bytes = (rank == 0 ? whole : 0) + m.weights + unit;
    else bytes = whole * (lora ? 2 : 1) + (lora ? 4 * trained : 0) + (bf16 && !lora ? 2 * p : 0);
  } else if (phase == "updates") {
    if (params) {
      bytes = held + m.gathered + m.activations;  // a layer's backward: gathered weights, gradients, activations
    } else {
      // After the backward pass (activations gone), several ranks exchange one flat fp32 vector of
      // every gradient; bf16 converts the compute gradients to fp32 first. One rank in bf16 casts
      // each gradient to its master's.
      const double exchange = several ? 4 * trained * (bf16 && !lora ? 2 : 1) : bf16 && !lora ? 4 * p : 0;
      bytes = held + std::max(m.activations, exchange);
    }
  } else if (phase == "publication") {
    if (params) {
      // Every unit all-gathered in turn (Gloo's receive buffers, their concatenation and the
      // unit's own: three units) and, on rank 0, written into the snapshot's bytes.
      bytes = held + 3 * unit + (rank == 0 ? storage : 0);
    } else {
      // Rank 0 serialises the snapshot (a LoRA run's whole base the first time), a storage-dtype
      // copy first where the master is wider.
      const double snapshot = storage * (storage < whole ? 2 : 1) + (lora ? 4 * trained : 0);
      bytes = held + (rank == 0 ? snapshot : 0);
    }
  } else if (phase == "checkpoint save") {
    // The files stream from the tensors' memory. Under params the weights and the AdamW state
    // are written unit by unit as they are all-gathered (about four units of buffers); a sharded
    // optimizer gathers it whole on every rank first; narrower storage takes a storage-dtype
    // copy of the weights.
    const double join = 4 * unit;
    if (params) bytes = held + join;
    else bytes = held + (setup.shard == Shard::kOptimizer && several ? adamw : 0) + (rank == 0 && storage < whole ? storage : 0);
  } else if (phase == "resume") {
    // The checkpoint's weights and whole AdamW state read (rank 0) or received (workers); then
    // the learner's own state beside them until they are handed over. Under params no rank
    // holds them whole: rank 0 maps the files and cuts them unit by unit (a unit's weights and
    // moments resident at a time), the workers receive their shards of each unit in turn.
    const double mine = lora ? 4 * trained : 0;
    if (params) {
      bytes = m.weights + m.optimizer + unit * (rank == 0 ? 3 : 1);
    } else {
      bytes = whole + mine + adamw + m.optimizer + (bf16 && !lora ? 2 * p : 0);
    }
  }
  return runtime_mb * 1048576.0 + bytes;
}

}  // namespace echelon::learn
