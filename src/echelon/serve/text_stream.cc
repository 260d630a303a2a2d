#include "echelon/serve/text_stream.h"

#include <algorithm>

namespace echelon::serve {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD: what an incomplete UTF-8 tail decodes to

bool EndsIncomplete(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, kReplacement) == 0;
}

}  // namespace

TextStream::TextStream(Decoder decode, std::vector<std::string> stop, std::set<int64_t> hidden_ids)
    : decode_(std::move(decode)), stop_(std::move(stop)), hidden_(std::move(hidden_ids)) {}

std::string TextStream::Push(int64_t token) {
  if (stopped_ || hidden_.count(token) > 0) return "";
  tokens_.push_back(token);
  const std::vector<int64_t> window(tokens_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_), tokens_.end());
  const std::vector<int64_t> read(tokens_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_),
                                  tokens_.begin() + static_cast<std::ptrdiff_t>(read_offset_));
  const std::string before = decode_(read);
  const std::string now = decode_(window);
  if (now.size() > before.size() && !EndsIncomplete(now)) {
    pending_ += now.substr(before.size());
    prefix_offset_ = read_offset_;
    read_offset_ = tokens_.size();
  }
  return Release(false);
}

std::string TextStream::Finish() {
  if (!stopped_ && read_offset_ < tokens_.size()) {
    const std::vector<int64_t> window(tokens_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_), tokens_.end());
    const std::vector<int64_t> read(tokens_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_),
                                    tokens_.begin() + static_cast<std::ptrdiff_t>(read_offset_));
    const std::string before = decode_(read);
    const std::string now = decode_(window);
    if (now.size() > before.size()) pending_ += now.substr(before.size());
    prefix_offset_ = read_offset_ = tokens_.size();
  }
  return Release(true);
}

std::string TextStream::Release(bool final) {
  if (stopped_) return "";
  size_t first = std::string::npos;
  for (const std::string& s : stop_) first = std::min(first, pending_.find(s));
  std::string out;
  if (first != std::string::npos) {
    out = pending_.substr(0, first);
    stopped_ = true;
    pending_.clear();
  } else if (final) {
    out.swap(pending_);
  } else {
    // Hold the longest tail of pending_ that a stop string starts with.
    size_t hold = 0;
    for (const std::string& s : stop_) {
      for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
        if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
  }
  released_ += out;
  return out;
}

}  // namespace echelon::serve
