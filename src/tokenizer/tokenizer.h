#pragma once
// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json: added tokens matched
// literally (leftmost-longest), the normalizer (normalizer.h), the pre_tokenizer regexes
// (PCRE2), BPE merges by rank, and the ByteLevel decoder. Exact against the tokenizers crate
// on shared/tokenizer/golden.jsonl.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsa {

class Tokenizer {
public:
  // tokenizer.json, plus the optional tokenizer_config.json (BOS/EOS, add_bos_token).
  static Tokenizer from_dir(const std::string& dir);
  static Tokenizer from_file(const std::string& tokenizer_json, const std::string& config_json = "");
  static Tokenizer from_json(const nlohmann::json& tokenizer, const nlohmann::json& config = nullptr);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // text must be valid UTF-8 (throws dsa::Error otherwise). add_bos prepends bos_id();
  // the tokenizer.json post-processor is not applied (byte-level files add nothing).
  // "normalized": false added tokens are matched on the raw text, the rest of the text is
  // normalized piece by piece, then the other added tokens are matched, then pre-tokenized.
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false) const;
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;

  // ids -> text. Like the tokenizers crate: bytes of every token (added tokens included),
  // then invalid UTF-8 replaced by U+FFFD; the normalizer plays no part in decoding.
  // Throws dsa::Error on an unknown id.
  std::string decode(std::span<const int32_t> ids) const;
  // ids -> raw bytes, no UTF-8 repair.
  std::string decode_bytes(std::span<const int32_t> ids) const;
  // Bytes of one token (added tokens: their content). Throws on an unknown id.
  const std::string& token_bytes(int32_t id) const;

  // Exact lookup of an added token's content or a vocabulary entry's bytes.
  std::optional<int32_t> token_to_id(std::string_view text) const;
  bool is_valid_id(int32_t id) const;
  bool is_special(int32_t id) const;  // added token with "special": true
  int32_t vocab_size() const;         // highest id + 1
  int32_t bos_id() const;             // -1 if unknown
  int32_t eos_id() const;             // -1 if unknown
  bool default_add_bos() const;       // tokenizer_config.json add_bos_token (false if absent)

  struct Impl;

private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming: push(id) returns the text that is now complete,
// holding back a trailing partial UTF-8 character. Bytes that can never form a character
// become U+FFFD, so the concatenated output is always valid UTF-8.
class StreamDecoder {
public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(&tok) {}
  std::string push(int32_t id);
  // End of stream: an incomplete tail becomes U+FFFD.
  std::string flush();
  void reset() { pending_.clear(); }

private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace dsa
