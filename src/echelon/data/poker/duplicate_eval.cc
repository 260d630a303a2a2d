#include "echelon/data/poker/duplicate_eval.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace echelon::data::poker {

namespace {
constexpr uint64_t kDuplicateStream = 0x6475706c69636174ULL;  // "duplicat": apart from the adapter's streams
}  // namespace

uint64_t EvalDealSeed(uint64_t seed, int64_t index) {
  return HashCombine(HashCombine(seed, kDuplicateStream), static_cast<uint64_t>(index));
}

Result<DuplicateResult> EvaluateDuplicate(Policy& policy, const DuplicateOptions& options) {
  if (options.hands < 2 || options.hands % 2 != 0) {
    return InvalidArgument("poker evaluation: hands must be an even number >= 2 (each deal is played from both "
                           "seats), got " + std::to_string(options.hands));
  }
  const int64_t deals = options.hands / 2;
  std::vector<TableSpec> tables;
  tables.reserve(options.hands);
  for (int64_t i = 0; i < deals; ++i) {
    const uint64_t deal = EvalDealSeed(options.seed, i);
    tables.push_back(TableSpec{deal, 0, options.opponent});
    tables.push_back(TableSpec{deal, 1, options.opponent});
  }
  RunnerOptions ro;
  ro.illegal = options.illegal;
  ro.max_batch = options.max_batch;
  ECHELON_ASSIGN_OR_RETURN(const std::vector<PlayedHand> played, PlayHands(tables, policy, options.seed, ro));
  DuplicateResult r;
  r.hands = options.hands;
  r.deals = deals;
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < deals; ++i) {
    // Mean mbb of the deal's two hands.
    const double v = 1000.0 * (played[2 * i].episode.reward + played[2 * i + 1].episode.reward) / 2;
    sum += v;
    sum_sq += v * v;
  }
  for (const PlayedHand& h : played) {
    r.decisions += static_cast<int64_t>(h.episode.turns.size());
    r.illegal += h.illegal;
  }
  r.mbb_per_hand = sum / deals;
  const double var = deals > 1 ? std::max(0.0, (sum_sq - sum * sum / deals) / (deals - 1)) : 0.0;
  const double half = 1.96 * std::sqrt(var / deals);
  r.ci95_lo = r.mbb_per_hand - half;
  r.ci95_hi = r.mbb_per_hand + half;
  return r;
}

}  // namespace echelon::data::poker
