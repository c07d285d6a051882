#include "runtime/chat.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/dsv32_encoding.h"
#include "tokenizer/glm5_template.h"
#include "tokenizer/utf8.h"

namespace dsa {

namespace {
constexpr std::string_view kThinkEnd = "</think>";
}

std::string render_chat_prompt(Family family, const nlohmann::ordered_json& messages, bool thinking) {
  if (family == Family::DeepseekV32) {
    chat::dsv32::EncodeOptions o;
    o.thinking_mode = thinking ? chat::ThinkingMode::Thinking : chat::ThinkingMode::Chat;
    return chat::dsv32::encode_messages(messages, o);
  }
  chat::glm5::RenderOptions o;
  o.add_generation_prompt = true;
  o.enable_thinking = thinking;
  return chat::glm5::render(messages, nullptr, o);
}

void ReplySplitter::push(std::string_view text, const std::function<void(bool, std::string_view)>& on) {
  if (!in_reasoning_) {
    if (!text.empty()) on(false, text);
    return;
  }
  buf_.append(text);
  const size_t at = buf_.find(kThinkEnd);
  if (at != std::string::npos) {
    if (at) on(true, std::string_view(buf_).substr(0, at));
    in_reasoning_ = false;
    const std::string rest = buf_.substr(at + kThinkEnd.size());
    buf_.clear();
    if (!rest.empty()) on(false, rest);
    return;
  }
  size_t hold = 0;  // longest tail that is a proper prefix of </think>
  for (size_t k = std::min(kThinkEnd.size() - 1, buf_.size()); k > 0; --k)
    if (std::string_view(buf_).substr(buf_.size() - k) == kThinkEnd.substr(0, k)) {
      hold = k;
      break;
    }
  if (buf_.size() > hold) on(true, std::string_view(buf_).substr(0, buf_.size() - hold));
  buf_.erase(0, buf_.size() - hold);
}

void ReplySplitter::finish(const std::function<void(bool, std::string_view)>& on) {
  if (!buf_.empty()) on(in_reasoning_, buf_);
  buf_.clear();
}

ChatSession::ChatSession(Generator& gen, const Tokenizer& tok, bool thinking, std::string system)
    : gen_(gen), tok_(tok), thinking_(thinking), system_(std::move(system)) {
  reset();
}

void ChatSession::reset() {
  messages_ = nlohmann::ordered_json::array();
  if (!utf8::valid(system_)) throw Error("chat: the system prompt is not valid UTF-8");
  if (!system_.empty()) messages_.push_back({{"role", "system"}, {"content", system_}});
}

ChatSession::Turn ChatSession::send(const std::string& user, const GenerateOptions& g,
                                    const std::function<void(bool, std::string_view)>& on_piece) {
  messages_.push_back({{"role", "user"}, {"content", user}});
  Turn t;
  try {
    const std::string prompt = render_chat_prompt(gen_.model().config.family, messages_, thinking_);
    const std::vector<int32_t> ids = tok_.encode(prompt);
    ReplySplitter split(thinking_);
    auto on = [&](bool reasoning, std::string_view s) {
      (reasoning ? t.reasoning : t.content).append(s);
      if (on_piece) on_piece(reasoning, s);
    };
    t.result = gen_.generate(ids, g, [&](std::string_view s) { split.push(s, on); });
    split.finish(on);
  } catch (...) {
    messages_.erase(messages_.end() - 1);  // the turn did not happen
    throw;
  }
  nlohmann::ordered_json reply = {{"role", "assistant"}, {"content", t.content}};
  if (thinking_) reply["reasoning_content"] = t.reasoning;
  messages_.push_back(std::move(reply));
  return t;
}

}  // namespace dsa
