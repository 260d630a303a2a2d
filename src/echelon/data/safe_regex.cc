#include "echelon/data/safe_regex.h"

#include <algorithm>
#include <limits>

namespace echelon::data {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();
// LastMatch keeps one capture array per live thread; threads are bounded by the program's
// consuming instructions, so this bounds its memory (16 MiB a queue).
constexpr size_t kMaxThreadSlots = size_t{1} << 21;
// The matcher's per-position state space, (pc, code): bounds its scratch memory and step cost.
constexpr size_t kMaxStates = 1000000;

bool IsWordByte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
bool IsAlnum(char c) { return IsWordByte(static_cast<unsigned char>(c)) && c != '_'; }

using ByteSet = SafeRegex::ByteSet;

ByteSet ClassEscapeSet(char c) {  // \d \D \w \W \s \S, as libstdc++'s "C" locale classifies bytes
  ByteSet s;
  for (int b = 0; b < 256; ++b) {
    const bool in = c == 'd' || c == 'D'   ? IsDigit(static_cast<char>(b))
                    : c == 'w' || c == 'W' ? IsWordByte(static_cast<unsigned char>(b))
                                           : b == ' ' || (b >= '\t' && b <= '\r');
    if (in != (c == 'D' || c == 'W' || c == 'S')) s.Add(static_cast<unsigned char>(b));
  }
  return s;
}

// ============================================================================================
// Parser: pattern -> syntax tree. Recursive descent; recursion follows group nesting only, which
// is bounded by SafeRegex::kMaxNesting.
// ============================================================================================

struct Node {
  enum Kind : uint8_t { kEmpty, kByte, kSet, kAssert, kCapture, kConcat, kAlt, kRepeat };
  Kind kind = kEmpty;
  int arg = 0;           // the byte, set index, assertion or group number
  int min = 0, max = 0;  // kRepeat; max -1 is unbounded
  bool greedy = true;
  bool plus = false;  // written x+ (libstdc++ loops over one copy), not x{1,} (a copy, then x*)
  size_t offset = 0;  // kRepeat: where its quantifier is
  std::vector<int> kids;
};

class Parser {
 public:
  Parser(std::string_view pattern, const std::string& where) : p_(pattern), where_(where) {}

  // The root node, or -1 with error() set.
  int Parse() {
    const int root = ParseAlternation(0);
    if (root >= 0 && i_ < p_.size()) return Fail(i_, "unmatched ')'");
    return root;
  }
  const Status& error() const { return error_; }
  std::vector<Node> nodes;
  std::vector<ByteSet> sets;
  int groups = 0;

 private:
  // One error per parse: the first one found.
  int Fail(size_t at, const std::string& what) {
    if (error_.ok()) error_ = InvalidArgument(where_ + ": " + what + " at offset " + std::to_string(at));
    return -1;
  }
  int Add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size()) - 1;
  }
  int AddByte(unsigned char c) {
    Node n;
    n.kind = Node::kByte;
    n.arg = c;
    return Add(std::move(n));
  }
  int AddSet(const ByteSet& s) {
    sets.push_back(s);
    Node n;
    n.kind = Node::kSet;
    n.arg = static_cast<int>(sets.size()) - 1;
    return Add(std::move(n));
  }
  bool More() const { return i_ < p_.size(); }
  bool At(char c) const { return More() && p_[i_] == c; }
  std::string Quote(size_t at, size_t len) const { return std::string(p_.substr(at, len)); }

  int ParseAlternation(int depth) {
    std::vector<int> alts;
    for (;;) {
      const int seq = ParseSequence(depth);
      if (seq < 0) return -1;
      alts.push_back(seq);
      if (!At('|')) break;
      ++i_;
    }
    if (alts.size() == 1) return alts[0];
    Node n;
    n.kind = Node::kAlt;
    n.kids = std::move(alts);
    return Add(std::move(n));
  }

  int ParseSequence(int depth) {
    std::vector<int> items;
    while (More() && !At('|') && !At(')')) {
      const int term = ParseTerm(depth);
      if (term < 0) return -1;
      items.push_back(term);
    }
    if (items.size() == 1) return items[0];
    Node n;
    n.kind = items.empty() ? Node::kEmpty : Node::kConcat;
    n.kids = std::move(items);
    return Add(std::move(n));
  }

  // An assertion, or an atom with its quantifier.
  int ParseTerm(int depth) {
    const size_t at = i_;
    const char c = p_[i_];
    int assertion = -1;
    if (c == '^') assertion = SafeRegex::kTextBegin;
    if (c == '$') assertion = SafeRegex::kTextEnd;
    if (c == '\\' && i_ + 1 < p_.size() && p_[i_ + 1] == 'b') assertion = SafeRegex::kWordBoundary;
    if (c == '\\' && i_ + 1 < p_.size() && p_[i_ + 1] == 'B') assertion = SafeRegex::kNotWordBoundary;
    if (assertion >= 0) {
      i_ += c == '\\' ? 2 : 1;
      if (QuantifierAhead())
        return Fail(i_, "quantifier '" + Quote(i_, 1) + "' after the assertion " + Quote(at, i_ - at) +
                            ", which cannot be repeated");
      Node n;
      n.kind = Node::kAssert;
      n.arg = assertion;
      return Add(std::move(n));
    }
    if (c == '{' && !BracesAhead()) return Fail(at, kBadBrace);
    if (QuantifierAhead()) return Fail(at, "quantifier '" + Quote(at, 1) + "' with nothing to repeat");
    const int atom = ParseAtom(depth);
    if (atom < 0) return -1;
    return ParseQuantifier(atom);
  }

  // Whether `{` at i_ begins {n}, {n,} or {n,m}.
  bool BracesAhead() const {
    size_t j = i_ + 1;
    const size_t digits = j;
    while (j < p_.size() && IsDigit(p_[j])) ++j;
    if (j == digits) return false;
    if (j < p_.size() && p_[j] == ',') ++j;
    while (j < p_.size() && IsDigit(p_[j])) ++j;
    return j < p_.size() && p_[j] == '}';
  }
  static constexpr const char* kBadBrace =
      "'{' does not start a repetition {n}, {n,} or {n,m} (write \\{ for a literal brace)";

  bool QuantifierAhead() const {
    if (!More()) return false;
    const char c = p_[i_];
    return c == '*' || c == '+' || c == '?' || c == '{';
  }

  int ParseQuantifier(int atom) {
    if (!QuantifierAhead()) return atom;
    const size_t at = i_;
    Node n;
    n.kind = Node::kRepeat;
    n.offset = at;
    n.kids = {atom};
    const char c = p_[i_++];
    if (c == '*') n.min = 0, n.max = -1;
    if (c == '+') n.min = 1, n.max = -1, n.plus = true;
    if (c == '?') n.min = 0, n.max = 1;
    if (c == '{' && !ParseBraces(at, &n.min, &n.max)) return -1;
    if (At('?')) {
      n.greedy = false;
      ++i_;
    }
    if (QuantifierAhead())
      return Fail(i_, "quantifier '" + Quote(i_, 1) + "' right after the quantifier " + Quote(at, i_ - at) +
                          " (write a group to repeat a repetition)");
    return Add(std::move(n));
  }

  // {n}, {n,} or {n,m}; `at` is the '{', already consumed.
  bool ParseBraces(size_t at, int* min, int* max) {
    auto number = [&](int* out) {
      if (!More() || !IsDigit(p_[i_])) return false;
      long long v = 0;
      while (More() && IsDigit(p_[i_])) {
        v = std::min<long long>(v * 10 + (p_[i_++] - '0'), 1LL << 40);
      }
      if (v > SafeRegex::kMaxRepeat) {
        Fail(at, "repetition count " + std::to_string(v) + " is over the limit of " +
                     std::to_string(SafeRegex::kMaxRepeat));
        return false;
      }
      *out = static_cast<int>(v);
      return true;
    };
    const std::string bad = kBadBrace;
    if (!number(min)) return Fail(at, bad) >= 0;
    *max = *min;
    if (At(',')) {
      ++i_;
      *max = -1;
      if (More() && IsDigit(p_[i_]) && !number(max)) return false;
    }
    if (!error_.ok()) return false;
    if (!At('}')) return Fail(at, bad) >= 0;
    ++i_;
    if (*max >= 0 && *max < *min)
      return Fail(at, "repetition " + Quote(at, i_ - at) + " has its maximum below its minimum") >= 0;
    return true;
  }

  int ParseAtom(int depth) {
    const char c = p_[i_];
    if (c == '(') return ParseGroup(depth);
    if (c == '[') return ParseClass();
    if (c == '.') {
      ByteSet s;
      for (int b = 0; b < 256; ++b)
        if (b != '\n' && b != '\r') s.Add(static_cast<unsigned char>(b));
      ++i_;
      return AddSet(s);
    }
    if (c == '\\') {
      ByteSet set;
      int byte = ParseEscape(false, &set);
      if (byte == -1) return -1;
      return byte == -2 ? AddSet(set) : AddByte(static_cast<unsigned char>(byte));
    }
    ++i_;
    return AddByte(static_cast<unsigned char>(c));  // ']' and '}' are literals, as in std::regex
  }

  int ParseGroup(int depth) {
    const size_t at = i_;
    if (depth + 1 > SafeRegex::kMaxNesting)
      return Fail(at, "groups nest deeper than " + std::to_string(SafeRegex::kMaxNesting));
    ++i_;
    int group = -1;
    if (At('?')) {
      const std::string_view rest = p_.substr(i_);
      auto starts = [&](std::string_view s) { return rest.substr(0, s.size()) == s; };
      if (starts("?=")) return Fail(at, "lookahead (?= is not supported");
      if (starts("?!")) return Fail(at, "negative lookahead (?! is not supported");
      if (starts("?<=")) return Fail(at, "lookbehind (?<= is not supported");
      if (starts("?<!")) return Fail(at, "negative lookbehind (?<! is not supported");
      if (starts("?<") || starts("?P") || starts("?'"))
        return Fail(at, "named group " + Quote(at, 3) + " is not supported");
      if (!starts("?:")) return Fail(at, "unknown group construct " + Quote(at, 3));
      i_ += 2;
    } else {
      group = ++groups;
    }
    const int inner = ParseAlternation(depth + 1);
    if (inner < 0) return -1;
    if (!At(')')) return Fail(at, "missing ')' for this '('");
    ++i_;
    if (group < 0) return inner;
    Node n;
    n.kind = Node::kCapture;
    n.arg = group;
    n.kids = {inner};
    return Add(std::move(n));
  }

  int ParseClass() {
    const size_t at = i_++;
    const bool negate = At('^');
    if (negate) ++i_;
    ByteSet s;
    for (;;) {
      if (!More()) return Fail(at, "missing ']' for this '['");
      if (At(']')) break;  // so "[]" is the empty class and "[^]" any byte, as in ECMAScript
      const size_t lo_at = i_;
      ByteSet lo_set;
      const int lo = ParseClassAtom(&lo_set);
      if (lo == -1) return -1;
      if (At('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        const size_t hi_at = i_;
        ByteSet hi_set;
        const int hi = ParseClassAtom(&hi_set);
        if (hi == -1) return -1;
        if (lo == -2) return Fail(lo_at, "class escape " + Quote(lo_at, 2) + " cannot start a range");
        if (hi == -2) return Fail(hi_at, "class escape " + Quote(hi_at, 2) + " cannot end a range");
        if (lo > hi) return Fail(lo_at, "range " + Quote(lo_at, i_ - lo_at) + " is out of order");
        for (int b = lo; b <= hi; ++b) s.Add(static_cast<unsigned char>(b));
      } else if (lo == -2) {
        for (int w = 0; w < 4; ++w) s.bits[w] |= lo_set.bits[w];
      } else {
        s.Add(static_cast<unsigned char>(lo));
      }
    }
    ++i_;
    if (negate)
      for (int w = 0; w < 4; ++w) s.bits[w] = ~s.bits[w];
    return AddSet(s);
  }

  // A byte (0-255), -2 with *set filled for a class escape, -1 on error.
  int ParseClassAtom(ByteSet* set) {
    const char c = p_[i_];
    if (c == '\\') return ParseEscape(true, set);
    if (c == '[' && i_ + 1 < p_.size() && (p_[i_ + 1] == ':' || p_[i_ + 1] == '.' || p_[i_ + 1] == '='))
      return Fail(i_, "POSIX class " + Quote(i_, 2) + " is not supported (write the bytes, e.g. [a-zA-Z])");
    ++i_;
    return static_cast<unsigned char>(c);
  }

  // The escape at i_ (a backslash): a byte (0-255), -2 with *set filled for \d \D \w \W \s \S,
  // -1 on error. \b and \B outside classes are assertions, handled by ParseTerm.
  int ParseEscape(bool in_class, ByteSet* set) {
    const size_t at = i_;
    if (i_ + 1 >= p_.size()) return Fail(at, "trailing backslash");
    const char c = p_[i_ + 1];
    i_ += 2;
    switch (c) {
      case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        *set = ClassEscapeSet(c);
        return -2;
      case 't': return '\t';
      case 'n': return '\n';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case 'b': return '\b';  // only reached inside a class
      case 'B': return Fail(at, "\\B inside a character class is not supported");
      case '0':
        if (More() && IsDigit(p_[i_])) return Fail(at, "octal escape " + Quote(at, 3) + " is not supported");
        return 0;
      case 'x':
      case 'u': {
        const size_t digits = c == 'x' ? 2 : 4;
        int v = 0;
        for (size_t k = 0; k < digits; ++k) {
          const int h = i_ < p_.size() ? HexValue(p_[i_]) : -1;
          if (h < 0) return Fail(at, std::string("\\") + c + " needs " + std::to_string(digits) + " hex digits");
          v = v * 16 + h;
          ++i_;
        }
        if (c == 'u' && v >= 0x80)
          return Fail(at, Quote(at, 6) + " is above \\u007F; the text is matched as bytes (write the UTF-8 bytes)");
        return v;
      }
      case 'c': return Fail(at, "control escape \\c is not supported");
      case 'k': return Fail(at, "named backreference \\k is not supported");
      case 'p': case 'P': return Fail(at, std::string("Unicode property escape \\") + c + " is not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') {
      while (More() && IsDigit(p_[i_])) ++i_;
      return Fail(at, "backreference " + Quote(at, i_ - at) + " is not supported" +
                          (in_class ? " (in a character class)" : ""));
    }
    if (IsAlnum(c)) return Fail(at, "unknown escape " + Quote(at, 2));
    return static_cast<unsigned char>(c);  // escaped punctuation (or any other byte) stands for itself
  }

  std::string_view p_;
  const std::string& where_;
  size_t i_ = 0;
  Status error_;
};

}  // namespace

// ============================================================================================
// Compiler: syntax tree -> program, laid out the way libstdc++ builds its NFA so that paths come
// in the same priority order: x* is a repeat node R (body x, which leads back to R, or on);
// x+ is x and then such an R over the same x; x? is R without the way back; x{n,m} is n copies
// and then m-n nested optional copies whose skips all go to the end; x{n,} is n copies and x*.
//
// libstdc++ bounds a repetition whose body can match empty by counting, per repeat node, how
// often the current path entered its body at the current text position: a third entry is
// refused and the path goes on past the node. Those counts change which path comes first, so
// the matcher keeps them (kCountedSplit). Only nodes whose body can match empty and that can be
// reached again at the same position need a count: such nodes inside the outermost repetition
// with an empty-capable body (a "counted region"). A node's count is one base-3 digit of a
// code; a region with m such nodes has 3^m codes, and the matcher's states are (pc, code).
// ============================================================================================

class SafeRegexCompiler {
 public:
  // Counts in one region: its 3^m codes multiply the matcher's work per byte (x27 at most).
  static constexpr int kMaxDigits = 3;

  SafeRegexCompiler(const std::vector<Node>& nodes, SafeRegex* re) : nodes_(nodes), re_(re) {
    nullable_.assign(nodes.size(), -1);
  }

  // False when the program outgrew SafeRegex::kMaxInstructions or a counted region ran out of
  // digits (too_many_counts() says which); emitting stops early then.
  bool Emit(int id) {
    if (re_->prog_.size() > SafeRegex::kMaxInstructions || too_many_counts_) return false;
    const Node& n = nodes_[id];
    switch (n.kind) {
      case Node::kEmpty: return true;
      case Node::kByte: Push(SafeRegex::Op::kByte, n.arg); return true;
      case Node::kSet: Push(SafeRegex::Op::kSet, n.arg); return true;
      case Node::kAssert: Push(SafeRegex::Op::kAssert, n.arg); return true;
      case Node::kCapture:
        Push(SafeRegex::Op::kSave, 2 * n.arg);
        if (!Emit(n.kids[0])) return false;
        Push(SafeRegex::Op::kSave, 2 * n.arg + 1);
        return true;
      case Node::kConcat:
        for (int kid : n.kids)
          if (!Emit(kid)) return false;
        return true;
      case Node::kAlt: {
        std::vector<size_t> to_end;
        for (size_t k = 0; k < n.kids.size(); ++k) {
          const bool last = k + 1 == n.kids.size();
          const size_t split = last ? 0 : Push(SafeRegex::Op::kSplit);
          if (!last) At(split).x = Here();
          if (!Emit(n.kids[k])) return false;
          if (!last) {
            to_end.push_back(Push(SafeRegex::Op::kJmp));
            At(split).y = Here();
          }
        }
        for (size_t j : to_end) At(j).x = Here();
        return true;
      }
      case Node::kRepeat: return EmitRepeat(n);
    }
    return true;
  }

  // Appends an instruction outside any counted region.
  void PushOutside(SafeRegex::Op op, int arg) { Push(op, arg); }
  bool too_many_counts() const { return too_many_counts_; }
  size_t region_offset() const { return region_offset_; }
  // Per instruction, how many codes its counted region has (1 outside regions).
  std::vector<uint32_t> codes;

 private:
  size_t Push(SafeRegex::Op op, int arg = 0) {
    SafeRegex::Inst in;
    in.op = op;
    in.arg = arg;
    re_->prog_.push_back(in);
    codes.push_back(1);
    return re_->prog_.size() - 1;
  }
  SafeRegex::Inst& At(size_t pc) { return re_->prog_[pc]; }
  int32_t Here() const { return static_cast<int32_t>(re_->prog_.size()); }

  bool Nullable(int id) {
    if (nullable_[id] >= 0) return nullable_[id];
    const Node& n = nodes_[id];
    bool r = false;
    switch (n.kind) {
      case Node::kEmpty: case Node::kAssert: r = true; break;
      case Node::kByte: case Node::kSet: r = false; break;
      case Node::kCapture: r = Nullable(n.kids[0]); break;
      case Node::kConcat:
        r = true;
        for (int kid : n.kids) r = r && Nullable(kid);
        break;
      case Node::kAlt:
        for (int kid : n.kids) r = r || Nullable(kid);
        break;
      case Node::kRepeat: r = n.min == 0 || Nullable(n.kids[0]); break;
    }
    nullable_[id] = r;
    return r;
  }

  // A repeat node at `pc`: body first when greedy. It counts when its body can match empty and
  // it can be reached again at one position (it loops, or a counted region encloses it).
  void RepeatNode(size_t pc, int32_t body, int32_t next, bool greedy, bool counted, bool leaves_region) {
    SafeRegex::Inst& in = At(pc);
    in.x = body;
    in.y = next;
    in.greedy = greedy;
    if (!counted) {
      in.op = SafeRegex::Op::kSplit;
      if (!greedy) std::swap(in.x, in.y);
      return;
    }
    in.op = SafeRegex::Op::kCountedSplit;
    in.arg = static_cast<int32_t>(digit_weights_[pc]);
    in.leaves_region = leaves_region;
  }
  // Gives the repeat node at pc its digit in the current region; false when it has no more.
  bool TakeDigit(size_t pc) {
    if (digits_ == kMaxDigits) {
      too_many_counts_ = true;
      return false;
    }
    uint32_t w = 1;
    for (int d = 0; d < digits_; ++d) w *= 3;
    digit_weights_.resize(re_->prog_.size(), 0);
    digit_weights_[pc] = w;
    ++digits_;
    return true;
  }
  // A loop whose body can match empty opens a region unless one is open already.
  bool OpenRegion(bool nullable_body, size_t offset) {
    if (!nullable_body || region_ >= 0) return false;
    region_ = static_cast<int>(re_->prog_.size());
    region_offset_ = offset;
    digits_ = 0;
    return true;
  }
  void CloseRegion() {
    uint32_t n = 1;
    for (int d = 0; d < digits_; ++d) n *= 3;
    for (size_t pc = static_cast<size_t>(region_); pc < re_->prog_.size(); ++pc) codes[pc] = n;
    region_ = -1;
  }

  bool EmitRepeat(const Node& n) {
    const int body = n.kids[0];
    for (int k = 0; k < n.min - (n.plus ? 1 : 0); ++k)
      if (!Emit(body)) return false;
    if (n.max == -1) return n.plus ? EmitPlus(body, n) : EmitStar(body, n);
    // (x(x(x)?)?)?: each optional counts only inside a region, where it can be reached again.
    const bool counted = region_ >= 0 && Nullable(body);
    std::vector<size_t> nodes;
    for (int k = n.min; k < n.max; ++k) {
      nodes.push_back(Push(SafeRegex::Op::kSplit));
      if (counted && !TakeDigit(nodes.back())) return false;
      if (!Emit(body)) return false;
    }
    for (size_t r : nodes) RepeatNode(r, static_cast<int32_t>(r + 1), Here(), n.greedy, counted, false);
    return true;
  }

  //   R: repeat(body B, next E)
  //   B: body; jmp R
  //   E:
  bool EmitStar(int body, const Node& n) {
    const bool greedy = n.greedy;
    const bool counted = Nullable(body);
    const bool opened = OpenRegion(counted, n.offset);
    const size_t r = Push(SafeRegex::Op::kSplit);
    if (counted && !TakeDigit(r)) return false;
    if (!Emit(body)) return false;
    Push(SafeRegex::Op::kJmp);
    At(re_->prog_.size() - 1).x = static_cast<int32_t>(r);
    RepeatNode(r, static_cast<int32_t>(r + 1), Here(), greedy, counted, opened);
    if (opened) CloseRegion();
    return true;
  }

  //   B: body
  //   R: repeat(body B, next E)
  //   E:
  bool EmitPlus(int body, const Node& n) {
    const bool greedy = n.greedy;
    const bool counted = Nullable(body);
    const bool opened = OpenRegion(counted, n.offset);
    const int32_t start = Here();
    if (!Emit(body)) return false;
    const size_t r = Push(SafeRegex::Op::kSplit);
    if (counted && !TakeDigit(r)) return false;
    RepeatNode(r, start, Here(), greedy, counted, opened);
    if (opened) CloseRegion();
    return true;
  }

  const std::vector<Node>& nodes_;
  SafeRegex* re_;
  std::vector<int8_t> nullable_;
  std::vector<uint32_t> digit_weights_;
  int region_ = -1;  // first pc of the open counted region, -1 when none is open
  size_t region_offset_ = 0;  // the pattern offset of the repetition that opened it
  int digits_ = 0;   // digits taken in the open region
  bool too_many_counts_ = false;
};

Result<SafeRegex> SafeRegex::Compile(std::string_view pattern, const std::string& where) {
  if (pattern.size() > kMaxPatternBytes)
    return InvalidArgument(where + ": the pattern is " + std::to_string(pattern.size()) +
                           " bytes; the limit is " + std::to_string(kMaxPatternBytes));
  Parser parser(pattern, where);
  const int root = parser.Parse();
  if (root < 0) return parser.error();

  SafeRegex re;
  re.groups_ = parser.groups;
  re.sets_ = std::move(parser.sets);
  SafeRegexCompiler compiler(parser.nodes, &re);
  compiler.PushOutside(Op::kSave, 0);
  const bool fits = compiler.Emit(root);
  if (compiler.too_many_counts())
    return InvalidArgument(where + ": the repetition at offset " + std::to_string(compiler.region_offset()) +
                           " can match empty and holds more than " + std::to_string(SafeRegexCompiler::kMaxDigits) +
                           " repetitions or optional parts that can match empty, itself included (as in "
                           "((((a*)*)*)*)*), which std::regex backtracks through exponentially; simplify it");
  if (!fits || re.prog_.size() + 2 > kMaxInstructions)
    return InvalidArgument(where + ": the pattern compiles to more than " + std::to_string(kMaxInstructions) +
                           " instructions (counted repetitions multiply what they repeat); simplify it");
  compiler.PushOutside(Op::kSave, 1);
  compiler.PushOutside(Op::kMatch, 0);

  size_t states = 0, threads = 0;
  re.state_base_.resize(re.prog_.size());
  for (size_t pc = 0; pc < re.prog_.size(); ++pc) {
    re.state_base_[pc] = static_cast<uint32_t>(std::min<size_t>(states, UINT32_MAX));
    states += compiler.codes[pc];
    const Op op = re.prog_[pc].op;
    threads += op == Op::kByte || op == Op::kSet || op == Op::kMatch;
  }
  if (states > kMaxStates)
    return InvalidArgument(where + ": repetitions that can match empty, copied by counted repetitions, need " +
                           std::to_string(states) + " matcher states; the limit is " + std::to_string(kMaxStates));
  const size_t slots = 2 * (static_cast<size_t>(re.groups_) + 1);
  if (threads * slots > kMaxThreadSlots)
    return InvalidArgument(where + ": " + std::to_string(re.groups_) + " groups over " + std::to_string(threads) +
                           " matching instructions need more than " + std::to_string(kMaxThreadSlots) +
                           " capture slots; use fewer groups or (?:...) or smaller repetitions");
  re.num_states_ = static_cast<uint32_t>(states);
  return re;
}

// ============================================================================================
// Matcher: a Pike VM. The threads alive at a text position sit in a queue in priority order
// (the order a backtracking matcher would try them); a thread is a consuming or match
// instruction plus its capture slots. Moving to the next position follows every thread's
// non-consuming paths with an explicit stack (never recursion), visiting each state (pc, code)
// once per position: a later (lower-priority) arrival at a state has the same future as the
// first, so it can only repeat what the first one did.
// ============================================================================================

class SafeRegexMatcher {
 public:
  SafeRegexMatcher(const SafeRegex& re, std::string_view text, bool captures)
      : re_(re), text_(text), slots_(captures ? 2 * (static_cast<size_t>(re.groups_) + 1) : 0) {
    for (Queue* q : {&clist_, &nlist_}) {
      q->index.assign(re.prog_.size(), 0);
      q->threads.reserve(re.prog_.size() + 4);
    }
    step_stamp_.assign(re.num_states_, 0);
    start_stamp_.assign(re.num_states_, 0);
    work_.assign(slots_, kNone);
  }

  bool FullMatch() {
    Start(0, Context{0, kNone, kNone});
    const int32_t match_pc = static_cast<int32_t>(re_.prog_.size()) - 1;
    for (size_t p = 0;; ++p) {
      if (clist_.threads.empty()) return false;
      if (p == text_.size()) return clist_.HasLive(match_pc);
      Step(p, false);
      std::swap(clist_, nlist_);
      nlist_.Clear();
    }
  }

  // Runs every search std::sregex_iterator would run, all in one pass (see Level).
  std::optional<SafeRegex::Match> LastMatch() {
    Spawn(Level{}, 0);
    for (size_t p = 0;; ++p) {
      Level& bottom = levels_.back();
      if (!bottom.has_best && p > bottom.start) Start(p, Context{bottom.id, kNone, kNone});
      Step(p, true);
      if (p == text_.size()) break;
      Settle();
      std::swap(clist_, nlist_);
      nlist_.Clear();
    }
    for (auto it = levels_.rbegin(); it != levels_.rend(); ++it) {
      if (!it->has_best) continue;
      SafeRegex::Match m;
      m.begin = it->best[0];
      m.end = it->best[1];
      for (int g = 1; g <= re_.groups_; ++g) {
        const size_t b = it->best[2 * g], e = it->best[2 * g + 1];
        if (e == kNone) {
          m.groups.emplace_back(std::nullopt);
        } else {
          m.groups.emplace_back(std::make_pair(b, e));
        }
      }
      return m;
    }
    return std::nullopt;
  }

 private:
  struct Thread {
    int32_t pc;
    uint32_t level;
    bool alive;
  };
  // Threads in priority order; index maps a pc to its thread, so each pc is taken once.
  struct Queue {
    std::vector<uint32_t> index;
    std::vector<Thread> threads;
    std::vector<size_t> caps;  // threads.size() x slots
    bool HasLive(int32_t pc) const {
      const uint32_t i = index[pc];
      return i < threads.size() && threads[i].pc == pc && threads[i].alive;
    }
    void Clear() {
      threads.clear();
      caps.clear();
    }
  };

  // One search of the iteration (std::regex_search from `start`). The searches run side by
  // side: when a search has a best match so far, the next search starts at its end at once, and
  // is thrown away (with those after it) if that best match changes. A thread of a later search
  // that reaches a pc some earlier search holds at the same position is dropped: both have the
  // same future, and if the earlier one matches, the later search is thrown away anyway. So the
  // queues hold at most one thread per pc however many searches are open, and the text is read
  // once.
  struct Level {
    uint32_t id = 0;
    size_t start = 0;
    // After an empty match libstdc++ first retries at the same position with match_not_null |
    // match_continuous, then searches from the next byte: `retry` marks such a search.
    bool retry = false;
    // The search runs without match_prev_avail at `start` (libstdc++ sets it only once an
    // increment reaches its main search), so ^ holds there and \b sees no byte before it.
    bool no_prev = false;
    bool has_best = false;
    std::vector<size_t> best;
    size_t threads = 0;
  };

  struct Context {
    uint32_t level;
    size_t reject_empty_at;  // match_not_null: no match may end at this position
    size_t no_prev_at;       // where ^ holds and \b sees no byte before
  };

  struct Frame {
    int32_t pc;
    uint32_t code;  // the repeat counts of pc's counted region
    int32_t slot;   // >= 0: restore caps[slot] = value
    size_t value;
  };

  static uint32_t NextGen(std::vector<uint32_t>& stamps, uint32_t& gen) {
    if (++gen == 0) {
      std::fill(stamps.begin(), stamps.end(), 0);
      gen = 1;
    }
    return gen;
  }

  bool Holds(int assertion, size_t p, size_t no_prev_at) const {
    const size_t n = text_.size();
    const bool begin = p == 0 || p == no_prev_at;
    if (assertion == SafeRegex::kTextBegin) return begin;
    if (assertion == SafeRegex::kTextEnd) return p == n;
    const bool left = !begin && IsWordByte(static_cast<unsigned char>(text_[p - 1]));
    const bool right = p < n && IsWordByte(static_cast<unsigned char>(text_[p]));
    return (left != right) == (assertion == SafeRegex::kWordBoundary);
  }

  // A new search's first thread at p, with its own visited set: a dropped thread of an earlier
  // search may have visited states the new one must still pass.
  void Start(size_t p, const Context& ctx) {
    std::fill(work_.begin(), work_.end(), kNone);
    Closure(clist_, 0, p, ctx, start_stamp_, NextGen(start_stamp_, start_gen_));
  }

  // Adds to q, in priority order, the threads reachable from pc at position p without
  // consuming a byte, starting from the captures in work_ (restored before returning).
  void Closure(Queue& q, int32_t pc0, size_t p, const Context& ctx, std::vector<uint32_t>& stamps,
               uint32_t gen) {
    const auto& prog = re_.prog_;
    stack_.push_back({pc0, 0, -1, 0});
    while (!stack_.empty()) {
      const Frame f = stack_.back();
      stack_.pop_back();
      if (f.slot >= 0) {
        work_[f.slot] = f.value;
        continue;
      }
      int32_t pc = f.pc;
      uint32_t code = f.code;
      for (bool go = true; go;) {
        uint32_t& stamp = stamps[re_.state_base_[pc] + code];
        if (stamp == gen) break;
        stamp = gen;
        const SafeRegex::Inst& in = prog[pc];
        switch (in.op) {
          case SafeRegex::Op::kMatch:
            if (p == ctx.reject_empty_at) {
              go = false;
              break;
            }
            [[fallthrough]];
          case SafeRegex::Op::kByte:
          case SafeRegex::Op::kSet:
            if (!q.HasLive(pc)) {
              q.index[pc] = static_cast<uint32_t>(q.threads.size());
              q.threads.push_back({pc, ctx.level, true});
              q.caps.insert(q.caps.end(), work_.begin(), work_.end());
            }
            go = false;
            break;
          case SafeRegex::Op::kJmp: pc = in.x; break;
          case SafeRegex::Op::kSplit:
            stack_.push_back({in.y, code, -1, 0});
            pc = in.x;
            break;
          case SafeRegex::Op::kCountedSplit: {
            // Entering the body counts; past the third entry at this position only `next` is
            // left. Leaving the outermost counted repetition leaves its region and its counts.
            const uint32_t w = static_cast<uint32_t>(in.arg);
            const bool enter = (code / w) % 3 < 2;
            const uint32_t next_code = in.leaves_region ? 0 : code;
            if (in.greedy) {
              if (enter) stack_.push_back({in.y, next_code, -1, 0});
              pc = enter ? in.x : in.y;
              code = enter ? code + w : next_code;
            } else {
              if (enter) stack_.push_back({in.x, code + w, -1, 0});
              pc = in.y;
              code = next_code;
            }
            break;
          }
          case SafeRegex::Op::kSave:
            if (static_cast<size_t>(in.arg) < slots_) {
              stack_.push_back({0, 0, in.arg, work_[in.arg]});
              work_[in.arg] = p;
            }
            ++pc;
            break;
          case SafeRegex::Op::kAssert:
            go = Holds(in.arg, p, ctx.no_prev_at);
            ++pc;
            break;
        }
      }
    }
  }

  // Advances clist_'s threads over the byte at p into nlist_; with levels, also takes the
  // matches ending at p.
  void Step(size_t p, bool take_matches) {
    const uint32_t gen = NextGen(step_stamp_, step_gen_);
    const bool more = p < text_.size();
    const unsigned char c = more ? static_cast<unsigned char>(text_[p]) : 0;
    // clist_ may grow while this runs: a match starts the next search here.
    for (size_t i = 0; i < clist_.threads.size(); ++i) {
      const Thread t = clist_.threads[i];
      if (!t.alive) continue;
      const SafeRegex::Inst& in = re_.prog_[t.pc];
      if (in.op == SafeRegex::Op::kMatch) {
        if (take_matches) TakeMatch(i, p);
        continue;
      }
      if (!more) continue;
      const bool ok = in.op == SafeRegex::Op::kByte ? c == static_cast<unsigned char>(in.arg)
                                                    : re_.sets_[in.arg].Has(c);
      if (!ok) continue;
      std::copy_n(clist_.caps.begin() + static_cast<std::ptrdiff_t>(i * slots_), slots_, work_.begin());
      Closure(nlist_, t.pc + 1, p + 1, Context{t.level, kNone, kNone}, step_stamp_, gen);
    }
  }

  Level* Find(uint32_t id) {
    auto it = std::lower_bound(levels_.begin(), levels_.end(), id,
                               [](const Level& l, uint32_t v) { return l.id < v; });
    return it != levels_.end() && it->id == id ? &*it : nullptr;
  }

  // The thread at clist_ index i matched at p: it beats every thread after it (lower priority
  // in its search, or in a search that started from an end this match now replaces).
  void TakeMatch(size_t i, size_t p) {
    Level* level = Find(clist_.threads[i].level);
    if (level == nullptr) {  // cannot happen: a thrown-away search's threads are cut with it
      clist_.threads[i].alive = false;
      return;
    }
    level->has_best = true;
    level->best.assign(clist_.caps.begin() + static_cast<std::ptrdiff_t>(i * slots_),
                       clist_.caps.begin() + static_cast<std::ptrdiff_t>((i + 1) * slots_));
    clist_.threads[i].alive = false;
    clist_.threads.resize(i + 1);
    clist_.caps.resize((i + 1) * slots_);
    levels_.erase(levels_.begin() + (level - levels_.data()) + 1, levels_.end());
    Spawn(levels_.back(), p);
  }

  // Opens the search std::sregex_iterator runs after `prev`'s match (the first search when
  // prev has none) and gives it its first thread at p.
  void Spawn(const Level& prev, size_t p) {
    Level next;
    next.id = next_id_++;
    next.start = p;
    if (prev.has_best) {
      const size_t b = prev.best[0], e = prev.best[1];
      if (b == e) {
        if (e == text_.size()) return;  // the iterator ends after an empty match at the end
        // match_prev_avail is set once an increment has run its main search: in any search but
        // the first, except a retry whose own retry found the match.
        const bool prev_avail = prev.retry && b == prev.start ? !prev.no_prev : prev.id != 0;
        next.retry = true;
        next.no_prev = !prev_avail;
      }
    }
    levels_.push_back(next);
    Start(p, Context{next.id, next.retry ? p : kNone, next.no_prev ? p : kNone});
  }

  // Counts each search's threads and forgets settled searches that no longer matter: one with a
  // final match (no threads left) whose successor has found a match of its own.
  void Settle() {
    for (Level& l : levels_) l.threads = 0;
    for (const Thread& t : nlist_.threads)
      if (Level* l = Find(t.level)) l->threads++;
    for (size_t j = 0; j + 1 < levels_.size();) {
      if (levels_[j].has_best && levels_[j].threads == 0 && levels_[j + 1].has_best) {
        levels_.erase(levels_.begin() + static_cast<std::ptrdiff_t>(j));
      } else {
        ++j;
      }
    }
  }

  const SafeRegex& re_;
  std::string_view text_;
  size_t slots_;
  Queue clist_, nlist_;
  std::vector<uint32_t> step_stamp_, start_stamp_;
  uint32_t step_gen_ = 0, start_gen_ = 0;
  std::vector<size_t> work_;
  std::vector<Frame> stack_;
  std::vector<Level> levels_;
  uint32_t next_id_ = 0;
};

bool SafeRegex::FullMatch(std::string_view text) const { return SafeRegexMatcher(*this, text, false).FullMatch(); }

std::optional<SafeRegex::Match> SafeRegex::LastMatch(std::string_view text) const {
  return SafeRegexMatcher(*this, text, true).LastMatch();
}

}  // namespace echelon::data
