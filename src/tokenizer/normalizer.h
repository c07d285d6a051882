#pragma once
// The `normalizer` of Hugging Face tokenizer.json files, with the tokenizers crate's semantics:
// NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Replace, Prepend, Strip and Sequence. The
// WordPiece/SentencePiece normalizers (BertNormalizer, StripAccents, Precompiled, Nmt) and the
// ByteLevel normalizer are refused at load.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::tok {

class Regex;

enum class UnicodeForm { NFC, NFD, NFKC, NFKD };

// Unicode normalization of valid UTF-8 `s` into `out` (its previous contents are replaced).
void unicode_normalize(std::string_view s, UnicodeForm form, std::string& out);

// Rust char::to_lowercase applied to every character of valid UTF-8 `s`, into `out`.
void lowercase(std::string_view s, std::string& out);

class Normalizer {
public:
  // j: the "normalizer" value (null means none). `path` names j in error messages, which
  // say which field holds what and what is supported. Throws dsa::Error.
  static Normalizer from_json(const nlohmann::json& j, const std::string& path = "normalizer");

  bool is_identity() const { return steps_.empty(); }

  // Normalizes valid UTF-8 `text` into `out` (replaced); the result is valid UTF-8.
  void apply(std::string_view text, std::string& out) const;
  std::string apply(std::string_view text) const;

private:
  enum class Kind { Unicode, Lowercase, Replace, Prepend, Strip };
  struct Step {
    Kind kind;
    UnicodeForm form = UnicodeForm::NFC;
    std::shared_ptr<const Regex> pattern;  // Replace
    std::string content;                   // Replace: the replacement; Prepend: the prefix
    bool strip_left = false, strip_right = false;
  };
  void add(const nlohmann::json& j, const std::string& path);
  static void run(const Step& st, std::string_view in, std::string& out);
  std::vector<Step> steps_;  // a Sequence is flattened: its members run in order anyway
};

}  // namespace dsa::tok
