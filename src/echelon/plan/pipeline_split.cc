#include "echelon/plan/pipeline_split.h"

namespace echelon::plan {

LayerSplitInput PipelineSplitInput(const sched::PipelineModelShape& shape,
                                   const std::vector<sched::StageOffer>& stages) {
  const double bytes = shape.dtype == "float32" ? 4.0 : 2.0;
  const double embed = static_cast<double>(shape.vocab_size) * static_cast<double>(shape.hidden_size);
  // Outside the decoder layers: the embedding, the lm_head unless tied, the final norm.
  const double outer = embed * (shape.tied_embeddings ? 1 : 2) + static_cast<double>(shape.hidden_size);
  LayerSplitInput in;
  in.layers = shape.layers;
  if (shape.layers > 0) in.layer_bytes = (shape.parameters - outer) / static_cast<double>(shape.layers) * bytes;
  in.first_bytes = outer * bytes;
  for (const sched::StageOffer& s : stages)
    in.stages.push_back({s.name, s.memory_bytes > 0 ? s.memory_bytes : 1e300,
                         s.seconds_per_layer > 0 ? s.seconds_per_layer : 1.0});
  return in;
}

Result<std::vector<int64_t>> SplitPipelineLayers(const sched::PipelineModelShape& shape,
                                                 const std::vector<sched::StageOffer>& stages) {
  ECHELON_ASSIGN_OR_RETURN(LayerSplit split,
                           SplitLayers(PipelineSplitInput(shape, stages), SplitObjective::kThroughput));
  return split.layers;
}

}  // namespace echelon::plan
