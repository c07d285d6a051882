#pragma once
// Parsing DeepSeek-V3.2 completions back into an assistant message: reasoning before
// </think>, visible content, and DSML tool calls turned into OpenAI tool_calls. A port of
// parse_message_from_completion_text() from encoding_dsv32.py (CHAT_ENCODING.md), one-shot and
// streaming. Malformed output throws dsa::Error; nothing is guessed or silently dropped.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/dsv32_encoding.h"

namespace dsa::chat::dsv32 {

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON object text, rebuilt the way the reference does
  bool operator==(const ToolCall&) const = default;
};

struct ParsedMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ParsedMessage&) const = default;
  // {"role":"assistant","content":…,"reasoning_content":…,"tool_calls":[{"type":"function",
  //  "function":{"name":…,"arguments":…}}]} (no call ids; servers assign them).
  nlohmann::ordered_json to_json() const;
};

// The whole completion (from the end of the prompt, including the EOS text when the model
// stopped on EOS). One difference from the reference: a tool-call block must be closed by
// </｜DSML｜function_calls>; the reference also accepts output cut off right after an invoke.
ParsedMessage parse_completion(std::string_view text, ThinkingMode mode);

struct StreamEvent {
  enum class Kind { Reasoning, Content, ToolCall };
  Kind kind;
  std::string text;  // Reasoning / Content delta
  ToolCall call;     // ToolCall: one complete call
};

// Incremental parser: feed text deltas as they are decoded; it emits reasoning and content
// deltas as soon as they cannot be part of a marker any more (text that might still be the
// start of "</think>", "\n\n<｜DSML｜function_calls" or EOS is held back), and each tool call
// once its </｜DSML｜invoke> arrives. Deltas are cut at UTF-8 character boundaries only.
// Concatenating the events gives exactly parse_completion() of the concatenated input.
class StreamingParser {
public:
  explicit StreamingParser(ThinkingMode mode);
  std::vector<StreamEvent> feed(std::string_view delta);
  // End of output: flushes held-back text and checks the completion is well formed.
  std::vector<StreamEvent> finish();
  // Everything emitted so far, assembled.
  const ParsedMessage& message() const { return msg_; }
  bool saw_eos() const { return state_ == State::Done; }
  bool in_reasoning() const { return state_ == State::Reasoning; }
  bool in_tool_calls() const { return state_ == State::Tools; }
  // Text fed but not emitted yet (a possible marker's start, or a tool call in progress).
  std::string_view held() const { return buf_; }
  // The tool call being generated, as far as it is final: its name once the invoke header
  // is complete, and a prefix of its final arguments (the complete parameters, then the
  // open one's value so far, minus what may be the start of its closing tag), so that a
  // server can stream the arguments while they are generated. nullopt outside a call.
  std::optional<ToolCall> partial_call() const;

private:
  enum class State { Reasoning, Content, Tools, AfterTools, Done, Failed };
  std::vector<StreamEvent> run(bool final);
  void step(bool final, std::vector<StreamEvent>& ev, bool& progressed);
  void emit_text(bool reasoning, size_t len, std::vector<StreamEvent>& ev);
  State state_;
  std::string buf_;
  ParsedMessage msg_;
};

}  // namespace dsa::chat::dsv32
