// Fuzzes the regex reward matcher (data/safe_regex.h), whose text a worker chooses. The input's
// first line is the pattern (as a user's task option would give it), the rest the text; a
// pattern that compiles is run over the text both ways, and each span it reports must lie in
// the text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "echelon/data/safe_regex.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  if (newline == std::string_view::npos) return 0;
  echelon::Result<echelon::data::SafeRegex> re = echelon::data::SafeRegex::Compile(input.substr(0, newline), "fuzz");
  if (!re.ok()) return 0;
  const std::string_view text = input.substr(newline + 1);
  (void)re->FullMatch(text);
  const std::optional<echelon::data::SafeRegex::Match> last = re->LastMatch(text);
  if (!last) return 0;
  if (last->begin > last->end || last->end > text.size() ||
      last->groups.size() != static_cast<size_t>(re->groups()))
    std::abort();
  for (const auto& g : last->groups)
    if (g && (g->first > g->second || g->second > text.size())) std::abort();
  return 0;
}
