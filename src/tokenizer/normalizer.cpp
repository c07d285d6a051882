#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <algorithm>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace dsa::tok {
namespace {

bool is_ascii(unsigned char c) { return c < 0x80; }

// Canonical Combining Class, from utf8proc's tables.
int ccc(int32_t cp) { return utf8proc_get_property(cp)->combining_class; }

// Appends the full canonical (or compatibility) decomposition of cp. utf8proc writes at most
// bufsize code points and returns how many the decomposition needs.
void decompose_into(int32_t cp, bool compat, std::vector<int32_t>& cps) {
  const auto opts = static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0));
  constexpr utf8proc_ssize_t kRoom = 32;  // the longest mapping (U+FDFA, NFKD) is 18
  const size_t at = cps.size();
  cps.resize(at + kRoom);
  int boundclass = UTF8PROC_BOUNDCLASS_START;
  utf8proc_ssize_t n = utf8proc_decompose_char(cp, cps.data() + at, kRoom, opts, &boundclass);
  if (n > kRoom) {
    cps.resize(at + static_cast<size_t>(n));
    n = utf8proc_decompose_char(cp, cps.data() + at, n, opts, &boundclass);
  }
  if (n < 0) throw Error(std::string("Unicode normalization failed: ") + utf8proc_errmsg(n));
  cps.resize(at + static_cast<size_t>(n));
}

// Canonical ordering: each run of non-starters sorted by combining class, stably. utf8proc's
// own pass is a bubble sort, quadratic on a long run of marks; std::stable_sort is not.
void canonical_order(std::vector<int32_t>& cps) {
  size_t i = 0;
  while (i < cps.size()) {
    if (ccc(cps[i]) == 0) { ++i; continue; }
    size_t j = i + 1;
    while (j < cps.size() && ccc(cps[j]) != 0) ++j;
    if (j - i > 1)
      std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
                       [](int32_t a, int32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
}

// Normalizes one piece that holds no safe cut (see unicode_normalize), appending to out.
void normalize_piece(std::string_view s, UnicodeForm form, std::vector<int32_t>& cps, std::string& out) {
  const bool compat = form == UnicodeForm::NFKC || form == UnicodeForm::NFKD;
  const bool compose = form == UnicodeForm::NFC || form == UnicodeForm::NFKC;
  cps.clear();
  for (size_t i = 0; i < s.size();) decompose_into(static_cast<int32_t>(utf8::next_cp(s, i)), compat, cps);
  canonical_order(cps);
  size_t n = cps.size();
  if (compose) {
    // Canonical composition only (the input is already decomposed and ordered), linear.
    const utf8proc_ssize_t r = utf8proc_normalize_utf32(cps.data(), static_cast<utf8proc_ssize_t>(n),
                                                        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (r < 0) throw Error(std::string("Unicode normalization failed: ") + utf8proc_errmsg(r));
    n = static_cast<size_t>(r);
  }
  for (size_t k = 0; k < n; ++k) utf8::append_cp(out, static_cast<uint32_t>(cps[k]));
}

// Rust's char::is_whitespace, from the front and from the back.
size_t leading_white_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!utf8::is_white_space(utf8::next_cp(s, j))) break;
    i = j;
  }
  return i;
}

size_t trailing_white_space_start(std::string_view s, size_t floor) {
  size_t end = s.size();
  while (end > floor) {
    size_t start = end - 1;
    while (start > floor && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t j = start;
    if (!utf8::is_white_space(utf8::next_cp(s, j))) break;
    end = start;
  }
  return end;
}

}  // namespace

// Remaining edge: utf8proc 2.8 has Unicode 15.0 data, the tokenizers crate's
// unicode-normalization-alignments 0.1.12 older tables (before 12.0): the ~135 code points
// whose decompositions arrived in 12.0..15.0 (U+1F16C, U+11938, U+1FBF0.., U+A7F2..,
// U+10781.., U+1E030..) are decomposed here and left alone there.
void unicode_normalize(std::string_view s, UnicodeForm form, std::string& out) {
  out.clear();
  out.reserve(s.size());
  // Cut before every ASCII character: it is a starter (combining class 0) with no
  // decomposition and is never the second half of a composition, so nothing on its left
  // interacts with it or with what follows. ASCII runs are copied as they are; the ASCII
  // character just before a non-ASCII run goes with that run, which may combine into it
  // ("e" + U+0301). This keeps the scratch proportional to the longest non-ASCII run.
  std::vector<int32_t> cps;
  size_t i = 0;
  while (i < s.size()) {
    size_t p = i;
    while (p < s.size() && is_ascii(static_cast<unsigned char>(s[p]))) ++p;
    if (p == s.size()) { out.append(s.substr(i)); break; }
    const size_t start = p > i ? p - 1 : p;
    out.append(s.substr(i, start - i));
    size_t q = p;
    while (q < s.size() && !is_ascii(static_cast<unsigned char>(s[q]))) ++q;
    normalize_piece(s.substr(start, q - start), form, cps, out);
    i = q;
  }
}

void lowercase(std::string_view s, std::string& out) {
  out.clear();
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (is_ascii(c)) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
      ++i;
      continue;
    }
    const uint32_t cp = utf8::next_cp(s, i);
    // tokenizers lowercases with Rust's char::to_lowercase: the full mapping, which
    // SpecialCasing.txt expands only for U+0130 (İ -> i + U+0307 COMBINING DOT ABOVE; the
    // other lowercase entries there are conditional and Rust does not apply them, so Σ is
    // always σ). utf8proc_tolower is the simple 1:1 mapping, equal to Rust everywhere else
    // in utf8proc's Unicode 15.0. Remaining edge: case pairs added after 15.0 (U+1C89,
    // U+A7CB, Garay U+10D50.., 55 code points), which newer Rust lowercases and this keeps.
    if (cp == 0x130) {
      out += "i\xCC\x87";
      continue;
    }
    utf8::append_cp(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
}

namespace {

constexpr const char* kSupported = "NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip, Sequence";

// Normalizers the tokenizers crate has that belong to WordPiece / SentencePiece / byte-level
// pipelines this tokenizer does not implement, with what each one is for.
const char* not_byte_level(const std::string& type) {
  if (type == "BertNormalizer") return "the WordPiece (BERT) normalizer";
  if (type == "StripAccents") return "a WordPiece normalizer (drops combining marks)";
  if (type == "Precompiled") return "the SentencePiece charsmap normalizer";
  if (type == "Nmt") return "the SentencePiece NMT normalizer";
  if (type == "ByteLevel") return "the byte-level normalizer (this tokenizer does byte-level in the pre-tokenizer)";
  return nullptr;
}

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) throw Error(path + " has no \"" + key + "\"");
  return j[key];
}

std::string string_field(const nlohmann::json& j, const char* key, const std::string& path) {
  const auto& v = field(j, key, path);
  if (!v.is_string()) throw Error(path + "." + key + " must be a string, got " + v.dump());
  return v.get<std::string>();
}

bool bool_field(const nlohmann::json& j, const char* key, const std::string& path) {
  const auto& v = field(j, key, path);
  if (!v.is_boolean()) throw Error(path + "." + key + " must be true or false, got " + v.dump());
  return v.get<bool>();
}

// Replace's pattern: {"String": s} matches s literally, {"Regex": r} is an Oniguruma regex
// (tokenizers escapes a String into a regex; PCRE2's literal mode is the same thing).
std::shared_ptr<const Regex> replace_pattern(const nlohmann::json& j, const std::string& path) {
  const auto& pat = field(j, "pattern", path);
  const bool is_string = pat.is_object() && pat.size() == 1 && pat.contains("String") && pat["String"].is_string();
  const bool is_regex = pat.is_object() && pat.size() == 1 && pat.contains("Regex") && pat["Regex"].is_string();
  if (!is_string && !is_regex)
    throw Error(path + ".pattern must be {\"String\": ...} or {\"Regex\": ...}, got " + pat.dump());
  try {
    return std::make_shared<const Regex>(pat.begin().value().get<std::string>(), is_string);
  } catch (const Error& e) {
    throw Error(path + ".pattern: " + e.what());
  }
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& j, const std::string& path) {
  Normalizer n;
  if (!j.is_null()) n.add(j, path);
  return n;
}

void Normalizer::add(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) throw Error(path + " must be an object, got " + j.dump());
  const std::string type = string_field(j, "type", path);
  Step st;
  if (type == "Sequence") {
    const auto& list = field(j, "normalizers", path);
    if (!list.is_array()) throw Error(path + ".normalizers must be an array");
    for (size_t k = 0; k < list.size(); ++k) add(list[k], path + ".normalizers[" + std::to_string(k) + "]");
    return;
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    st.kind = Kind::Unicode;
    st.form = type == "NFC" ? UnicodeForm::NFC : type == "NFD" ? UnicodeForm::NFD
            : type == "NFKC" ? UnicodeForm::NFKC : UnicodeForm::NFKD;
  } else if (type == "Lowercase") {
    st.kind = Kind::Lowercase;
  } else if (type == "Replace") {
    st.kind = Kind::Replace;
    st.pattern = replace_pattern(j, path);
    // Released tokenizers insert `content` literally ("$1" stays "$1").
    st.content = string_field(j, "content", path);
  } else if (type == "Prepend") {
    st.kind = Kind::Prepend;
    st.content = string_field(j, "prepend", path);
  } else if (type == "Strip") {
    st.kind = Kind::Strip;
    st.strip_left = bool_field(j, "strip_left", path);
    st.strip_right = bool_field(j, "strip_right", path);
  } else if (const char* what = not_byte_level(type)) {
    throw Error(path + ".type is '" + type + "' (" + what + "), which byte-level BPE tokenizers do not use; supported: " + kSupported);
  } else {
    throw Error(path + ".type is '" + type + "', an unknown normalizer; supported: " + kSupported);
  }
  steps_.push_back(std::move(st));
}

void Normalizer::run(const Step& st, std::string_view in, std::string& out) {
  out.clear();
  switch (st.kind) {
    case Kind::Unicode:
      unicode_normalize(in, st.form, out);
      return;
    case Kind::Lowercase:
      lowercase(in, out);
      return;
    case Kind::Replace: {
      // tokenizers' NormalizedString::replace: every match (empty ones too, as Oniguruma's
      // find_iter yields them) becomes `content`; the text between is kept.
      std::vector<std::pair<uint32_t, uint32_t>> matches;
      st.pattern->find_all(in, matches);
      size_t prev = 0;
      for (const auto& [b, e] : matches) {
        out.append(in.substr(prev, b - prev));
        out += st.content;
        prev = e;
      }
      out.append(in.substr(prev));
      return;
    }
    case Kind::Prepend:
      // Only a non-empty string gets the prefix (tokenizers' Prepend checks is_empty()).
      if (!in.empty()) out += st.content;
      out.append(in);
      return;
    case Kind::Strip: {
      const size_t b = st.strip_left ? leading_white_space(in) : 0;
      const size_t e = st.strip_right ? trailing_white_space_start(in, b) : in.size();
      out.append(in.substr(b, e - b));
      return;
    }
  }
}

void Normalizer::apply(std::string_view text, std::string& out) const {
  if (steps_.empty()) {
    out.assign(text);
    return;
  }
  std::string scratch;
  std::string_view cur = text;
  for (size_t k = 0; k < steps_.size(); ++k) {
    // Alternate between the two buffers so that the last step writes into `out`.
    std::string& dst = (steps_.size() - k) % 2 == 1 ? out : scratch;
    run(steps_[k], cur, dst);
    cur = dst;
  }
}

std::string Normalizer::apply(std::string_view text) const {
  std::string out;
  apply(text, out);
  return out;
}

}  // namespace dsa::tok
