// How a learner's metrics.jsonl line (obs/step_record.h) is exposed to Prometheus: one table
// from each key to a series name in base units, its type and its help text.
//
//   PublishStepLine(record.ToJson(), http.registry());   // after every update
//
// Running totals of the line (groups_issued, refused, actor_groups, ...) are counters named
// `*_total`; everything else is a gauge of the last update. A map of numbers becomes one series
// per key under the table's label (refused{reason=...}); keys the table does not know (a
// reward's own metrics, fields added later) are gauges `echelon_<key>`.
//
// Thread contract: free functions; the registry is thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include "echelon/obs/metrics_http.h"

namespace echelon::obs {

void PublishStepLine(const nlohmann::json& line, MetricsRegistry& registry);

}  // namespace echelon::obs
