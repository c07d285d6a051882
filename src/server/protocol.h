#pragma once
// The OpenAI API's requests, checked and turned into what the scheduler runs: prompts as
// token ids (chat messages rendered with the model family's own encoding) and generation
// options. Every field the server knows is type-checked; unknown fields are ignored, as
// the OpenAI API and vLLM do. A bad request is an ApiError naming the field.
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.h"
#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"

namespace dsa::server {

// {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status, std::string message, std::string param = "", std::string type = "", std::string code = "");
  nlohmann::json body() const;
};

// What the request handlers need to know about the served model and the limits.
struct ServeLimits {
  int max_ctx = 4096;        // prompt + generated tokens of one request
  int max_tokens = 4096;     // largest max_tokens a request may ask for
  int max_prompt = 0;        // longest prompt in tokens; 0: max_ctx - 1
  int max_n = 8;             // choices per request
  int max_top_logprobs = 20;
};

struct ModelInfo {
  std::string name;           // the id clients send as "model"
  Family family = Family::DeepseekV32;
  int vocab_size = 0;
  const Tokenizer* tok = nullptr;  // null: token ids only
};

// One checked request of either endpoint.
struct Job {
  bool chat = false;
  std::vector<std::vector<int32_t>> prompts;  // chat: one; completions: one per prompt
  std::vector<std::string> prompt_texts;      // completions: for echo
  GenerateOptions gen;
  bool seed_given = false;
  int n = 1;
  bool stream = false, include_usage = false;
  int logprobs = -1;  // -1: none, else the number of top alternatives per token
  bool echo = false, return_token_ids = false;
  bool thinking = false;
  bool tools = false;  // chat: tools offered (a tool_choice of "none" offers none)
};

// The 404 for a model id this server does not serve.
ApiError model_not_found(const std::string& asked, const ModelInfo& m);

Job parse_chat_request(const nlohmann::ordered_json& body, const ModelInfo& m, const ServeLimits& lim);
Job parse_completion_request(const nlohmann::ordered_json& body, const ModelInfo& m, const ServeLimits& lim);

// The finish_reason for a stop reason ("stop", "length"; a cancelled request "abort").
const char* finish_reason(StopReason r);

}  // namespace dsa::server
