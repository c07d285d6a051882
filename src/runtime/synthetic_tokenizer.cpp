#include "runtime/synthetic_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "core/error.h"

namespace dsa {

namespace {

// Training text for the merges: plain English, so common words become single tokens.
constexpr const char* kCorpus =
    "The quick brown fox jumps over the lazy dog. A language model reads text as a sequence of tokens and "
    "predicts the next one. This engine runs models with sparse attention: for every query, a lightning "
    "indexer scores all earlier keys and keeps only the best ones, so that long contexts stay fast. "
    "Hello, how are you today? I am fine, thank you. What is the weather like where you are? "
    "It is sunny and warm here, but they say it will rain in the evening. "
    "Once upon a time there was a little girl who lived in a village near the forest. Whenever she went "
    "out, she wore a red riding cloak, so everyone in the village called her Little Red Riding Hood. "
    "One morning her mother said to her: take this basket of bread and butter to your grandmother, "
    "who is ill, and do not leave the path. The girl promised that she would be careful, and she set off. "
    "In the beginning the universe was created. This has made a lot of people very angry and been widely "
    "regarded as a bad move. Numbers such as 1, 2, 3, 10, 42, 100 and 2024 appear in text as well. "
    "We should answer the question, think step by step, and then write the final answer clearly. "
    "Because the weights of this model are random, the text it writes is noise; it exists to try the engine. "
    "People often ask which of these things matter most: time, money, health, friends, work or home. "
    "There are many different kinds of information that can be found in the world, and there is "
    "nothing better than learning something new every day from good books, teachers and each other. "
    "Mathematics, physics, chemistry, biology, history, geography, literature, philosophy, economics, "
    "engineering and medicine are subjects taught at universities around the country. Students write "
    "programs, compile software, debug errors, measure performance, compare results, publish papers, "
    "review documents, organize meetings, schedule interviews, travel abroad and discover beautiful "
    "mountains, rivers, oceans, islands, deserts, cities, villages, gardens, castles and museums. "
    "Yesterday afternoon my neighbour painted his kitchen yellow, repaired the broken window, cooked "
    "delicious vegetable soup with potatoes, carrots, onions, tomatoes, garlic and pepper, then played "
    "guitar, piano and violin until midnight. Children laughed, dogs barked, birds whistled, engines "
    "roared, trains arrived, passengers hurried, markets opened, shops closed, prices increased quickly. "
    "Important questions remain: whether computers understand language, why experiments sometimes "
    "fail, how memory, attention, probability, statistics, algorithms and hardware interact together.";

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
std::vector<std::string> byte_alphabet() {
  std::vector<std::string> out(256);
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) s += char(cp);
    else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
    return s;
  };
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    out[size_t(b)] = utf8(printable ? b : 256 + n++);
  }
  return out;
}

// Words as the GPT-2 pre-tokenizer roughly cuts them: an optional leading space followed
// by a run of letters, digits or other characters. Merges only need to be consistent
// with the vocabulary, so an approximation of the regex is enough for training.
std::vector<std::string> words(const std::string& text) {
  auto cls = [](unsigned char c) { return std::isalpha(c) ? 0 : std::isdigit(c) ? 1 : std::isspace(c) ? 2 : 3; };
  std::vector<std::string> w;
  size_t i = 0;
  while (i < text.size()) {
    std::string cur;
    if (text[i] == ' ' && i + 1 < text.size() && cls((unsigned char)text[i + 1]) != 2) cur += text[i++];
    const int k = cls((unsigned char)text[i]);
    while (i < text.size() && cls((unsigned char)text[i]) == k) cur += text[i++];
    w.push_back(cur);
  }
  return w;
}

const std::vector<std::pair<std::string, bool>>& special_tokens() {  // content, special
  static const std::vector<std::pair<std::string, bool>> s = {
      {"<｜begin▁of▁sentence｜>", true}, {"<｜end▁of▁sentence｜>", true}, {"<｜▁pad▁｜>", true},
      {"<｜User｜>", false},  {"<｜Assistant｜>", false}, {"<think>", false}, {"</think>", false},
      {"[gMASK]", true},     {"<sop>", true},          {"<|system|>", true}, {"<|user|>", true},
      {"<|assistant|>", true}, {"<|observation|>", true}, {"<|endoftext|>", true}};
  return s;
}

nlohmann::ordered_json added_token(int id, const std::string& content, bool special) {
  return {{"id", id},         {"content", content},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false},  {"normalized", false},    {"special", special}};
}

// BPE training on the built-in text: words as sequences of byte-alphabet symbols, weighted by
// frequency; repeatedly the most frequent adjacent pair (first in sorted order on ties)
// merges, until the vocabulary holds vocab_size ids or no pair is left. Adds the merged
// tokens to vocab (ids from next on) and returns the merges in rank order.
nlohmann::ordered_json train_merges(nlohmann::ordered_json& vocab, int& next, int vocab_size, const std::vector<std::string>& alpha) {
  std::map<std::string, int> freq;
  for (const auto& w : words(kCorpus)) ++freq[w];
  std::vector<std::pair<std::vector<std::string>, int>> seqs;
  for (const auto& [w, f] : freq) {
    std::vector<std::string> s;
    for (unsigned char c : w) s.push_back(alpha[c]);
    seqs.emplace_back(std::move(s), f);
  }
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  while (next < vocab_size) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& [s, f] : seqs)
      for (size_t i = 0; i + 1 < s.size(); ++i) pairs[{s[i], s[i + 1]}] += f;
    if (pairs.empty()) break;
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second > best->second) best = it;
    const auto [a, b] = best->first;
    const std::string ab = a + b;
    merges.push_back(a + " " + b);
    if (!vocab.contains(ab)) vocab[ab] = next++;
    for (auto& [s, f] : seqs) {
      std::vector<std::string> t;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          t.push_back(ab);
          ++i;
        } else {
          t.push_back(s[i]);
        }
      }
      s = std::move(t);
    }
  }
  return merges;
}

void write_json(const std::string& path, const nlohmann::ordered_json& j) {
  std::ofstream f(path, std::ios::binary);
  f << j.dump(2) << "\n";
  if (!f) throw Error("cannot write " + path);
}

}  // namespace

void write_synthetic_tokenizer(const std::string& dir, int vocab_size) {
  const auto& specials = special_tokens();
  const int n_special = int(specials.size());
  if (vocab_size < n_special + 256)
    throw Error("synthetic tokenizer: vocab_size " + std::to_string(vocab_size) + " is below the " +
                std::to_string(n_special + 256) + " special and byte tokens");
  const auto alpha = byte_alphabet();
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (int i = 0; i < n_special; ++i) added.push_back(added_token(i, specials[size_t(i)].first, specials[size_t(i)].second));
  int next = n_special;
  for (int b = 0; b < 256; ++b) vocab[alpha[size_t(b)]] = next++;
  const nlohmann::ordered_json merges = train_merges(vocab, next, vocab_size, alpha);
  // The text ran out of pairs: fill the rest with reserved special tokens (as the real
  // checkpoints do) so that every id the model can produce decodes.
  for (int r = 0; next < vocab_size; ++r, ++next) added.push_back(added_token(next, "<｜reserved_" + std::to_string(r) + "｜>", true));

  const nlohmann::ordered_json tok = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merges}}}};
  const nlohmann::ordered_json cfg = {{"add_bos_token", true},
                                      {"add_eos_token", false},
                                      {"bos_token", specials[0].first},
                                      {"eos_token", specials[1].first},
                                      {"pad_token", specials[2].first},
                                      {"model_max_length", 131072},
                                      {"tokenizer_class", "PreTrainedTokenizerFast"}};
  std::filesystem::create_directories(dir);
  write_json(dir + "/tokenizer.json", tok);
  write_json(dir + "/tokenizer_config.json", cfg);
}

}  // namespace dsa
