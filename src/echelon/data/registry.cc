// The adapter registry: one static table, so adding a task is one line here plus its files.
#include <string>
#include <vector>

#include "echelon/data/adapter.h"
#include "echelon/data/http_env.h"
#include "echelon/data/math_adapter.h"
#include "echelon/data/poker/poker_adapter.h"
#include "echelon/data/prompts_adapter.h"

namespace echelon::data {
namespace {

using Factory = Result<std::unique_ptr<TaskAdapter>> (*)(const AdapterOptions&);

struct Registration {
  const char* name;
  Factory create;
  const OptionTable& (*options)();
};

const Registration kAdapters[] = {
    {"http-env", &CreateHttpEnvAdapter, &HttpEnvOptionTable},
    {"math", &CreateMathAdapter, &MathOptionTable},
    {"poker", &CreatePokerAdapter, &poker::PokerOptionTable},
    {"prompts", &CreatePromptsAdapter, &PromptsOptionTable},
};

}  // namespace

Result<std::unique_ptr<TaskAdapter>> CreateAdapter(const std::string& name,
                                                   const AdapterOptions& options) {
  for (const Registration& r : kAdapters) {
    if (name == r.name) return r.create(options);
  }
  std::string known;
  for (const std::string& n : AdapterNames()) known += (known.empty() ? "" : ", ") + n;
  return InvalidArgument("unknown task adapter \"" + name + "\"; known adapters: " + known);
}

const OptionTable* AdapterOptionTable(const std::string& name) {
  for (const Registration& r : kAdapters)
    if (name == r.name) return &r.options();
  return nullptr;
}

std::vector<std::string> AdapterNames() {
  std::vector<std::string> names;
  for (const Registration& r : kAdapters) names.push_back(r.name);
  return names;
}

}  // namespace echelon::data
