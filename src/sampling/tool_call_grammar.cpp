#include "sampling/tool_call_grammar.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "tokenizer/dsv32_encoding.h"

namespace dsa {
namespace {

// The markers the encoder writes and the parser reads (header constants only).
using chat::dsv32::kDsml, chat::dsv32::kThinkEnd, chat::dsv32::kThinkStart;

constexpr std::string_view kOpen = "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"";
constexpr std::string_view kNameEnd = ">\n";  // after the name's closing quote
constexpr std::string_view kFirstParam = "<｜DSML｜parameter name=\"";
constexpr std::string_view kNextParam = "\n<｜DSML｜parameter name=\"";
constexpr std::string_view kInvokeClose = "\n</｜DSML｜invoke>";
constexpr std::string_view kStringAttr = " string=\"";  // after the key's closing quote
constexpr std::string_view kRawValue = "true\">";
constexpr std::string_view kJsonValue = "false\">";
constexpr std::string_view kParamClose = "</｜DSML｜parameter>";
constexpr std::string_view kNextInvoke = "\n<｜DSML｜invoke name=\"";
constexpr std::string_view kCallsClose = "\n</｜DSML｜function_calls>";
// "<｜" opens the BOS, EOS and DSML markup: the parser refuses the first two in reasoning and
// content, and free text never opens the third.
constexpr std::string_view kBarOpen = "<｜";
// "</｜DSML｜" matched: the rest must be the close tag's.
constexpr size_t kCloseMarkup = 2 + kDsml.size();
// The characters (UTF-8 sequences) in the close tag's first k bytes.
constexpr auto kCloseChars = [] {
  std::array<uint8_t, kParamClose.size() + 1> a{};
  for (size_t k = 0; k < kParamClose.size(); ++k) a[k + 1] = uint8_t(a[k] + ((static_cast<unsigned char>(kParamClose[k]) & 0xC0) != 0x80));
  return a;
}();

// The longest prefix of `pat` that ends the text, when the text ended with pat[0, m) and
// `c` follows (m <= pat.size(): a whole match is followed by its longest proper border).
uint8_t advance(std::string_view pat, size_t m, char c) {
  for (size_t k = std::min(m + 1, pat.size()); k > 0; --k) {
    // pat[0, k) against the last k bytes of pat[0, m) + c
    if (pat[k - 1] != c) continue;
    if (pat.substr(0, k - 1) == pat.substr(m + 1 - k, k - 1)) return uint8_t(k);
  }
  return 0;
}

// A name as written between the quotes of name="...": the parser takes it up to the first
// quote, and a line feed or markup in it would not survive the prompt's rendering.
void check_name(const std::string& name, const std::string& what) {
  if (name.empty() || name.find_first_of("\"<>\n\r") != std::string::npos || name.find(kDsml) != std::string::npos || name.size() > 256)
    throw Error(what + ": '" + name + "' cannot be written in a DSML call (1-256 bytes, no quotes, angle brackets or line breaks)");
}

// The node of v that reads strings (by the first byte '"', as anyOf alternatives are told
// apart), and what it admits as raw text.
ToolCallGrammar::RawValues raw_values(const JsonSchemaNode& v) {
  const JsonSchemaNode* m = &v;
  for (int depth = 0; !m->alts.empty(); ++depth) {
    const JsonSchemaNode* s = nullptr;
    for (const JsonSchemaNode* a : m->alts)
      if (a->first.test('"')) s = a;
    if (!s || depth == 64) return {};
    m = s;
  }
  ToolCallGrammar::RawValues r;
  if (!m->first.test('"')) return r;
  if (m->literals.empty()) {
    // A patterned string is written as JSON (string="false"), where the recognizer holds the
    // pattern: raw text ends only at the close tag, which the automaton cannot see coming.
    r.any = !m->pattern && (m->scalars & (JsonSchemaNode::kString | JsonSchemaNode::kAny)) != 0;
    r.min_chars = m->min_length, r.max_chars = m->max_length;
    return r;
  }
  for (const std::string& lit : m->literals) {
    if (lit.empty() || lit[0] != '"') continue;
    const std::string s = nlohmann::json::parse(lit).get<std::string>();
    if (s.find('<') == std::string::npos && s.find(kDsml) == std::string::npos) r.values.push_back(s);
  }
  std::sort(r.values.begin(), r.values.end());
  return r;
}

ToolCallGrammar::Tool compile_tool(const nlohmann::ordered_json& t, size_t i) {
  const std::string where = "tools[" + std::to_string(i) + "]";
  if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
      !t["function"]["name"].is_string())
    throw Error(where + ": expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
  const nlohmann::ordered_json& f = t["function"];
  ToolCallGrammar::Tool tool;
  tool.name = f["name"].get<std::string>();
  check_name(tool.name, where + ".function.name");
  if (!f.contains("parameters") || f["parameters"].is_null()) return tool;
  // OpenAI's "strict": the schema is kept exactly or refused; without it, best effort.
  const bool strict = f.contains("strict") && f["strict"].is_boolean() && f["strict"].get<bool>();
  try {
    tool.schema = std::make_unique<JsonSchema>(f["parameters"], strict ? JsonSchema::Lenient::No : JsonSchema::Lenient::Yes);
  } catch (const Error& e) {
    throw Error(where + ".function.parameters: " + e.what());
  }
  const JsonSchemaNode& root = tool.schema->root();
  if (strict && !root.object && !(root.scalars & JsonSchemaNode::kAny)) throw Error(where + ".function.parameters: expected an object schema");
  // A call's parameters are DSML tags, not a JSON object the recognizer counts the keys of.
  if (strict && (root.min_props > 0 || root.max_props < UINT32_MAX))
    throw Error(where + ".function.parameters: minProperties and maxProperties are not kept on a call's parameters");
  if (!root.object || root.props.empty()) return tool;  // no declared properties: none
  tool.params = &root;
  for (const JsonSchemaNode::Property& p : root.props) {
    // Property keys are kept JSON-escaped; the DSML attribute holds the name itself.
    const std::string key = nlohmann::json::parse("\"" + p.key + "\"").get<std::string>();
    check_name(key, where + ".function.parameters: the property name");
    tool.keys.push_back(key);
    tool.raw.push_back(raw_values(*p.value));
  }
  return tool;
}

}  // namespace

ToolCallGrammar::ToolCallGrammar(const nlohmann::ordered_json& tools, bool several, bool thinking)
    : several_(several), thinking_(thinking) {
  if (!tools.is_array() || tools.empty()) throw Error("tools: expected a non-empty list of tools to call");
  for (size_t i = 0; i < tools.size(); ++i) tools_.push_back(compile_tool(tools[i], i));
  std::sort(tools_.begin(), tools_.end(), [](const Tool& a, const Tool& b) { return a.name < b.name; });
  for (size_t i = 1; i < tools_.size(); ++i)
    if (tools_[i].name == tools_[i - 1].name) throw Error("tools: the name '" + tools_[i].name + "' is given twice");
  for (const Tool& t : tools_) names_.push_back(t.name);
}

ToolCallPrefix::ToolCallPrefix(const ToolCallGrammar& g) : g_(&g), json_(JsonSchema::any_object()) {
  if (g.thinking()) phase_ = Phase::Think;
  else offer({{kOpen, Then::ToolName}});
}

bool ToolCallPrefix::feed(std::string_view s) {
  for (char c : s)
    if (!feed(static_cast<unsigned char>(c))) return false;
  return true;
}

bool ToolCallPrefix::feed(unsigned char c) {
  switch (phase_) {
    case Phase::Think: return feed_think(c);
    case Phase::Lit: return feed_lit(c);
    case Phase::Name: return feed_name(c);
    case Phase::Key: return feed_key(c);
    case Phase::Raw: return feed_raw(c);
    case Phase::RawEnum: return feed_raw_enum(c);
    case Phase::Json: return feed_json(c);
    case Phase::Done: return false;
  }
  return false;
}

void ToolCallPrefix::offer(std::initializer_list<Alt> alts) {
  n_alts_ = 0;
  for (const Alt& a : alts)
    if (!a.text.empty()) alts_[n_alts_++] = a;
  alive_ = uint8_t((1u << n_alts_) - 1);
  at_ = 0;
  phase_ = Phase::Lit;
}

// Both patterns need an 0xEF byte (the first of "｜") after any tail short of their last "｜":
// only a tail past it can be completed, or the close tag's strict part reached, without one.
// In reasoning, "<think>" and "</think>" are completed without either byte once begun.
bool ToolCallPrefix::markup_pending() const {
  if (dsml_ > kDsml.rfind('\xEF') || bar_ > kBarOpen.rfind('\xEF')) return true;
  if (phase_ == Phase::Think) return close_ > 0 || open_ > 0;
  return close_ > kParamClose.substr(0, kCloseMarkup).rfind('\xEF');
}

uint32_t ToolCallPrefix::last_key() const {
  const JsonSchemaNode& p = *tool().params;
  return std::min<uint32_t>(p.required_from[next_], uint32_t(p.props.size()) - 1);
}

// Sets up what follows a finished piece. An alternative that cannot be taken is offered as
// empty text (offer() drops it); the grammar never leaves none.
void ToolCallPrefix::enter(Then t) {
  const size_t n_keys = tool().keys.size();
  const bool more_keys = next_ < n_keys;
  const bool none_required = n_keys == 0 || tool().params->required_from[next_] == n_keys;
  switch (t) {
    case Then::ToolName:
      phase_ = Phase::Name, cand_ = 0, at_ = 0;
      return;
    case Then::InvokeBody:
      offer({{more_keys ? kFirstParam : "", Then::KeyName}, {none_required ? kInvokeClose : "", Then::AfterInvoke}});
      return;
    case Then::KeyName:
      phase_ = Phase::Key, cand_ = next_, at_ = 0;
      return;
    case Then::StringAttr: {
      const ToolCallGrammar::RawValues& r = tool().raw[prop_];
      offer({{r.any || !r.values.empty() ? kRawValue : "", Then::Raw}, {kJsonValue, Then::Json}});
      return;
    }
    case Then::Raw:
      phase_ = tool().raw[prop_].any ? Phase::Raw : Phase::RawEnum;
      close_ = dsml_ = bar_ = 0, cand_ = 0, at_ = 0, raw_chars_ = 0, raw_utf8_ = Utf8Chars{};
      return;
    case Then::Json:
      phase_ = Phase::Json, close_ = dsml_ = bar_ = 0, at_ = 0;
      json_ = JsonSchemaPrefix(*tool().params->props[prop_].value);
      return;
    case Then::AfterValue:
      offer({{more_keys ? kNextParam : "", Then::KeyName}, {none_required ? kInvokeClose : "", Then::AfterInvoke}});
      return;
    case Then::AfterInvoke:
      offer({{g_->several() ? kNextInvoke : "", Then::ToolName}, {kCallsClose, Then::Done}});
      return;
    case Then::Done:
      phase_ = Phase::Done;
      return;
  }
}

// The offered alternatives are prefix-free, so the one that completes is the only one left.
bool ToolCallPrefix::feed_lit(unsigned char c) {
  uint8_t alive = 0;
  for (uint8_t i = 0; i < n_alts_; ++i)
    if ((alive_ >> i & 1) && at_ < alts_[i].text.size() && static_cast<unsigned char>(alts_[i].text[at_]) == c) alive |= uint8_t(1u << i);
  if (!alive) return false;
  alive_ = alive, ++at_;
  for (uint8_t i = 0; i < n_alts_; ++i)
    if ((alive >> i & 1) && alts_[i].text.size() == at_) enter(alts_[i].then);
  return true;
}

// Candidates [cand_, last] of which those that begin with the bytes so far (cand_'s first at_
// bytes) may still be written: c goes on with one of them (cand_ becomes the first), or, as
// `end`, ends one that is whole (its index is returned).
int64_t ToolCallPrefix::narrow(const std::vector<std::string>& cands, size_t last, unsigned char c, unsigned char end) {
  const std::string_view typed = std::string_view(cands[cand_]).substr(0, at_);
  for (size_t i = cand_; i <= last; ++i) {
    const std::string& s = cands[i];
    if (s.compare(0, at_, typed) != 0) continue;
    if (c == end && s.size() == at_) return int64_t(i);
    if (s.size() > at_ && static_cast<unsigned char>(s[at_]) == c) {
      cand_ = uint32_t(i), ++at_;
      return kGoesOn;
    }
  }
  return kRefused;
}

bool ToolCallPrefix::feed_name(unsigned char c) {
  const int64_t t = narrow(g_->names(), g_->names().size() - 1, c, '"');
  if (t >= 0) {
    tool_ = uint32_t(t), next_ = 0;
    offer({{kNameEnd, Then::InvokeBody}});
  }
  return t != kRefused;
}

// The keys that may come next are [next_, last_key()], in schema order.
bool ToolCallPrefix::feed_key(unsigned char c) {
  const int64_t p = narrow(tool().keys, last_key(), c, '"');
  if (p >= 0) {
    prop_ = uint32_t(p), next_ = uint32_t(p) + 1;
    offer({{kStringAttr, Then::StringAttr}});
  }
  return p != kRefused;
}

// Reasoning up to "</think>", after which the block begins.
bool ToolCallPrefix::feed_think(unsigned char c) {
  const uint8_t close = advance(kThinkEnd, close_, char(c)), open = advance(kThinkStart, open_, char(c));
  const uint8_t dsml = advance(kDsml, dsml_, char(c)), bar = advance(kBarOpen, bar_, char(c));
  if (close == kThinkEnd.size()) {
    offer({{kOpen, Then::ToolName}});
    return true;
  }
  if (open == kThinkStart.size() || dsml == kDsml.size() || bar == kBarOpen.size()) return false;
  close_ = close, open_ = open, dsml_ = dsml, bar_ = bar;
  return true;
}

bool ToolCallPrefix::feed_raw(unsigned char c) {
  const uint8_t close = advance(kParamClose, close_, char(c)), dsml = advance(kDsml, dsml_, char(c));
  const uint8_t bar = advance(kBarOpen, bar_, char(c));
  if (close_ >= kCloseMarkup && close != close_ + 1) return false;  // "</｜DSML｜" begins only the close tag
  if (close == kParamClose.size()) {  // the state before it was viable with the tag committed: the text is long enough
    enter(Then::AfterValue);
    return true;
  }
  if ((dsml == kDsml.size() && close != kCloseMarkup) || bar == kBarOpen.size()) return false;
  const uint32_t chars = raw_chars_ + raw_utf8_.begins(c);
  if (!raw_viable(chars, close)) return false;
  close_ = close, dsml_ = dsml, bar_ = bar, raw_chars_ = chars;
  return true;
}

// Whether raw text of `chars` characters, the last of them the close tag's first `close`
// bytes, can still end within the value's length bounds: its text so far is no longer than
// the maximum, and either it is long enough to end with the tag, or the tag's part can still
// turn out to be text (before "</｜DSML｜", the next '<' makes it so) and fits. Refusing every
// other state leaves no dead end: a state that passes keeps a way to the tag.
bool ToolCallPrefix::raw_viable(uint32_t chars, size_t close) const {
  const ToolCallGrammar::RawValues& r = tool().raw[prop_];
  const uint32_t pending = kCloseChars[close], text = chars - pending;
  if (text > r.max_chars) return false;
  if (text >= r.min_chars) return true;
  return close < kCloseMarkup && uint64_t(text) + pending <= r.max_chars;
}

uint32_t ToolCallPrefix::string_room() const {
  if (phase_ == Phase::Json) return json_.string_room();
  if (phase_ != Phase::Raw) return UINT32_MAX;
  const uint32_t max = tool().raw[prop_].max_chars;
  return max == UINT32_MAX ? UINT32_MAX : raw_chars_ >= max ? 0 : max - raw_chars_;
}

// One of the enum's strings (none holds '<'), then the close tag.
bool ToolCallPrefix::feed_raw_enum(unsigned char c) {
  const std::vector<std::string>& vals = tool().raw[prop_].values;
  const int64_t v = narrow(vals, vals.size() - 1, c, '<');
  if (v < 0) return v != kRefused;
  offer({{kParamClose, Then::AfterValue}});
  return feed_lit(c);
}

// A JSON value ends where its close tag begins: '<' never continues a whole value. As the
// encoder writes it, no whitespace comes before or after the value (the arguments are
// rebuilt from the value's text as written).
bool ToolCallPrefix::feed_json(unsigned char c) {
  if (c == '<' && json_.complete()) {
    offer({{kParamClose, Then::AfterValue}});
    return feed_lit(c);
  }
  const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
  if (space && (at_ == 0 || json_.complete())) return false;
  const uint8_t dsml = advance(kDsml, dsml_, char(c)), bar = advance(kBarOpen, bar_, char(c));
  if (dsml == kDsml.size() || bar == kBarOpen.size() || !json_.feed(c)) return false;
  dsml_ = dsml, bar_ = bar, at_ = 1;  // at_: the value has begun
  return true;
}

}  // namespace dsa
