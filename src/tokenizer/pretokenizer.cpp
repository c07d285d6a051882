#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>

#include "core/error.h"

namespace dsa::tok {
namespace {

// Per-thread PCRE2 scratch: one ovector pair is enough (we only need the whole match), and a
// JIT stack larger than the 32 KiB default so long runs (1000 letters, 300 CJK chars) never
// hit the JIT stack limit.
struct Scratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  Scratch() {
    md = pcre2_match_data_create(1, nullptr);
    mc = pcre2_match_context_create(nullptr);
    js = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (mc && js) pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~Scratch() {
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Oniguruma's \s is the Unicode White_Space property. PCRE2 (UCP) also counts U+180E
// (it is in \h), which Unicode dropped from White_Space in 6.3, so spell the set out.
constexpr std::string_view kOnigSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in p just after '[' or '[^'
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        if (in_class) out += kOnigSpace;
        else { out += '['; out += kOnigSpace; out += ']'; }
        ++i;
        continue;
      }
      if (n == 'S' && !in_class) {
        out += "[^";
        out += kOnigSpace;
        out += ']';
        ++i;
        continue;
      }
      out += c;
      out += n;
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') { out += '^'; ++i; }
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // POSIX class [:name:] inside a bracket expression: copy through ":]".
      const size_t e = p.find(":]", i + 2);
      if (e != std::string_view::npos) {
        out.append(p.substr(i, e + 2 - i));
        i = e + 1;
        continue;
      }
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE off = 0;
  const std::string pat = literal ? pattern : onig_to_pcre2(pattern);
  // PCRE2_LITERAL refuses PCRE2_UCP (it only changes what classes match, and a literal has none).
  const uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), opts,
                                   &err, &off, nullptr);
  if (!code)
    throw Error("cannot compile regex /" + pattern + "/ at offset " +
                std::to_string(off) + ": " + pcre2_message(err));
  // JIT is an optimisation only; pcre2_match falls back to the interpreter without it.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& out) const {
  Scratch& sc = scratch();
  auto* code = static_cast<const pcre2_code*>(code_);
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (pos <= s.size()) {
    const int rc = pcre2_match(code, subj, s.size(), pos, PCRE2_NO_UTF_CHECK, sc.md, sc.mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error("regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
    const size_t st = ov[0], en = ov[1];
    if (st == en && have_last && last_end == en) {
      // Empty match right after the previous one: step one character and search again.
      if (pos >= s.size()) break;
      size_t step = 1;
      while (pos + step < s.size() && (static_cast<unsigned char>(s[pos + step]) & 0xC0) == 0x80) ++step;
      pos += step;
      continue;
    }
    out.emplace_back(static_cast<uint32_t>(st), static_cast<uint32_t>(en));
    have_last = true;
    last_end = en;
    pos = en;
  }
}

namespace {

SplitBehavior parse_behavior(const std::string& b, const std::string& path) {
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  throw Error(path + ".behavior is '" + b + "'; supported: Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous");
}

constexpr const char* kSupportedTypes = "Sequence, Split, ByteLevel, Digits, Whitespace, WhitespaceSplit";

// The GPT-2 pattern that ByteLevel(use_regex=true) applies.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct Span {
  uint32_t start, end;
  bool match;
};

// Follows tokenizers' NormalizedString::split: spans from the matches, `invert` swaps which
// spans count as delimiters, then the behavior decides how delimiters are kept.
void apply_split(std::string_view piece, const Regex& re, SplitBehavior behavior, bool invert,
                 std::vector<std::pair<uint32_t, uint32_t>>& matches, std::vector<Span>& spans,
                 std::vector<std::string_view>& out) {
  matches.clear();
  re.find_all(piece, matches);
  if (behavior == SplitBehavior::Isolated && !invert) {
    // Fast path for the common case: every span becomes a piece.
    uint32_t prev = 0;
    for (const auto& [s, e] : matches) {
      if (s > prev) out.push_back(piece.substr(prev, s - prev));
      if (e > s) out.push_back(piece.substr(s, e - s));
      prev = e;
    }
    if (prev < piece.size()) out.push_back(piece.substr(prev));
    return;
  }
  spans.clear();
  uint32_t prev = 0;
  for (const auto& [s, e] : matches) {
    if (s > prev) spans.push_back({prev, s, invert});
    spans.push_back({s, e, !invert});
    prev = e;
  }
  if (prev < piece.size()) spans.push_back({prev, static_cast<uint32_t>(piece.size()), invert});

  std::vector<Span> kept;
  kept.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::Isolated:
      kept = spans;
      break;
    case SplitBehavior::Removed:
      for (const auto& sp : spans) if (!sp.match) kept.push_back(sp);
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool prev_match = false;
      for (const auto& sp : spans) {
        if (sp.match && !prev_match && !kept.empty()) kept.back().end = sp.end;
        else kept.push_back(sp);
        prev_match = sp.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& sp = spans[k];
        if (sp.match && !prev_match && !kept.empty()) kept.back().start = sp.start;
        else kept.push_back(sp);
        prev_match = sp.match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case SplitBehavior::Contiguous: {
      bool prev_match = false;
      for (const auto& sp : spans) {
        if (sp.match == prev_match && !kept.empty()) kept.back().end = sp.end;
        else kept.push_back(sp);
        prev_match = sp.match;
      }
      break;
    }
  }
  for (const auto& sp : kept)
    if (sp.end > sp.start) out.push_back(piece.substr(sp.start, sp.end - sp.start));
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& path) {
  PreTokenizer p;
  if (!j.is_null()) p.add(j, path);
  return p;
}

void PreTokenizer::add(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) throw Error(path + " must be an object, got " + j.dump());
  if (!j.contains("type") || !j["type"].is_string()) throw Error(path + " has no \"type\" string");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto& list = j.contains("pretokenizers") ? j["pretokenizers"] : nlohmann::json();
    if (!list.is_array()) throw Error(path + ".pretokenizers must be an array");
    for (size_t k = 0; k < list.size(); ++k) add(list[k], path + ".pretokenizers[" + std::to_string(k) + "]");
  } else if (type == "Split") {
    const auto& pat = j.contains("pattern") ? j["pattern"] : nlohmann::json();
    Step st;
    try {
      if (pat.is_object() && pat.contains("Regex")) st.re = std::make_shared<Regex>(pat["Regex"].get<std::string>());
      else if (pat.is_object() && pat.contains("String")) st.re = std::make_shared<Regex>(pat["String"].get<std::string>(), true);
      else throw Error("must be {\"String\": ...} or {\"Regex\": ...}, got " + pat.dump());
    } catch (const Error& e) {
      throw Error(path + ".pattern: " + e.what());
    }
    st.behavior = parse_behavior(j.value("behavior", "Isolated"), path);
    st.invert = j.value("invert", false);
    steps_.push_back(std::move(st));
  } else if (type == "ByteLevel") {
    byte_level_ = true;
    Step st;
    st.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) st.re = std::make_shared<Regex>(kGpt2Pattern);
    if (st.re || st.add_prefix_space) steps_.push_back(std::move(st));
  } else if (type == "Digits") {
    // tokenizers: individual digits are Isolated one by one, otherwise runs are Contiguous;
    // both keep every character, so a \p{N} or \p{N}+ Isolated split is equivalent.
    Step st;
    st.re = std::make_shared<Regex>(j.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
    steps_.push_back(std::move(st));
  } else if (type == "WhitespaceSplit") {
    Step st;
    st.re = std::make_shared<Regex>("\\s+");
    st.behavior = SplitBehavior::Removed;
    steps_.push_back(std::move(st));
  } else if (type == "Whitespace") {
    Step st;
    st.re = std::make_shared<Regex>("\\w+|[^\\w\\s]+");
    st.behavior = SplitBehavior::Removed;
    st.invert = true;
    steps_.push_back(std::move(st));
  } else {
    // BertPreTokenizer, Metaspace, CharDelimiterSplit, Punctuation, UnicodeScripts,
    // FixedLength or a misspelling: never silently the identity.
    throw Error(path + ".type is '" + type + "', an unsupported pre-tokenizer; supported: " + kSupportedTypes);
  }
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out,
                         std::deque<std::string>& arena) const {
  out.clear();
  if (text.empty()) return;
  out.push_back(text);
  std::vector<std::string_view> next;
  std::vector<std::pair<uint32_t, uint32_t>> matches;
  std::vector<Span> spans;
  for (const Step& st : steps_) {
    next.clear();
    for (std::string_view piece : out) {
      if (st.add_prefix_space && piece[0] != ' ') {
        // GCC 12 warns (-Wrestrict, a known false positive) on `" " + std::string(piece)`.
        std::string& with_space = arena.emplace_back(piece.size() + 1, ' ');
        with_space.replace(1, piece.size(), piece);
        piece = with_space;
      }
      if (st.re) apply_split(piece, *st.re, st.behavior, st.invert, matches, spans, next);
      else next.push_back(piece);
    }
    out.swap(next);
  }
}

}  // namespace dsa::tok
