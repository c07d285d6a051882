#pragma once
// DeepSeek-V3.2 prompt encoding: a C++ port of encode_messages() from the model repository's
// encoding/encoding_dsv32.py (see shared/tokenizer/CHAT_ENCODING.md), byte for byte.
//
// Messages are OpenAI-shaped JSON. Pass nlohmann::ordered_json: tool schemas and arguments
// are re-serialized with their keys in the given order, as Python dicts keep them.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsa::chat {

enum class ThinkingMode { Chat, Thinking };

// "chat" or "thinking"; anything else throws dsa::Error (as the reference asserts).
ThinkingMode parse_thinking_mode(std::string_view s);

namespace dsv32 {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";

struct EncodeOptions {
  ThinkingMode thinking_mode = ThinkingMode::Chat;
  bool drop_thinking = true;          // no effect on the string (see CHAT_ENCODING.md)
  bool add_default_bos_token = true;  // BOS only when context is empty
};

// encode_messages(messages, thinking_mode, context, drop_thinking, add_default_bos_token).
// `context` messages are not rendered; they only shift indices and feed the lookups.
// Tools sit in the "tools" field of a system/developer message. Throws dsa::Error where the
// reference asserts. Differences, for inputs the reference mishandles: null or missing
// content renders as "" (Python would print "None"), list-of-parts content is joined, and
// tool-call arguments may be an object as well as a JSON string.
std::string encode_messages(const nlohmann::ordered_json& messages, const EncodeOptions& opts,
                            const nlohmann::ordered_json& context = nlohmann::ordered_json::array());

// The "## Tools" block for a list of OpenAI tools ({type, function}) or bare function objects.
std::string render_tools(const nlohmann::ordered_json& tools);

}  // namespace dsv32
}  // namespace dsa::chat
