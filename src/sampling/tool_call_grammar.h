#pragma once
// Forced tool calls (OpenAI's tool_choice "required" or a named function) for DeepSeek-V3.2:
// the reply is a DSML function_calls block and nothing else, each call naming an offered
// tool and giving its declared parameters with values its schema admits. ToolCallPrefix
// recognizes such replies byte by byte and, like JsonSchemaPrefix, refuses every byte with
// which no admitted reply begins, so a sampler masked by it never reaches a dead end.
//
// The block is written as the model's encoding writes calls (CHAT_ENCODING in the tokenizer
// data): "\n\n<｜DSML｜function_calls>\n", one or more invokes joined by "\n", then
// "\n</｜DSML｜function_calls>"; an invoke is '<｜DSML｜invoke name="NAME">\n', its parameters
// joined by "\n", then "\n</｜DSML｜invoke>"; a parameter is '<｜DSML｜parameter name="KEY"
// string="true|false">VALUE</｜DSML｜parameter>'. A value with string="true" is raw text (only
// where the parameter's schema admits a string); with string="false" it is JSON the schema
// admits. Parameters come in the schema's order, each at most once, the required ones always
// (as JsonSchemaPrefix takes an object's properties). In thinking mode the reasoning comes
// first, free text up to "</think>", and the block follows it directly. No free text (the
// reasoning, a value) holds "｜DSML｜" (the parser reads a value up to the next
// "/｜DSML｜parameter") or "<｜" (which opens the BOS and EOS markup, refused in reasoning),
// and the reasoning holds no "<think>".
//
// A tool's parameters are the properties its "parameters" schema declares, read as
// sampling/json_schema.h reads a schema: exactly, or refused, where the function says
// "strict": true (OpenAI's structured outputs); otherwise leniently (what the subset cannot
// say is not enforced). A tool without declared properties takes none.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/json_schema.h"

namespace dsa {

class ToolCallGrammar {
public:
  // What a parameter's value may be as raw text (string="true"): any text where its schema
  // admits any string, one of its enum's strings (those free of '<' and markup; the rest are
  // written as JSON), or nothing.
  struct RawValues {
    bool any = false;
    std::vector<std::string> values;  // sorted
    uint32_t min_chars = 0, max_chars = UINT32_MAX;  // any text: the schema's length bounds
  };
  struct Tool {
    std::string name;
    std::unique_ptr<JsonSchema> schema;  // the parameters schema (null: none given)
    std::vector<std::string> keys;       // the declared properties' names (unescaped), in order
    std::vector<RawValues> raw;          // per property
    const JsonSchemaNode* params = nullptr;  // the schema's root when it declares properties (keys match them)
  };
  // tools: OpenAI's list ({"type": "function", "function": {"name", "parameters"}}), the ones
  // the reply may call; several: more than one call per reply; thinking: the reply begins
  // with reasoning. Throws Error naming the tool and what cannot be written or enforced.
  ToolCallGrammar(const nlohmann::ordered_json& tools, bool several, bool thinking = false);
  const std::vector<Tool>& tools() const { return tools_; }  // sorted by name
  const std::vector<std::string>& names() const { return names_; }  // the tools' names, in that order
  bool several() const { return several_; }
  bool thinking() const { return thinking_; }

private:
  std::vector<Tool> tools_;
  std::vector<std::string> names_;
  bool several_, thinking_;
};

class ToolCallPrefix {
public:
  explicit ToolCallPrefix(const ToolCallGrammar& g);
  bool feed(unsigned char c);  // false: no admitted reply continues with c (the state is then undefined)
  bool feed(std::string_view s);
  bool complete() const { return phase_ == Phase::Done; }
  bool closed() const { return complete(); }
  // Inside a JSON string, or raw text, where any bytes free of quotes, backslashes, control
  // bytes (in JSON), '<' and 0xEF (kGuardsMarkup: either could begin markup) keep the state; so do they in reasoning.
  static constexpr bool kGuardsMarkup = true;
  bool in_string() const { return phase_ == Phase::Json && json_.in_string() && !markup_pending(); }
  bool in_raw() const { return (phase_ == Phase::Raw || phase_ == Phase::Think) && !markup_pending(); }
  bool between_tokens() const { return phase_ == Phase::Json && json_.between_tokens(); }
  uint32_t string_room() const;  // as JsonSchemaPrefix's, for a JSON string or raw text
  // As JsonSchemaPrefix's, inside a JSON value's patterned string where no markup is under
  // way (bytes free of '<' and 0xEF then go to the string alone).
  const Regex* pattern_at(Regex::Set& s, uint32_t& count) const {
    return phase_ == Phase::Json && !markup_pending() ? json_.pattern_at(s, count) : nullptr;
  }
  // Whitespace runs are bounded by the mask outside raw text (code in a string parameter
  // keeps its indentation).
  bool bounded_blanks() const { return phase_ != Phase::Raw && phase_ != Phase::Think; }

private:
  enum class Phase : uint8_t { Think, Lit, Name, Key, Raw, RawEnum, Json, Done };
  enum class Then : uint8_t { ToolName, InvokeBody, KeyName, StringAttr, Raw, Json, AfterValue, AfterInvoke, Done };
  struct Alt {
    std::string_view text;
    Then then;
  };
  const ToolCallGrammar* g_;
  Phase phase_ = Phase::Lit;
  Alt alts_[2];
  uint8_t n_alts_ = 0, alive_ = 0;  // Lit: alternatives, and a bit per one still matching
  uint16_t at_ = 0;                 // Lit, Name, Key, RawEnum: bytes matched
  uint32_t tool_ = 0, cand_ = 0;    // the call's tool; Name / Key / RawEnum: the first candidate matching so far
  uint32_t next_ = 0, prop_ = 0;    // the first parameter not passed; the one whose value is read
  uint8_t close_ = 0, dsml_ = 0;    // Raw / Json / Think: the text's tail matching the close tag / "｜DSML｜"
  uint8_t open_ = 0, bar_ = 0;      // Think: the tail matching "<think>"; free text: "<｜"
  uint32_t raw_chars_ = 0;          // Raw: the characters so far, a pending part of the close tag's included
  Utf8Chars raw_utf8_;              // Raw: where the characters begin
  JsonSchemaPrefix json_;

  const ToolCallGrammar::Tool& tool() const { return g_->tools()[tool_]; }
  void enter(Then t);
  void offer(std::initializer_list<Alt> alts);
  bool feed_lit(unsigned char c);
  bool feed_name(unsigned char c);
  bool feed_key(unsigned char c);
  bool feed_think(unsigned char c);
  bool feed_raw(unsigned char c);
  bool feed_raw_enum(unsigned char c);
  bool raw_viable(uint32_t chars, size_t close) const;
  bool feed_json(unsigned char c);
  uint32_t last_key() const;
  static constexpr int64_t kGoesOn = -1, kRefused = -2;
  int64_t narrow(const std::vector<std::string>& cands, size_t last, unsigned char c, unsigned char end);
  bool markup_pending() const;  // bytes free of '<' and 0xEF could complete markup from here  // the last parameter that may come next (none required is skipped)
};

}  // namespace dsa
