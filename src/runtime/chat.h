#pragma once
// Chat on top of the Generator: the conversation as OpenAI-shaped messages, rendered
// whole each turn with the model family's own encoding (DeepSeek-V3.2 encoder or GLM-5
// template), so the previous turn's cache blocks are reused through the engine's prefix
// cache and only the rest (from the last full block it shares) is prefilled.
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "runtime/generator.h"

namespace dsa {

// The prompt for `messages` followed by the assistant's generation prompt.
std::string render_chat_prompt(Family family, const nlohmann::ordered_json& messages, bool thinking);

// Splits streamed reply text into reasoning (before </think>) and content. Both chat
// prompts open the reasoning block themselves in thinking mode, so the reply starts in
// reasoning then; a possible partial "</think>" is held back. Never throws: a random or
// misbehaving model just produces reasoning that never closes.
class ReplySplitter {
public:
  explicit ReplySplitter(bool thinking) : in_reasoning_(thinking) {}
  // Calls on(reasoning?, text) for each piece that is final.
  void push(std::string_view text, const std::function<void(bool, std::string_view)>& on);
  void finish(const std::function<void(bool, std::string_view)>& on);

private:
  bool in_reasoning_;
  std::string buf_;
};

class ChatSession {
public:
  ChatSession(Generator& gen, const Tokenizer& tok, bool thinking, std::string system = "");

  struct Turn {
    GenerateResult result;
    std::string reasoning, content;
  };
  // Adds the user message, generates the reply (on_piece(reasoning?, text) as it streams)
  // and adds it to the history.
  Turn send(const std::string& user, const GenerateOptions& g, const std::function<void(bool, std::string_view)>& on_piece);
  void reset();  // empty history (the system prompt stays); the cache is reused as it matches

  const nlohmann::ordered_json& messages() const { return messages_; }

private:
  Generator& gen_;
  const Tokenizer& tok_;
  bool thinking_;
  std::string system_;
  nlohmann::ordered_json messages_;
};

}  // namespace dsa
