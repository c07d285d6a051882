// dsa_fuzz_seeds: turns the shared fixtures (and the project's own presets) into seed inputs
// for the fuzz targets, at run time, so no copy of shared data lives in the repository.
// fuzz/seeds.sh calls it; each command writes numbered files into OUTDIR.
//
//   safetensors FILE TAG OUTDIR IDXDIR  header-only image and a small valid image with the
//                                     first tensor names and dtypes into OUTDIR, an index
//                                     listing those names into IDXDIR
//   jsonl-field FILE FIELD OUTDIR     each line's string FIELD, raw (tokenizer texts)
//   jsonl-keys FILE KEYS OUTDIR       each line cut down to the comma-separated KEYS
//   completions FILE OUTDIR           chat_examples.jsonl: every assistant turn encoded as the
//                                     model would emit it, in fuzz_dsv32_parser's layout
//   tokenizers OUTDIR                 small hand-made tokenizer.json files + NUL + a text
//   configs OUTDIR                    config.json of every make-model preset
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/mmap_file.h"
#include "io/safetensors.h"
#include "model/make_model.h"
#include "tokenizer/dsv32_encoding.h"
#include "tokenizer/utf8.h"

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

int g_count = 0;

void write_file(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw dsa::Error("cannot write " + dir + "/" + name);
  ++g_count;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::istringstream in(dsa::read_text_file(path, "seed source"));
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

std::string stem(const std::string& path) {
  std::string s = path.substr(path.find_last_of('/') + 1);
  return s.substr(0, s.find('.'));
}

// The file's header with no data region, a valid image of the first tensors at tiny shapes,
// and an index spreading their names over two shards.
void safetensors(const std::string& path, const std::string& tag, const std::string& out, const std::string& idx_out) {
  dsa::MmapFile f(path);
  if (f.size() < 8) throw dsa::Error(path + ": too small");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  if (n > f.size() - 8) throw dsa::Error(path + ": bad header length");
  write_file(out, tag + "-header", std::string(reinterpret_cast<const char*>(f.data()), size_t(8 + n)));

  const auto tensors = dsa::parse_safetensors(f.data(), f.size(), path);
  std::vector<dsa::TensorBlob> small;
  json weight_map = json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (small.size() >= 12) continue;  // small seeds fuzz faster; a dozen names show the shape
    weight_map[t.name] = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    dsa::TensorBlob b{t.name, t.dtype, {}, {}};
    size_t bytes = dsa::dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      b.shape.push_back(std::min<int64_t>(d, 2));
      bytes *= size_t(b.shape.back());
    }
    b.bytes.assign(bytes, uint8_t(i));
    small.push_back(std::move(b));
  }
  const std::string tmp = out + "/" + tag + "-small";
  dsa::write_safetensors(tmp, small, {{"format", "pt"}});
  ++g_count;
  write_file(idx_out, tag + "-index", json{{"metadata", {{"total_size", f.size()}}}, {"weight_map", weight_map}}.dump(2));
}

void jsonl_field(const std::string& path, const std::string& field, const std::string& out) {
  int i = 0;
  for (const auto& l : lines_of(path)) {
    const json j = json::parse(l);
    if (j.contains(field) && j[field].is_string()) write_file(out, stem(path) + "-" + std::to_string(i++), j[field].get<std::string>());
  }
}

void jsonl_keys(const std::string& path, const std::string& keys, const std::string& out) {
  std::vector<std::string> ks;
  std::istringstream in(keys);
  for (std::string k; std::getline(in, k, ',');) ks.push_back(k);
  int i = 0;
  for (const auto& l : lines_of(path)) {
    const ojson j = ojson::parse(l);
    ojson o = ojson::object();
    for (const auto& k : ks)
      if (j.contains(k)) o[k] = j[k];
    write_file(out, stem(path) + "-" + std::to_string(i++), o.dump());
  }
}

// fuzz_dsv32_parser's layout: flags (bit 0 thinking), count of chunk sizes, the sizes, text.
std::string parser_input(bool thinking, const std::string& sizes, const std::string& text) {
  return std::string(1, char(thinking ? 1 : 0)) + char(sizes.size()) + sizes + text;
}

void completions(const std::string& path, const std::string& out) {
  namespace dsv32 = dsa::chat::dsv32;
  int i = 0;
  for (const auto& l : lines_of(path)) {
    const ojson j = ojson::parse(l);
    dsv32::EncodeOptions o;
    o.thinking_mode = dsa::chat::parse_thinking_mode(j["encode_args"]["thinking_mode"].get<std::string>());
    const auto& msgs = j["messages"];
    for (size_t k = 0; k < msgs.size(); ++k) {
      if (msgs[k]["role"] != "assistant") continue;
      ojson ctx = ojson::array();
      for (size_t c = 0; c < k; ++c) ctx.push_back(msgs[c]);
      const std::string text = dsv32::encode_messages(ojson::array({msgs[k]}), o, ctx);
      const bool thinking = o.thinking_mode == dsa::chat::ThinkingMode::Thinking;
      // Whole, byte by byte, and in 7-byte chunks.
      write_file(out, "completion-" + std::to_string(i++), parser_input(thinking, "", text));
      write_file(out, "completion-" + std::to_string(i++), parser_input(thinking, std::string(1, '\1'), text));
      write_file(out, "completion-" + std::to_string(i++), parser_input(thinking, std::string(1, '\7'), text));
    }
  }
}

// GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the others for
// U+0100 onwards in byte order.
std::string byte_char(int b) {
  int extra = 0;
  for (int x = 0; x < b; ++x)
    if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++extra;
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  std::string s;
  dsa::utf8::append_cp(s, printable ? uint32_t(b) : uint32_t(256 + extra));
  return s;
}

json tokenizer(const json& pre, bool all_bytes, bool array_merges, const json& added) {
  json vocab = json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b)
    if (all_bytes || (b >= 'a' && b <= 'z') || b == ' ' || b == '1' || b == '2') vocab[byte_char(b)] = next++;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {byte_char(' '), "w"}, {"o", "r"}, {"1", "2"}};
  json merges = json::array();
  for (const auto& [a, b] : pairs) {
    if (!vocab.contains(a) || !vocab.contains(b)) continue;
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    if (array_merges) merges.push_back(json::array({a, b}));
    else merges.push_back(a + " " + b);
  }
  json a = added;
  for (auto& t : a) t["id"] = next++;
  return json{{"version", "1.0"}, {"added_tokens", a}, {"normalizer", nullptr}, {"pre_tokenizer", pre},
              {"post_processor", nullptr}, {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"unk_token", nullptr}}}};
}

json added_token(const std::string& content, bool special, bool normalized, bool lstrip, bool rstrip, bool single_word) {
  return {{"id", 0}, {"content", content}, {"special", special}, {"normalized", normalized},
          {"lstrip", lstrip}, {"rstrip", rstrip}, {"single_word", single_word}};
}

void tokenizers(const std::string& out) {
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const json byte_level_plain = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}};
  auto split = [](const char* kind, const char* pattern, const char* behavior, bool invert) {
    return json{{"type", "Split"}, {"pattern", {{kind, pattern}}}, {"behavior", behavior}, {"invert", invert}};
  };
  auto seq = [&](std::vector<json> steps) {
    steps.push_back(byte_level_plain);
    return json{{"type", "Sequence"}, {"pretokenizers", steps}};
  };
  const std::vector<json> pres = {
      byte_level,
      seq({split("Regex", "\\p{N}{1,3}", "Isolated", false), split("Regex", "\\s+(?!\\S)|\\s+", "Isolated", false)}),
      seq({split("Regex", "\\s+", "Removed", false)}),
      seq({split("Regex", "[0-9]+", "MergedWithPrevious", false)}),
      seq({split("Regex", "[a-z]", "MergedWithNext", false)}),
      seq({split("String", " ", "Contiguous", true)}),
      seq({{{"type", "Digits"}, {"individual_digits", true}}, {{"type", "Whitespace"}}}),
      seq({{{"type", "WhitespaceSplit"}}, {{"type", "Digits"}, {"individual_digits", false}}}),
  };
  const json added = json::array({added_token("<|end|>", true, false, false, false, false),
                                  added_token("[x]", false, true, true, true, false),
                                  added_token("word", false, true, false, false, true)});
  const std::string texts[] = {"hello world 12 345", "  hello<|end|>wor [x] ld\n\n", "sword word 1212\t\u00e9\u4e16", ""};
  int i = 0;
  for (const auto& pre : pres)
    for (bool all_bytes : {true, false}) {
      const std::string t = texts[size_t(i) % 4];
      write_file(out, "tokenizer-" + std::to_string(i), tokenizer(pre, all_bytes, i % 3 == 0, added).dump() + '\0' + t);
      ++i;
    }
}

void configs(const std::string& out) {
  for (const auto& p : dsa::make_model_presets())
    for (const char* dtype : {"fp8", "bf16"}) write_file(out, "preset-" + p + "-" + dtype, dsa::make_model_config(p, dtype));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() == 5 && a[0] == "safetensors") safetensors(a[1], a[2], a[3], a[4]);
    else if (a.size() == 4 && a[0] == "jsonl-field") jsonl_field(a[1], a[2], a[3]);
    else if (a.size() == 4 && a[0] == "jsonl-keys") jsonl_keys(a[1], a[2], a[3]);
    else if (a.size() == 3 && a[0] == "completions") completions(a[1], a[2]);
    else if (a.size() == 2 && a[0] == "tokenizers") tokenizers(a[1]);
    else if (a.size() == 2 && a[0] == "configs") configs(a[1]);
    else {
      std::cerr << "usage: dsa_fuzz_seeds safetensors FILE TAG OUTDIR IDXDIR | jsonl-field FILE FIELD OUTDIR |\n"
                   "       jsonl-keys FILE KEYS OUTDIR | completions FILE OUTDIR | tokenizers OUTDIR | configs OUTDIR\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "dsa_fuzz_seeds " << (a.empty() ? "" : a[0]) << ": " << e.what() << "\n";
    return 1;
  }
  std::cout << g_count << " seeds\n";
  return 0;
}
