// PriceCatalog: public hardware facts and hourly rental prices per GPU type, loaded from
// data/prices.yaml. Throughputs are not stored here: they depend on the model and are
// derived by throughput_model.h from these specs (or measured and given in a plan config).
//
//   ECHELON_ASSIGN_OR_RETURN(PriceCatalog cat, LoadPriceCatalog("data/prices.yaml"));
//   const GpuSpec* g = cat.Find("rtx5090");   // nullptr when unknown
//
// Thread contract: immutable after loading; safe for concurrent reads.
#pragma once

#include <string>
#include <vector>

#include "echelon/common/status.h"

namespace echelon::plan {

struct GpuSpec {
  std::string name;               // catalogue key, e.g. "h200"
  double memory_gb = 0;           // device memory
  double memory_bandwidth_gbs = 0;  // peak DRAM bandwidth, GB/s
  double bf16_tflops = 0;         // peak dense bf16 tensor TFLOP/s (fp32 accumulate)
  double price_per_hour = 0;      // USD per GPU-hour, on-demand list price
  std::string price_source;       // provider and date, as written in the file
  std::string spec_source;
};

class PriceCatalog {
 public:
  const GpuSpec* Find(const std::string& name) const;
  const std::vector<GpuSpec>& gpus() const { return gpus_; }
  std::string Names() const;  // "a100, h100, ..." for error messages
  void Add(GpuSpec spec) { gpus_.push_back(std::move(spec)); }

 private:
  std::vector<GpuSpec> gpus_;
};

// Strict: unknown keys, missing fields and duplicate names are errors naming file:line.
Result<PriceCatalog> LoadPriceCatalog(const std::string& path);

}  // namespace echelon::plan
