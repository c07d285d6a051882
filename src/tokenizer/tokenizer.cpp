#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <deque>
#include <filesystem>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/mmap_file.h"
#include "io/json.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace dsa {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order. Returns the inverse map, code point -> byte (-1: not a byte char).
std::array<int16_t, 324> unicode_to_byte() {
  std::array<int16_t, 324> m;
  m.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (printable) m[static_cast<size_t>(b)] = static_cast<int16_t>(b);
    else m[static_cast<size_t>(256 + extra++)] = static_cast<int16_t>(b);
  }
  return m;
}

// Byte-level token string -> raw bytes; nullopt if a character is outside the byte alphabet.
std::optional<std::string> byte_level_to_bytes(std::string_view s) {
  static const auto map = unicode_to_byte();
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const uint32_t cp = utf8::next_cp(s, i);
    if (cp >= map.size() || map[cp] < 0) return std::nullopt;
    out += static_cast<char>(map[cp]);
  }
  return out;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool lstrip, rstrip, single_word;
};

// Byte trie over added-token contents for leftmost-longest literal matching (the
// aho-corasick MatchKind::LeftmostLongest of tokenizers' AddedVocabulary).
class Trie {
public:
  void insert(std::string_view s, int32_t token) {
    if (s.empty()) return;
    if (nodes_.empty()) nodes_.emplace_back();
    first_[static_cast<unsigned char>(s[0])] = true;
    int32_t n = 0;
    for (char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      int32_t child = -1;
      for (const auto& [b, k] : nodes_[static_cast<size_t>(n)].next)
        if (b == c) { child = k; break; }
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(n)].next.emplace_back(c, child);
        nodes_.emplace_back();
      }
      n = child;
    }
    if (nodes_[static_cast<size_t>(n)].token < 0) nodes_[static_cast<size_t>(n)].token = token;
  }
  bool empty() const { return nodes_.empty(); }
  // Longest token starting exactly at s[i]: (length, token index) or length 0.
  std::pair<size_t, int32_t> longest_at(std::string_view s, size_t i) const {
    std::pair<size_t, int32_t> best{0, -1};
    if (!first_[static_cast<unsigned char>(s[i])]) return best;
    int32_t n = 0;
    for (size_t k = i; k < s.size(); ++k) {
      const auto c = static_cast<unsigned char>(s[k]);
      int32_t child = -1;
      for (const auto& [b, x] : nodes_[static_cast<size_t>(n)].next)
        if (b == c) { child = x; break; }
      if (child < 0) break;
      n = child;
      if (nodes_[static_cast<size_t>(n)].token >= 0) best = {k + 1 - i, nodes_[static_cast<size_t>(n)].token};
    }
    return best;
  }

private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t token = -1;
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

// Open-addressing hash map (left id, right id) -> (rank, merged id). BPE spends most of its
// time on these lookups; a flat table with a multiplicative hash is several times faster
// than std::unordered_map's node chasing.
class MergeTable {
public:
  struct Value { int32_t rank, id; };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Value{0, 0});
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(cap));
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Keeps the first insertion of a key (the lowest rank), as the reference does.
  void insert(uint64_t k, Value v) {
    for (size_t i = slot(k);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == k) return;
      if (keys_[i] == kEmpty) { keys_[i] = k; vals_[i] = v; return; }
    }
  }
  const Value* find(uint64_t k) const {
    for (size_t i = slot(k);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are non-negative, so never a real key
  size_t slot(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ULL) >> shift_); }
  std::vector<uint64_t> keys_{kEmpty};
  std::vector<Value> vals_{Value{0, 0}};
  unsigned shift_ = 64;
};

struct Segment {
  std::string_view text;  // valid when id < 0
  int32_t id = -1;
};

// Vocabularies are ~130K; anything near this bound is a corrupt file, not a tokenizer.
constexpr int64_t kMaxTokenId = int64_t(1) << 24;
constexpr size_t kMaxUnusedIds = size_t(1) << 16;

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path, "tokenizer file");
  try {
    return parse_json_bounded(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error("cannot parse " + path + ": " + e.what());
  }
}

// tokenizer_config.json writes special tokens either as a string or as an AddedToken object.
std::string config_token(const nlohmann::json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

struct Tokenizer::Impl {
  tok::Normalizer norm;
  tok::PreTokenizer pre;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> bytes_to_id;  // vocab
  std::array<int32_t, 256> byte_id{};                                                   // single-byte tokens
  MergeTable merges;  // (left, right) -> (rank, merged)
  std::vector<std::string> token_bytes;
  std::vector<uint8_t> valid, special;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_by_content;
  // "normalized": false tokens, matched on the raw text; the others, stored in their
  // normalized form and matched on the normalized pieces (tokenizers' split_trie and
  // split_normalized_trie).
  Trie trie_raw, trie_norm;
  int32_t unk_id = -1;
  bool ignore_merges = false;
  int32_t bos = -1, eos = -1;
  bool add_bos_default = false;

  // Word cache: pre-token bytes -> ids. BPE of a word is pure, so sharing it is safe.
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;
  static constexpr size_t kCacheMax = 1 << 17;
  static constexpr size_t kCacheWordMin = 12;
  static constexpr size_t kCacheWordMax = 128;

  // Construction from tokenizer.json and tokenizer_config.json, in this order.
  std::unordered_map<std::string_view, int32_t> read_vocab(const nlohmann::json& j, const nlohmann::json& model);
  void read_merges(const nlohmann::json& model, const std::unordered_map<std::string_view, int32_t>& str_to_id);
  void read_added_tokens(const nlohmann::json& j);
  void read_config(const nlohmann::json& cfg);

  void split_added(std::string_view text, std::vector<Segment>& out, std::deque<std::string>& arena) const;
  void split_with(const Trie& trie, std::string_view text, std::vector<Segment>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  void bpe_uncached(std::string_view word, std::vector<int32_t>& out) const;
  void bpe_small(std::string_view word, std::vector<int32_t>& out) const;
  static constexpr size_t kSmallWord = 24;
};

void Tokenizer::Impl::split_with(const Trie& trie, std::string_view text, std::vector<Segment>& out) const {
  if (trie.empty()) {
    out.push_back({text, -1});
    return;
  }
  size_t seg_start = 0, i = 0;
  while (i < text.size()) {
    auto [len, t] = trie.longest_at(text, i);
    if (len == 0) { ++i; continue; }
    const AddedToken& at = added[static_cast<size_t>(t)];
    size_t s = i, e = i + len;
    if (at.single_word) {
      // Approximation of tokenizers' word-boundary test: ASCII alphanumerics only.
      auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
      if ((s > 0 && word(text[s - 1])) || (e < text.size() && word(text[e]))) { ++i; continue; }
    }
    if (at.lstrip) {
      while (s > seg_start) {
        size_t p = s - 1;
        while (p > seg_start && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!utf8::is_white_space(utf8::next_cp(text, q))) break;
        s = p;
      }
    }
    if (at.rstrip) {
      while (e < text.size()) {
        size_t q = e;
        if (!utf8::is_white_space(utf8::next_cp(text, q))) break;
        e = q;
      }
    }
    if (s > seg_start) out.push_back({text.substr(seg_start, s - seg_start), -1});
    out.push_back({{}, at.id});
    seg_start = i = e;
  }
  if (seg_start < text.size()) out.push_back({text.substr(seg_start), -1});
}

// tokenizers' AddedVocabulary::extract_and_normalize: raw-matched tokens are split out of
// the original text first; each remaining piece is normalized on its own (so Prepend or
// Strip apply per piece), then searched for the normalized tokens. Normalized pieces live
// in `arena`.
void Tokenizer::Impl::split_added(std::string_view text, std::vector<Segment>& out,
                                  std::deque<std::string>& arena) const {
  std::vector<Segment> first;
  split_with(trie_raw, text, first);
  for (const Segment& s : first) {
    if (s.id >= 0) {
      out.push_back(s);
    } else if (norm.is_identity()) {
      split_with(trie_norm, s.text, out);
    } else {
      std::string& n = arena.emplace_back();
      norm.apply(s.text, n);
      split_with(trie_norm, n, out);
    }
  }
}

void Tokenizer::Impl::bpe_uncached(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    auto it = bytes_to_id.find(word);
    if (it != bytes_to_id.end()) { out.push_back(it->second); return; }
  }
  if (word.size() <= kSmallWord) {
    bpe_small(word, out);
    return;
  }
  // Symbols in a doubly linked list; a min-heap of candidate merges ordered by (rank,
  // position), as tokenizers' Word::merge_all does. Stale heap entries are skipped.
  struct Sym { int32_t id, prev, next, len; };
  std::vector<Sym> sym;
  sym.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const int32_t id = byte_id[static_cast<unsigned char>(word[i])];
    if (id < 0) {
      if (unk_id >= 0) out.push_back(unk_id);  // no unk_token: the byte is dropped, as upstream
      continue;
    }
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, n + 1, 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Cand { int32_t rank, pos, new_id; };
  auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto push_pair = [&](int32_t pos) {
    const int32_t nx = sym[static_cast<size_t>(pos)].next;
    if (nx < 0) return;
    const MergeTable::Value* v = merges.find(MergeTable::key(sym[static_cast<size_t>(pos)].id, sym[static_cast<size_t>(nx)].id));
    if (v) heap.push({v->rank, pos, v->id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& a = sym[static_cast<size_t>(c.pos)];
    if (a.len == 0 || a.next < 0) continue;
    Sym& b = sym[static_cast<size_t>(a.next)];
    const MergeTable::Value* v = merges.find(MergeTable::key(a.id, b.id));
    if (!v || v->id != c.new_id) continue;  // pair changed since push
    a.id = c.new_id;
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (a.next >= 0) sym[static_cast<size_t>(a.next)].prev = c.pos;
    if (a.prev >= 0) push_pair(a.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0 && i < static_cast<int32_t>(sym.size()); i = sym[static_cast<size_t>(i)].next)
    out.push_back(sym[static_cast<size_t>(i)].id);
}

void Tokenizer::Impl::bpe_small(std::string_view word, std::vector<int32_t>& out) const {
  // Short words: rescan all adjacent pairs and merge the lowest (rank, position) each round.
  // That is the same order the heap below produces, without allocating.
  int32_t ids[kSmallWord];
  int32_t n = 0;
  for (char ch : word) {
    const int32_t id = byte_id[static_cast<unsigned char>(ch)];
    if (id >= 0) ids[n++] = id;
    else if (unk_id >= 0) out.push_back(unk_id);
  }
  for (;;) {
    int32_t best_rank = INT32_MAX, best_pos = -1, best_id = -1;
    for (int32_t i = 0; i + 1 < n; ++i) {
      const MergeTable::Value* v = merges.find(MergeTable::key(ids[i], ids[i + 1]));
      if (v && v->rank < best_rank) {
        best_rank = v->rank;
        best_pos = i;
        best_id = v->id;
      }
    }
    if (best_pos < 0) break;
    ids[best_pos] = best_id;
    for (int32_t i = best_pos + 1; i + 1 < n; ++i) ids[i] = ids[i + 1];
    --n;
  }
  out.insert(out.end(), ids, ids + n);
}

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1 && byte_id[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(byte_id[static_cast<unsigned char>(word[0])]);
    return;
  }
  // Short words are cheaper to merge again than to look up (hashing, a cache miss into a
  // large table, an allocation on insert), so only longer ones go through the cache.
  const bool cacheable = word.size() > kCacheWordMin && word.size() <= kCacheWordMax;
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out.size();
  bpe_uncached(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu);
    if (cache.size() >= kCacheMax) cache.clear();
    cache.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  const std::filesystem::path d(dir);
  if (!std::filesystem::exists(d / "tokenizer.json"))
    throw Error("no tokenizer.json in '" + dir + "'");
  const auto cfg = d / "tokenizer_config.json";
  return from_file((d / "tokenizer.json").string(), std::filesystem::exists(cfg) ? cfg.string() : "");
}

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json, const std::string& config_json) {
  const nlohmann::json tok = read_json_file(tokenizer_json);
  const nlohmann::json cfg = config_json.empty() ? nlohmann::json(nullptr) : read_json_file(config_json);
  try {
    return from_json(tok, cfg);
  } catch (const Error& e) {
    throw Error(tokenizer_json + ": " + e.what());
  }
}

namespace {

// Every id indexes the tokenizer's tables: read it as 64 bits and bound it (get<int32_t>
// would wrap 2^32 to 0, and a negative added-token id wrote before the tables).
int32_t token_id(const nlohmann::json& v, const std::string& what) {
  if (!v.is_number_integer()) throw Error(what + ": id is not an integer: " + v.dump());
  if (!json_int_in(v, 0, kMaxTokenId - 1)) throw Error(what + ": id " + v.dump() + " is outside [0, " + std::to_string(kMaxTokenId) + ")");
  return int32_t(v.get<int64_t>());
}

// The number of ids the tables hold: the highest id of model.vocab and added_tokens, plus one.
// The tables are sized by it: one id of 9118250 in a 2 KB file asked for 290 MB. Gaps are
// allowed, up to kMaxUnusedIds unused ids in all.
size_t id_count(const nlohmann::json& j, const nlohmann::json& vocab) {
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) max_id = std::max(max_id, token_id(it.value(), "model.vocab '" + it.key() + "'"));
  if (j.contains("added_tokens"))
    for (const auto& a : j["added_tokens"]) max_id = std::max(max_id, token_id(a.at("id"), "added_tokens"));
  const size_t entries = vocab.size() + (j.contains("added_tokens") ? j["added_tokens"].size() : 0);
  if (size_t(max_id) + 1 > entries + kMaxUnusedIds)
    throw Error("id " + std::to_string(max_id) + " is far beyond the " + std::to_string(entries) +
                " entries of model.vocab and added_tokens (at most " + std::to_string(kMaxUnusedIds) + " unused ids)");
  return static_cast<size_t>(max_id + 1);
}

// One merge rule as its two token strings: "a b" (older files) or ["a", "b"] (tokenizers >= 0.20).
std::pair<std::string, std::string> merge_pair(const nlohmann::json& mg, int32_t rank) {
  if (mg.is_array() && mg.size() == 2) return {mg[0].get<std::string>(), mg[1].get<std::string>()};
  if (!mg.is_string()) throw Error("merge #" + std::to_string(rank) + " is neither 'a b' nor [a, b]");
  const auto& s = mg.get_ref<const std::string&>();
  const size_t sp = s.find(' ');
  if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) throw Error("merge '" + s + "' is not of the form 'a b'");
  return {s.substr(0, sp), s.substr(sp + 1)};
}

}  // namespace

// model.vocab into the id tables; returns each token string's id (views into the json, for the merges).
std::unordered_map<std::string_view, int32_t> Tokenizer::Impl::read_vocab(const nlohmann::json& j, const nlohmann::json& model) {
  const auto& vocab = model.at("vocab");
  const size_t n = id_count(j, vocab);
  token_bytes.assign(n, std::string());
  valid.assign(n, 0);
  special.assign(n, 0);
  byte_id.fill(-1);
  std::unordered_map<std::string_view, int32_t> str_to_id;
  str_to_id.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    str_to_id.emplace(it.key(), id);
    valid[static_cast<size_t>(id)] = 1;
    if (auto b = byte_level_to_bytes(it.key())) {
      if (b->size() == 1) byte_id[static_cast<unsigned char>((*b)[0])] = id;
      bytes_to_id.emplace(*b, id);
      token_bytes[static_cast<size_t>(id)] = std::move(*b);
    } else {
      // Not in the byte alphabet (e.g. a special token string also listed in the vocab):
      // the ByteLevel decoder passes such a token through as its UTF-8 text.
      token_bytes[static_cast<size_t>(id)] = it.key();
    }
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = str_to_id.find(model["unk_token"].get_ref<const std::string&>());
    if (it != str_to_id.end()) unk_id = it->second;
  }
  return str_to_id;
}

void Tokenizer::Impl::read_merges(const nlohmann::json& model, const std::unordered_map<std::string_view, int32_t>& str_to_id) {
  const auto& list = model.at("merges");
  merges.reserve(list.size());
  int32_t rank = 0;
  for (const auto& mg : list) {
    const auto [a, b] = merge_pair(mg, rank);
    auto ia = str_to_id.find(a), ib = str_to_id.find(b), ij = str_to_id.find(a + b);
    if (ia == str_to_id.end() || ib == str_to_id.end() || ij == str_to_id.end())
      throw Error("merge '" + a + " " + b + "' uses a token that is not in the vocabulary");
    merges.insert(MergeTable::key(ia->second, ib->second), {rank, ij->second});
    ++rank;
  }
}

// Added tokens. They decode through the ByteLevel decoder like any token: if every
// character is in the byte alphabet they map back to bytes, otherwise to their UTF-8 text.
void Tokenizer::Impl::read_added_tokens(const nlohmann::json& j) {
  if (!j.contains("added_tokens")) return;
  for (const auto& a : j["added_tokens"]) {
    AddedToken at;
    at.content = a.at("content").get<std::string>();
    at.id = a.at("id").get<int32_t>();
    at.lstrip = a.value("lstrip", false);
    at.rstrip = a.value("rstrip", false);
    at.single_word = a.value("single_word", false);
    const auto idx = static_cast<int32_t>(added.size());
    const auto id = static_cast<size_t>(at.id);
    valid[id] = 1;
    special[id] = a.value("special", false) ? 1 : 0;
    auto b = byte_level_to_bytes(at.content);
    token_bytes[id] = b ? *b : at.content;
    added_by_content.emplace(at.content, at.id);
    // tokenizers matches a normalized token by its content passed through the normalizer.
    if (a.value("normalized", true)) trie_norm.insert(norm.apply(at.content), idx);
    else trie_raw.insert(at.content, idx);
    added.push_back(std::move(at));
  }
}

// tokenizer_config.json: BOS/EOS strings and the add_bos_token default.
void Tokenizer::Impl::read_config(const nlohmann::json& cfg) {
  for (auto [key, dst] : {std::pair{"bos_token", &bos}, std::pair{"eos_token", &eos}}) {
    const std::string s = config_token(cfg, key);
    if (s.empty()) continue;
    auto it = added_by_content.find(s);
    if (it != added_by_content.end()) *dst = it->second;
  }
  if (cfg.is_object() && cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
    add_bos_default = cfg["add_bos_token"].get<bool>();
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j, const nlohmann::json& cfg) {
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  try {
    const auto& model = j.at("model");
    if (model.value("type", "BPE") != "BPE")
      throw Error("model.type is '" + model.value("type", "") + "', only BPE is supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
        throw Error(std::string("model.") + k + " is not supported");
    m.ignore_merges = model.value("ignore_merges", false);
    m.norm = tok::Normalizer::from_json(j.contains("normalizer") ? j["normalizer"] : nlohmann::json(nullptr));
    m.pre = tok::PreTokenizer::from_json(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json(nullptr));
    if (!m.pre.has_byte_level()) throw Error("not a byte-level BPE tokenizer (no ByteLevel pre-tokenizer)");
    // Vocabulary: token strings are in the byte-level alphabet; keep them as raw bytes.
    const auto str_to_id = m.read_vocab(j, model);
    m.read_merges(model, str_to_id);
    m.read_added_tokens(j);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("malformed tokenizer.json: ") + e.what());
  }
  m.read_config(cfg);
  return Tokenizer(std::move(impl));
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  if (!utf8::valid(text)) throw Error("tokenizer input is not valid UTF-8");
  const Impl& m = *impl_;
  std::vector<Segment> segs;
  std::vector<std::string_view> pieces;
  std::deque<std::string> arena;
  m.split_added(text, segs, arena);
  for (const Segment& s : segs) {
    if (s.id >= 0) { out.push_back(s.id); continue; }
    m.pre.split(s.text, pieces, arena);
    for (std::string_view p : pieces) m.bpe(p, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_bos) {
    if (impl_->bos < 0) throw Error("add_bos requested but the tokenizer has no known BOS token");
    out.push_back(impl_->bos);
  }
  encode_append(text, out);
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (!is_valid_id(id)) throw Error("unknown token id " + std::to_string(id));
  return impl_->token_bytes[static_cast<size_t>(id)];
}

std::string Tokenizer::decode_bytes(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const { return utf8::sanitize(decode_bytes(ids)); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view text) const {
  if (auto it = impl_->added_by_content.find(text); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->bytes_to_id.find(text); it != impl_->bytes_to_id.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_valid_id(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->valid.size() && impl_->valid[static_cast<size_t>(id)];
}
bool Tokenizer::is_special(int32_t id) const { return is_valid_id(id) && impl_->special[static_cast<size_t>(id)]; }
int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->valid.size()); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::default_add_bos() const { return impl_->add_bos_default; }

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const utf8::SeqInfo q = utf8::scan(pending_, i);
    if (q.status == utf8::Seq::Truncated) break;  // may still complete with the next token
    if (q.status == utf8::Seq::Ok) out.append(pending_, i, q.len);
    else out += "\xEF\xBF\xBD";
    i += q.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsa
