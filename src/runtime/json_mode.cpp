#include "runtime/json_mode.h"

#include <algorithm>

namespace dsa {

JsonVocab::JsonVocab(const Tokenizer& tok, int vocab)
    : end_(size_t(vocab)), flags_(size_t(vocab), 0), blank_len_(size_t(vocab), 0), blank_breaks_(size_t(vocab), 0) {
  for (int32_t id = 0; id < vocab; ++id) {
    if (tok.is_valid_id(id) && !tok.is_special(id) && !tok.token_bytes(id).empty()) {
      const std::string& b = tok.token_bytes(id);
      bytes_ += b;
      max_len_ = std::max(max_len_, b.size());
      bool safe = true, plain = true;
      for (unsigned char c : b) {
        safe &= c >= 0x20 && c != '"' && c != '\\';
        plain &= c != '<' && c != 0xEF;
      }
      flags_[size_t(id)] = uint8_t(kText | (safe ? kStringSafe : 0) | (plain ? kNoMarkup : 0));
      const size_t lead = std::min(b.find_first_not_of(" \t\n\r"), b.size());
      blank_len_[size_t(id)] = uint8_t(std::min<size_t>(lead, 255));
      blank_breaks_[size_t(id)] = uint8_t(std::min<ptrdiff_t>(std::count(b.begin(), b.begin() + ptrdiff_t(lead), '\n'), 255));
    }
    end_[size_t(id)] = uint32_t(bytes_.size());
  }
  build_index(false);
  build_index(true);
}

void JsonVocab::build_index(bool past_blank) {
  Index& x = index_[past_blank];
  auto key = [&](size_t id) {
    const std::string_view b = token(id);
    const size_t at = past_blank && blank_len_[id] < b.size() ? blank_len_[id] : 0;
    return static_cast<unsigned char>(b[at]);
  };
  for (size_t id = 0; id < size(); ++id)
    if (flags_[id] & kText) ++x.at[key(id) + 1];
  for (int c = 0; c < 256; ++c) x.at[c + 1] += x.at[c];
  x.ids.resize(x.at[256]);
  uint32_t fill[256];
  std::copy(x.at, x.at + 256, fill);
  for (size_t id = 0; id < size(); ++id)
    if (flags_[id] & kText) x.ids[fill[key(id)]++] = int32_t(id);
}

template <class Prefix>
bool GrammarMode<Prefix>::is_eos(int32_t id) const { return std::find(eos_.begin(), eos_.end(), id) != eos_.end(); }

template <class Prefix>
const uint8_t* GrammarMode<Prefix>::allowed() {
  std::fill(allowed_.begin(), allowed_.end(), uint8_t(0));
  const bool whole = state_.complete(), closed = state_.closed() && eos_ends_;
  if (!closed) {
    limit_ = !state_.closed() && state_.bounded_blanks();
    allow_unfed();
    allow_fed(allow_pattern());
  }
  for (int32_t id : eos_) allowed_[size_t(id)] = whole && eos_ends_;
  return allowed_.data();
}

template <class Prefix>
bool GrammarMode<Prefix>::blank_fits(const JsonVocab& v, size_t id, size_t blank, size_t breaks) {
  return blank + v.blank_len(id) <= kMaxBlank && breaks + v.blank_breaks(id) <= kMaxBreaks;
}

template <class Prefix>
bool GrammarMode<Prefix>::blank_ok(size_t id) const { return !limit_ || blank_fits(vocab_, id, blank_, breaks_); }

// Tokens taken whole without a feed: inside a string those of string-safe bytes (in a tool
// call, also free of markup bytes), in raw text those free of markup bytes, unless a bound on
// the string's length could refuse one (a token has no more characters than bytes).
template <class Prefix>
void GrammarMode<Prefix>::allow_unfed() {
  constexpr uint8_t kMarkup = Prefix::kGuardsMarkup ? JsonVocab::kNoMarkup : 0;
  const bool room = state_.string_room() >= vocab_.max_len();
  const uint8_t safe = !room ? 0 : state_.in_string() ? uint8_t(JsonVocab::kStringSafe | kMarkup) : state_.in_raw() ? JsonVocab::kNoMarkup : 0;
  if (!safe) return;
  const uint8_t want = safe | JsonVocab::kText;
  // blank_ok's inputs read once: stores through uint8_t may alias any member.
  const bool limit = limit_;
  const size_t blank = blank_, breaks = breaks_, n = allowed_.size();
  const JsonVocab& v = vocab_;
  uint8_t* allowed = allowed_.data();
  for (size_t id = 0; id < n; ++id)
    allowed[id] = (v.flags(id) & want) == want && (!limit || blank_fits(v, id, blank, breaks));
}

// At a pattern's character boundary, the tokens whose bytes only its automaton reads, decided
// by one walk of the pattern's vocabulary. It is built at the first mask that would feed many
// tokens: below that, feeding them costs less than the build.
template <class Prefix>
const PatternVocab* GrammarMode<Prefix>::allow_pattern() {
  Regex::Set at;
  uint32_t count = 0;
  const Regex* re = pattern_at(at, count);
  if (!re) return nullptr;
  auto it = std::find_if(patterns_.begin(), patterns_.end(), [&](const auto& p) { return &p->regex() == re; });
  if (it == patterns_.end()) {
    if (fan_out() < kPatternFanOut) return nullptr;
    auto decides = [this](size_t id) { return pattern_decides(id); };
    auto bytes = [this](size_t id) { return vocab_.token(id); };
    it = patterns_.insert(it, std::make_unique<PatternVocab>(*re, vocab_.size(), decides, bytes));
  }
  PatternVocab& pattern = **it;
  pattern.allow(at, count, allowed_.data());
  for (unsigned char c : {' ', '\t', '\n', '\r'})
    for (int32_t id : vocab_.starting_with(c, false)) allowed_[size_t(id)] &= uint8_t(blank_ok(size_t(id)));
  return &pattern;
}

template <class Prefix>
const Regex* GrammarMode<Prefix>::pattern_at(Regex::Set& s, uint32_t& count) const {
  if constexpr (requires { state_.pattern_at(s, count); }) return state_.pattern_at(s, count);
  else return nullptr;
}

// The tokens a mask would feed: those whose first byte the state takes (between tokens of the
// text, the first byte past leading whitespace).
template <class Prefix>
size_t GrammarMode<Prefix>::fan_out() const {
  const bool between = state_.between_tokens();
  size_t n = 0;
  for (int c = 0; c < 256; ++c) {
    Prefix first = state_;
    if (first.feed(static_cast<unsigned char>(c))) n += vocab_.starting_with(static_cast<unsigned char>(c), between).size();
  }
  return n;
}

// The rest, fed to a copy of the state where the recognizer takes their first byte. Where
// that byte is whitespace after which the text is between tokens (a number it ended, say), the
// rest of a token's leading whitespace changes nothing, so its first other byte must be taken
// there too: most tokens that begin with a space are refused without a feed.
template <class Prefix>
void GrammarMode<Prefix>::allow_fed(const PatternVocab* pattern) {
  const bool between = state_.between_tokens();
  for (int c = 0; c < 256; ++c) {
    Prefix first = state_;
    if (!first.feed(static_cast<unsigned char>(c))) continue;
    const bool past_blank = (c == ' ' || c == '\t' || c == '\n' || c == '\r') && first.between_tokens();
    uint8_t then[256];
    for (int d = 0; d < 256 && past_blank; ++d) {
      Prefix next = first;
      then[d] = next.feed(static_cast<unsigned char>(d));
    }
    for (int32_t id : vocab_.starting_with(static_cast<unsigned char>(c), between)) {
      if (allowed_[size_t(id)] || (pattern && pattern_decides(size_t(id))) || !blank_ok(size_t(id))) continue;
      const std::string_view b = vocab_.token(size_t(id));
      if (past_blank && vocab_.blank_len(size_t(id)) < b.size() && !then[static_cast<unsigned char>(b[vocab_.blank_len(size_t(id))])]) continue;
      Prefix next = state_;
      allowed_[size_t(id)] = next.feed(b);
    }
  }
}

template <class Prefix>
void GrammarMode<Prefix>::accept(int32_t id) {
  if (!(vocab_.flags(size_t(id)) & JsonVocab::kText) || is_eos(id)) return;
  const std::string_view b = vocab_.token(size_t(id));
  state_.feed(b);
  const size_t body = b.find_last_not_of(" \t\n\r");
  if (body != std::string_view::npos) blank_ = breaks_ = 0;  // the run starts after the token's last other byte
  const std::string_view tail = body == std::string_view::npos ? b : b.substr(body + 1);
  blank_ += tail.size();
  breaks_ += size_t(std::count(tail.begin(), tail.end(), '\n'));
}

template class GrammarMode<JsonSchemaPrefix>;
template class GrammarMode<ToolCallPrefix>;
template class GrammarMode<ChoicePrefix>;
template class GrammarMode<RegexPrefix>;

}  // namespace dsa
