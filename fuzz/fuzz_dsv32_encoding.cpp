// The DeepSeek-V3.2 message encoder (encode_messages) on fuzzed request JSON and on
// type-confused variants of it (fuzz_util.h). The input is one JSON document, shaped like a
// line of chat_examples.jsonl:
//   {"messages": [...], "encode_args": {"thinking_mode": "thinking", "drop_thinking": true,
//    "add_default_bos_token": true}, "context": [...]}
// (encode_args and context optional), or a bare messages array. Whatever is passed as
// messages, the encoder must either render it or throw dsa::Error; what it renders from
// valid JSON strings is valid UTF-8, and it starts with BOS when asked to without context.
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/json.h"
#include "tokenizer/dsv32_encoding.h"
#include "tokenizer/utf8.h"

using ojson = nlohmann::ordered_json;
namespace dsv32 = dsa::chat::dsv32;

namespace {

void check(const ojson& j) {
  const bool wrapped = j.is_object() && j.contains("messages");
  const ojson& messages = wrapped ? j["messages"] : j;
  ojson context = ojson::array();
  dsv32::EncodeOptions o;
  if (wrapped) {
    if (j.contains("context")) context = j["context"];
    const ojson& a = j.contains("encode_args") ? j["encode_args"] : ojson();
    if (a.is_object()) {
      if (a.contains("thinking_mode") && a["thinking_mode"].is_string())
        o.thinking_mode = dsa::chat::parse_thinking_mode(a["thinking_mode"].get<std::string>());
      if (a.contains("drop_thinking") && a["drop_thinking"].is_boolean()) o.drop_thinking = a["drop_thinking"].get<bool>();
      if (a.contains("add_default_bos_token") && a["add_default_bos_token"].is_boolean())
        o.add_default_bos_token = a["add_default_bos_token"].get<bool>();
    }
  }
  const std::string prompt = dsv32::encode_messages(messages, o, context);
  FUZZ_CHECK(dsa::utf8::valid(prompt), "prompt is not valid UTF-8");
  if (o.add_default_bos_token && (context.is_null() || context.empty()))
    FUZZ_CHECK(prompt.starts_with(dsv32::kBos), "no BOS although asked for without context");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = dsa::fuzz::as_view(data, size);
  ojson j;
  try {
    j = dsa::parse_json_bounded<ojson>(input);  // as a server parses a request
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  dsa::fuzz::run_with_variants(j, input, 32, check);
  return 0;
}
