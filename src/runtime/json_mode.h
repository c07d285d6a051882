#pragma once
// Constrained replies: JSON mode (GenerateOptions::json) and forced tool calls
// (GenerateOptions::tool_calls). Before each draw, the mask of the tokens whose bytes keep
// the reply the start of a JSON text its schema admits (any object without one), or of a
// tool-call block the tools admit.
//
// JsonVocab is the vocabulary as JSON mode reads it, the same for every request: each
// token's bytes back to back, its class and its leading whitespace. Whoever holds the
// tokenizer (the scheduler, the generator) builds it once and hands it to each request.
// GrammarMode is one request's state: the recognizer over its reply and its mask. Inside a
// string most tokens need no feed (no quote, backslash or control byte; in a tool call also no
// markup byte), in a tool call's raw text neither (no markup byte): one pass over the flags
// takes them. Inside a patterned string or a regex reply, at a character's start, the
// pattern's vocabulary (sampling/pattern_vocab.h) decides the tokens whose bytes only the
// automaton reads, once the pattern lets so many tokens begin that feeding them would cost
// more than building it. Of the rest, only the tokens whose first byte the recognizer takes
// are fed, each to a copy of the state, found through the table's index by first byte
// (between tokens of the text, the first byte past leading whitespace, which changes nothing
// there).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "sampling/choice_grammar.h"
#include "sampling/json_schema.h"
#include "sampling/pattern_vocab.h"
#include "sampling/regex.h"
#include "sampling/tool_call_grammar.h"
#include "tokenizer/tokenizer.h"

namespace dsa {

class JsonVocab {
public:
  // vocab: the model's (ids past the tokenizer's are never allowed).
  JsonVocab(const Tokenizer& tok, int vocab);
  // Token classes, as bits: kText: reply text (not a special token, unknown or empty);
  // kStringSafe: bytes that keep a JSON string open (no quote, backslash or control byte);
  // kNoMarkup: no byte that could begin DSML markup ('<' or 0xEF, the first byte of "｜").
  enum Flag : uint8_t { kText = 1, kStringSafe = 2, kNoMarkup = 4 };
  size_t size() const { return flags_.size(); }
  uint8_t flags(size_t id) const { return flags_[id]; }
  // The token's leading whitespace (all of it when it is only whitespace): its bytes (at most
  // 255) and its line feeds.
  uint8_t blank_len(size_t id) const { return blank_len_[id]; }
  uint8_t blank_breaks(size_t id) const { return blank_breaks_[id]; }
  size_t max_len() const { return max_len_; }  // the longest text token's bytes
  std::string_view token(size_t id) const {
    const uint32_t b = id > 0 ? end_[id - 1] : 0;
    return std::string_view(bytes_).substr(b, end_[id] - b);
  }
  // The text tokens whose first byte is c, or (past_blank) whose first byte past their
  // leading whitespace is c (a token of whitespace only: its first byte).
  std::span<const int32_t> starting_with(unsigned char c, bool past_blank) const {
    const Index& x = index_[past_blank];
    return std::span<const int32_t>(x.ids).subspan(x.at[c], x.at[c + 1] - x.at[c]);
  }

private:
  struct Index {
    std::vector<int32_t> ids;  // grouped by the byte
    uint32_t at[257] = {};     // byte c's group: ids[at[c], at[c + 1])
  };
  std::string bytes_;          // every token's bytes, back to back
  std::vector<uint32_t> end_;  // token id's bytes end at end_[id] (start: end_[id - 1])
  std::vector<uint8_t> flags_, blank_len_, blank_breaks_;
  size_t max_len_ = 0;
  Index index_[2];
  void build_index(bool past_blank);
};

// One request's constrained reply: the recognizer over its text (JsonSchemaPrefix for JSON
// output, ToolCallPrefix for forced tool calls, ChoicePrefix for a choice, RegexPrefix for a
// regex) and its mask.
template <class Prefix>
class GrammarMode {
public:
  // grammar: what the reply must be (a JsonSchema, JsonSchema::any_object() for OpenAI's
  // JSON mode, or a ToolCallGrammar); is_eos [vocab]; eos_ends: an end-of-sequence token ends
  // the reply (else it is never allowed: it would land in the text). `vocab` and `grammar`
  // outlive the mode.
  template <class Grammar>
  GrammarMode(const JsonVocab& vocab, const Grammar& grammar, std::span<const uint8_t> is_eos, bool eos_ends)
      : vocab_(vocab), eos_ends_(eos_ends), state_(grammar), allowed_(vocab.size()) {
    for (size_t id = 0; id < is_eos.size(); ++id)
      if (is_eos[id]) eos_.push_back(int32_t(id));
  }
  // The tokens allowed at the next draw ([vocab], valid until the next call): those the
  // recognizer takes from here; an end-of-sequence token once the text is whole, and
  // nothing else once it is closed (spaces, when an end-of-sequence token would not end it).
  const uint8_t* allowed();
  void accept(int32_t id);  // an emitted token's bytes (not an end-of-sequence token's)
  bool closed() const { return state_.closed(); }  // the text is whole and nothing may follow

  // A run of whitespace in the reply (between tokens of the text, or spaces in a string)
  // holds at most kMaxBlank bytes and kMaxBreaks line feeds until the text is closed: room
  // for any indentation, none for a model to spin in. Every place that takes whitespace
  // also takes a byte that is not whitespace, so the limit closes no way out. (Raw text in
  // a tool call is not bounded: Prefix::bounded_blanks().)
  static constexpr size_t kMaxBlank = 32, kMaxBreaks = 2;

private:
  const JsonVocab& vocab_;
  std::vector<int32_t> eos_;
  bool eos_ends_;
  Prefix state_;
  std::vector<uint8_t> allowed_;
  size_t blank_ = 0, breaks_ = 0;  // the whitespace run the reply ends with
  bool limit_ = false;             // this mask bounds whitespace runs
  std::vector<std::unique_ptr<PatternVocab>> patterns_;  // each pattern's, once built
  // A mask that would feed more tokens than this builds the pattern's vocabulary (about
  // the cost of feeding 16k-64k tokens once, with the DeepSeek-V3.2 tokenizer).
  static constexpr size_t kPatternFanOut = 8192;
  // The tokens a pattern's vocabulary decides: in a regex reply every byte goes through the
  // automaton; in a JSON string a quote, a backslash or a control byte is the string's own,
  // and in a tool call so is a byte that could begin markup.
  static constexpr uint8_t kPatternTokens = std::is_same_v<Prefix, RegexPrefix> ? uint8_t(JsonVocab::kText)
                                            : uint8_t(JsonVocab::kText | JsonVocab::kStringSafe | (Prefix::kGuardsMarkup ? JsonVocab::kNoMarkup : 0));
  bool pattern_decides(size_t id) const { return (vocab_.flags(id) & kPatternTokens) == kPatternTokens; }
  bool is_eos(int32_t id) const;
  // The token's leading whitespace fits after the run (blank bytes, breaks line feeds) the
  // reply ends with; blank_ok: so, or this mask does not bound runs.
  static bool blank_fits(const JsonVocab& v, size_t id, size_t blank, size_t breaks);
  bool blank_ok(size_t id) const;
  void allow_unfed();
  const PatternVocab* allow_pattern();  // the pattern's vocabulary that decided tokens, if any
  void allow_fed(const PatternVocab* pattern);
  // At a pattern's character boundary, its automaton (s, count: the state); else null.
  const Regex* pattern_at(Regex::Set& s, uint32_t& count) const;
  size_t fan_out() const;
};

using JsonMode = GrammarMode<JsonSchemaPrefix>;
using ToolCallMode = GrammarMode<ToolCallPrefix>;
using ChoiceMode = GrammarMode<ChoicePrefix>;
using RegexMode = GrammarMode<RegexPrefix>;

}  // namespace dsa
