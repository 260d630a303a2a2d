#include "echelon/plan/price_catalog.h"

#include "echelon/plan/yaml_reader.h"

namespace echelon::plan {

const GpuSpec* PriceCatalog::Find(const std::string& name) const {
  for (const GpuSpec& g : gpus_)
    if (g.name == name) return &g;
  return nullptr;
}

std::string PriceCatalog::Names() const {
  std::string s;
  for (const GpuSpec& g : gpus_) s += (s.empty() ? "" : ", ") + g.name;
  return s;
}

Result<PriceCatalog> LoadPriceCatalog(const std::string& path) {
  ECHELON_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  YamlMap top(root, path, "");
  std::string as_of;
  ECHELON_RETURN_IF_ERROR(top.String("as_of", &as_of, true));
  std::string note;
  ECHELON_RETURN_IF_ERROR(top.String("note", &note));
  ECHELON_ASSIGN_OR_RETURN(YAML::Node list, top.Sequence("gpus", true));
  ECHELON_RETURN_IF_ERROR(top.NoUnknownKeys());
  PriceCatalog cat;
  for (size_t i = 0; i < list.size(); ++i) {
    YamlMap m(list[i], path, "gpus[" + std::to_string(i) + "].");
    ECHELON_RETURN_IF_ERROR(m.status());
    GpuSpec g;
    ECHELON_RETURN_IF_ERROR(m.String("name", &g.name, true));
    ECHELON_RETURN_IF_ERROR(m.Float("memory_gb", &g.memory_gb, 1, 1e4, true));
    ECHELON_RETURN_IF_ERROR(m.Float("memory_bandwidth_gbs", &g.memory_bandwidth_gbs, 1, 1e5, true));
    ECHELON_RETURN_IF_ERROR(m.Float("bf16_tflops", &g.bf16_tflops, 0.1, 1e5, true));
    ECHELON_RETURN_IF_ERROR(m.Float("price_per_hour", &g.price_per_hour, 0, 1e3, true));
    ECHELON_RETURN_IF_ERROR(m.String("price_source", &g.price_source, true));
    ECHELON_RETURN_IF_ERROR(m.String("spec_source", &g.spec_source, true));
    ECHELON_RETURN_IF_ERROR(m.NoUnknownKeys());
    if (cat.Find(g.name) != nullptr)
      return InvalidArgument(m.Where("name") + ": duplicate GPU name '" + g.name + "'");
    cat.Add(std::move(g));
  }
  return cat;
}

}  // namespace echelon::plan
