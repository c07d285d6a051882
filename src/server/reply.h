#pragma once
// A chat reply as it streams: generated text in, OpenAI deltas out (reasoning_content,
// content, tool calls with their arguments growing as they are generated). DeepSeek-V3.2
// replies go through the DSML parser of the chat encoding; GLM-5 replies through the
// <think> / <tool_call> markup of its template. Markup never reaches content, reasoning or
// arguments. A model that breaks its own format (a random-weight model, a reply cut off by
// max_tokens) never fails the request: what it wrote from there on is content as written,
// and an unfinished tool call is dropped.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace dsa::server {

struct ToolCallDelta {
  int index = 0;
  bool first = false;     // the call's first delta: carries id and name
  std::string id, name;
  std::string arguments;  // the arguments' next piece
};

struct ReplyDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

struct ToolCallOut {
  std::string id, name, arguments;
};

class ReplyStream {
public:
  // `request_id` makes the call ids ("call_<request_id>_<k>").
  ReplyStream(Family family, bool thinking, std::string request_id);
  ~ReplyStream();
  void feed(std::string_view text, ReplyDelta& d);
  // End of generation; `eos`: it stopped on an end-of-sequence token (whose text the
  // engine does not decode).
  void finish(bool eos, ReplyDelta& d);

  // The whole reply so far.
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  const std::vector<ToolCallOut>& tool_calls() const { return calls_; }

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
  std::string id_, reasoning_, content_;
  std::vector<ToolCallOut> calls_;
};

}  // namespace dsa::server
