#pragma once
// Pre-tokenization of Hugging Face tokenizer.json files: the `pre_tokenizer` tree (Split,
// ByteLevel, Digits, Whitespace, WhitespaceSplit, Sequence) evaluated with PCRE2.
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsa::tok {

// One compiled PCRE2 pattern (UTF + UCP, or UTF + LITERAL; JIT when available), used by the
// pre-tokenizer's splits and the Replace normalizer.
class Regex {
public:
  // literal: match `pattern` as a plain string (Split with {"String": ...}).
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends [start, end) of every match in s, left to right. Empty matches follow Rust's
  // onig FindMatches (what the reference uses): one right after the previous match is skipped.
  // s must be valid UTF-8 (not re-checked).
  void find_all(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& out) const;

private:
  void* code_ = nullptr;  // pcre2_code_8*
};

// Translates the Oniguruma-flavoured patterns of tokenizer.json to PCRE2 where they differ.
std::string onig_to_pcre2(std::string_view pattern);

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
public:
  // j: the "pre_tokenizer" value (may be null); `path` names it in error messages. Throws
  // dsa::Error naming the field on an unsupported type or a malformed step.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& path = "pre_tokenizer");

  // True if a ByteLevel step was present (the model then works on raw bytes).
  bool has_byte_level() const { return byte_level_; }

  // Splits text into pieces (views into text or into strings owned by arena).
  void split(std::string_view text, std::vector<std::string_view>& out,
             std::deque<std::string>& arena) const;

private:
  struct Step {
    std::shared_ptr<Regex> re;  // null for a prefix-space-only ByteLevel step
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    bool add_prefix_space = false;
  };
  void add(const nlohmann::json& j, const std::string& path);
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace dsa::tok
