// The DeepSeek-V3.2 completion parser (reasoning, content, DSML tool calls), one-shot and
// streaming. Input layout:
//   byte 0       flags: bit 0 = thinking mode
//   byte 1       n: how many chunk-size bytes follow (taken mod 16)
//   n bytes      chunk sizes, used in turn (0 feeds an empty delta)
//   the rest     the completion text
// StreamingParser promises that its events concatenate to parse_completion() of the whole
// text; and both reject malformed output with dsa::Error, so they must agree on that too.
// Deltas are cut at UTF-8 boundaries only, so valid input gives valid deltas.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "tokenizer/dsv32_parser.h"
#include "tokenizer/utf8.h"

namespace dsv32 = dsa::chat::dsv32;
using dsa::chat::ThinkingMode;

namespace {

// For failure messages only; the text may be invalid UTF-8, which dump() would throw on.
std::string describe(const dsv32::ParsedMessage& m) {
  return m.to_json().dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const ThinkingMode mode = (data[0] & 1) ? ThinkingMode::Thinking : ThinkingMode::Chat;
  const size_t n = std::min<size_t>(data[1] % 16, size - 2);
  const uint8_t* sizes = data + 2;
  const std::string_view text = dsa::fuzz::as_view(data + 2 + n, size - 2 - n);
  const bool valid = dsa::utf8::valid(text);

  std::optional<dsv32::ParsedMessage> whole;
  std::string whole_err;
  try {
    whole = dsv32::parse_completion(text, mode);
  } catch (const dsa::Error& e) {
    whole_err = e.what();
  }

  dsv32::StreamingParser sp(mode);
  dsv32::ParsedMessage got;
  std::string stream_err;
  bool stream_ok = true;
  auto take = [&](const std::vector<dsv32::StreamEvent>& ev) {
    for (const auto& e : ev) {
      if (e.kind != dsv32::StreamEvent::Kind::ToolCall && valid)
        FUZZ_CHECK(dsa::utf8::valid(e.text), "delta cut inside a UTF-8 character");
      switch (e.kind) {
        case dsv32::StreamEvent::Kind::Reasoning: got.reasoning_content += e.text; break;
        case dsv32::StreamEvent::Kind::Content: got.content += e.text; break;
        case dsv32::StreamEvent::Kind::ToolCall: got.tool_calls.push_back(e.call); break;
      }
    }
  };
  // All-zero sizes would never advance: then one empty delta and the whole text.
  bool advances = false;
  for (size_t k = 0; k < n; ++k) advances |= sizes[k] != 0;
  try {
    size_t at = 0, k = 0;
    if (!advances) take(sp.feed({}));
    while (at < text.size()) {
      const size_t len = advances ? std::min<size_t>(sizes[k++ % n], text.size() - at) : text.size();
      take(sp.feed(text.substr(at, len)));
      at += len;
    }
    take(sp.finish());
  } catch (const dsa::Error& e) {
    stream_err = e.what();
    stream_ok = false;
  }

  FUZZ_CHECK(whole.has_value() == stream_ok,
             whole ? "streaming failed (" + stream_err + ") where one-shot parsed " + describe(*whole)
                   : "streaming parsed " + describe(got) + " where one-shot failed (" + whole_err + ")");
  if (whole) {
    FUZZ_CHECK(got == *whole, "streaming gave " + describe(got) + ", one-shot " + describe(*whole));
    FUZZ_CHECK(got == sp.message(), "events disagree with message()");
  }
  return 0;
}
