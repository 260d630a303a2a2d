// TextStream: the text of one choice as its tokens arrive, with stop strings, so that streamed
// deltas concatenate to exactly the non-streamed text (both paths use this class).
//
//   TextStream ts(decode, {"\n\n"}, {eos_id});
//   std::string delta = ts.Push(token);      // text that became final ("" while held back)
//   if (ts.stopped()) ...                    // a stop string matched: the choice is over
//   delta += ts.Finish();                    // at the end of generation: whatever was held
//
// Decoding is incremental over a window of tokens (the last complete character's tokens onward),
// so a token that ends inside a UTF-8 sequence shows nothing until the sequence completes. Text
// that could be the start of a stop string is held until it cannot; a matched stop string and
// everything after it are dropped (OpenAI semantics). Tokens in `hidden_ids` (EOS and stop
// token ids) contribute no text.
//
// Thread contract: a value owned by one request.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace echelon::serve {

class TextStream {
 public:
  using Decoder = std::function<std::string(const std::vector<int64_t>&)>;

  TextStream(Decoder decode, std::vector<std::string> stop, std::set<int64_t> hidden_ids);

  std::string Push(int64_t token);
  std::string Finish();
  bool stopped() const { return stopped_; }
  // All text released so far (after Finish: the choice's whole text).
  const std::string& text() const { return released_; }

 private:
  // Releases what is safe of pending_ (all of it when `final`); returns the new text.
  std::string Release(bool final);

  Decoder decode_;
  std::vector<std::string> stop_;
  std::set<int64_t> hidden_;
  std::vector<int64_t> tokens_;  // visible tokens
  size_t prefix_offset_ = 0;     // tokens_[prefix_offset_, read_offset_) decode to already-read text
  size_t read_offset_ = 0;
  std::string pending_;   // decoded, not yet released (may start a stop string)
  std::string released_;
  bool stopped_ = false;
};

}  // namespace echelon::serve
