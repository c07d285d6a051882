#include "tokenizer/dsv32_parser.h"

#include <initializer_list>
#include <utility>

#include "core/error.h"
#include "tokenizer/pyjson.h"
#include "tokenizer/utf8.h"

namespace dsa::chat::dsv32 {
namespace {

constexpr std::string_view kToolsStart = "\n\n<｜DSML｜function_calls";
constexpr std::string_view kToolsEnd = "</｜DSML｜function_calls>";
constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke";
constexpr std::string_view kInvokeClose = "</｜DSML｜invoke";
constexpr std::string_view kParamOpen = "<｜DSML｜parameter";
constexpr std::string_view kParamClose = "/｜DSML｜parameter";
constexpr std::string_view kForbidden[] = {kBos, kEos, kThinkStart, kThinkEnd, kDsml};

[[noreturn]] void fail(const std::string& what) { throw Error("malformed DeepSeek-V3.2 completion: " + what); }

struct Hit {
  int which = -1;  // index of the stop found, -1 if none (yet)
  size_t pos = std::string_view::npos;
  size_t len = 0;
  size_t hold = std::string_view::npos;  // streaming: earliest position a stop may still start
};

// The reference's _read_until_stop: the earliest occurrence of any stop (first listed wins a
// tie). Streaming (final=false) also reports where a stop could still be completed by more
// text, and a hit behind such a position is not decisive yet.
Hit find_stop(std::string_view s, size_t from, std::initializer_list<std::string_view> stops, bool final) {
  Hit h;
  int k = 0;
  for (std::string_view st : stops) {
    const size_t p = s.find(st, from);
    if (p != std::string_view::npos && (h.which < 0 || p < h.pos)) h = {k, p, st.size(), h.hold};
    if (!final) {
      const size_t lo = std::max(from, s.size() >= st.size() ? s.size() - st.size() + 1 : size_t{0});
      for (size_t q = lo; q < s.size() && q < h.hold; ++q)
        if (st.substr(0, s.size() - q) == s.substr(q)) { h.hold = q; break; }
    }
    ++k;
  }
  if (h.which >= 0 && h.hold < h.pos) h.which = -1;  // an earlier stop may still complete
  return h;
}

// `^\s*name="(.*?)">\n$` (DOTALL; `$` also matches before one final newline).
std::string parse_invoke_name(std::string_view c) {
  size_t i = 0;
  while (i < c.size()) {
    const utf8::SeqInfo q = utf8::scan(c, i);
    if (q.status != utf8::Seq::Ok) break;
    size_t j = i;
    if (!utf8::py_isspace(utf8::next_cp(c, j))) break;
    i = j;
  }
  std::string_view r = c.substr(i);
  if (r.substr(0, 6) != "name=\"") fail("bad invoke header");
  r.remove_prefix(6);
  // The lazy group takes the shortest name, so prefer the ending with the extra newline.
  if (r.size() >= 4 && r.substr(r.size() - 4) == "\">\n\n") return std::string(r.substr(0, r.size() - 4));
  if (r.size() >= 3 && r.substr(r.size() - 3) == "\">\n") return std::string(r.substr(0, r.size() - 3));
  fail("bad invoke header");
}

struct Param {
  std::string name, value;
  bool is_string;
};

// `^ name="(.*?)" string="(true|false)">(.*?)<$` with DOTALL, lazy groups.
Param parse_param(std::string_view c) {
  if (c.substr(0, 7) != " name=\"") fail("bad parameter");
  const std::string_view r = c.substr(7);
  for (size_t at = r.find("\" string=\""); at != std::string_view::npos; at = r.find("\" string=\"", at + 1)) {
    std::string_view rest = r.substr(at + 10);
    bool is_str;
    if (rest.substr(0, 6) == "true\">") { is_str = true; rest.remove_prefix(6); }
    else if (rest.substr(0, 7) == "false\">") { is_str = false; rest.remove_prefix(7); }
    else continue;
    if (rest.size() >= 2 && rest.substr(rest.size() - 2) == "<\n")
      return {std::string(r.substr(0, at)), std::string(rest.substr(0, rest.size() - 2)), is_str};
    if (!rest.empty() && rest.back() == '<')
      return {std::string(r.substr(0, at)), std::string(rest.substr(0, rest.size() - 1)), is_str};
  }
  fail("bad parameter");
}

// decode_dsml_to_arguments: strings are JSON-quoted, other values are copied as written.
std::string build_arguments(const std::vector<Param>& ps) {
  std::string out = "{";
  for (size_t k = 0; k < ps.size(); ++k) {
    if (k) out += ", ";
    py_json_dump_string(out, ps[k].name);
    out += ": ";
    if (ps[k].is_string) py_json_dump_string(out, ps[k].value);
    else out += ps[k].value;
  }
  return out + "}";
}

enum class Block { NeedMore, Closed };

// parse_tool_calls from the reference, resumable: idx starts right after the tool marker and
// advances past each complete invoke (appended to calls). With final=false, running out of
// text returns NeedMore and the current invoke is parsed again once more text arrives.
Block parse_tool_block(std::string_view s, size_t& idx, bool final, std::vector<ToolCall>& calls) {
  for (;;) {
    const Hit h = find_stop(s, idx, {kInvokeOpen, kToolsEnd}, final);
    if (h.which < 0) {
      if (final) fail("tool-call block is not closed");
      const std::string_view sofar = s.substr(idx, std::min(h.hold, s.size()) - idx);
      if (std::string_view(">\n").substr(0, sofar.size()) != sofar) fail("unexpected text in tool-call block");
      return Block::NeedMore;
    }
    if (s.substr(idx, h.pos - idx) != ">\n") fail("unexpected text in tool-call block");
    if (h.which == 1) {
      idx = h.pos + h.len;
      return Block::Closed;
    }
    size_t q = h.pos + h.len;
    Hit n = find_stop(s, q, {kParamOpen, kInvokeClose}, final);
    if (n.which < 0) {
      if (final) fail("invoke is not closed");
      return Block::NeedMore;
    }
    ToolCall call;
    call.name = parse_invoke_name(s.substr(q, n.pos - q));
    q = n.pos + n.len;
    std::vector<Param> params;
    while (n.which == 0) {
      const Hit pc = find_stop(s, q, {kParamClose}, final);
      if (pc.which < 0) {
        if (final) fail("parameter is not closed");
        return Block::NeedMore;
      }
      Param p = parse_param(s.substr(q, pc.pos - q));
      for (const Param& o : params)
        if (o.name == p.name) fail("duplicate parameter '" + p.name + "'");
      params.push_back(std::move(p));
      q = pc.pos + pc.len;
      n = find_stop(s, q, {kParamOpen, kInvokeClose}, final);
      if (n.which < 0) {
        if (final) fail("invoke is not closed");
        return Block::NeedMore;
      }
      if (s.substr(q, n.pos - q) != ">\n") fail("bad parameter end");
      q = n.pos + n.len;
    }
    call.arguments = build_arguments(params);
    calls.push_back(std::move(call));
    idx = q;
  }
}

void check_no_special(std::string_view s, size_t from) {
  for (std::string_view f : kForbidden)
    if (s.find(f, from) != std::string_view::npos)
      fail("special token '" + std::string(f) + "' inside reasoning or content");
}

}  // namespace

nlohmann::ordered_json ParsedMessage::to_json() const {
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  for (const ToolCall& c : tool_calls)
    calls.push_back({{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return {{"role", "assistant"}, {"content", content}, {"reasoning_content", reasoning_content}, {"tool_calls", calls}};
}

ParsedMessage parse_completion(std::string_view text, ThinkingMode mode) {
  ParsedMessage m;
  size_t idx = 0;
  if (mode == ThinkingMode::Thinking) {
    const Hit h = find_stop(text, 0, {kThinkEnd, kToolsStart}, true);
    if (h.which != 0) fail("reasoning is not closed by </think>");
    m.reasoning_content = std::string(text.substr(0, h.pos));
    idx = h.pos + h.len;
  }
  const Hit h = find_stop(text, idx, {kEos, kToolsStart}, true);
  m.content = std::string(text.substr(idx, std::min(h.pos, text.size()) - idx));
  if (h.which == 1) {
    idx = h.pos + h.len;
    parse_tool_block(text, idx, true, m.tool_calls);
    const Hit e = find_stop(text, idx, {kEos}, true);
    if (text.substr(idx, std::min(e.pos, text.size()) - idx).size() != 0) fail("unexpected content after tool calls");
    idx = e.which == 0 ? e.pos + e.len : text.size();
  } else if (h.which == 0) {
    idx = h.pos + h.len;
  } else {
    fail("no end-of-sentence token and no tool calls");
  }
  if (idx != text.size()) fail("unexpected content after the end-of-sentence token");
  check_no_special(m.content, 0);
  check_no_special(m.reasoning_content, 0);
  return m;
}

StreamingParser::StreamingParser(ThinkingMode mode)
    : state_(mode == ThinkingMode::Thinking ? State::Reasoning : State::Content) {}

void StreamingParser::emit_text(bool reasoning, size_t len, std::vector<StreamEvent>& ev) {
  if (len == 0) return;
  std::string& dst = reasoning ? msg_.reasoning_content : msg_.content;
  const size_t old = dst.size();
  dst.append(buf_, 0, len);
  buf_.erase(0, len);
  // Check only the part that could hold a new occurrence (the longest token is 25 bytes).
  check_no_special(dst, old > 32 ? old - 32 : 0);
  if (!ev.empty() && ev.back().kind == (reasoning ? StreamEvent::Kind::Reasoning : StreamEvent::Kind::Content))
    ev.back().text += dst.substr(old);
  else
    ev.push_back({reasoning ? StreamEvent::Kind::Reasoning : StreamEvent::Kind::Content, dst.substr(old), {}});
}

void StreamingParser::step(bool final, std::vector<StreamEvent>& ev, bool& progressed) {
  progressed = false;
  // Held-back text ends before a possible marker start, and never inside a UTF-8 character:
  // neither one the hold position falls into nor one split across deltas (its first bytes
  // wait at the end of the buffer until the rest arrives).
  auto safe = [&](const Hit& h) {
    size_t n = std::min(h.hold, buf_.size());
    while (n > 0 && n < buf_.size() && (static_cast<unsigned char>(buf_[n]) & 0xC0) == 0x80) --n;
    if (n == buf_.size()) {
      size_t lead = n;
      while (lead > 0 && n - lead < 3 && (static_cast<unsigned char>(buf_[lead - 1]) & 0xC0) == 0x80) --lead;
      if (lead > 0 && utf8::scan(buf_, lead - 1).status == utf8::Seq::Truncated) n = lead - 1;
    }
    return n;
  };
  switch (state_) {
    case State::Reasoning: {
      const Hit h = find_stop(buf_, 0, {kThinkEnd, kToolsStart}, final);
      if (h.which == 1 || (h.which < 0 && final)) fail("reasoning is not closed by </think>");
      if (h.which == 0) {
        emit_text(true, h.pos, ev);
        buf_.erase(0, h.len);
        state_ = State::Content;
        progressed = true;
      } else {
        emit_text(true, safe(h), ev);
      }
      return;
    }
    case State::Content: {
      const Hit h = find_stop(buf_, 0, {kEos, kToolsStart}, final);
      if (h.which < 0 && final) fail("no end-of-sentence token and no tool calls");
      if (h.which >= 0) {
        emit_text(false, h.pos, ev);
        buf_.erase(0, h.len);
        state_ = h.which == 0 ? State::Done : State::Tools;
        progressed = true;
      } else {
        emit_text(false, safe(h), ev);
      }
      return;
    }
    case State::Tools: {
      size_t idx = 0;
      std::vector<ToolCall> calls;
      const Block b = parse_tool_block(buf_, idx, final, calls);
      for (ToolCall& c : calls) {
        msg_.tool_calls.push_back(c);
        ev.push_back({StreamEvent::Kind::ToolCall, {}, std::move(c)});
      }
      buf_.erase(0, idx);
      if (b == Block::Closed) {
        state_ = State::AfterTools;
        progressed = true;
      }
      return;
    }
    case State::AfterTools: {
      const Hit h = find_stop(buf_, 0, {kEos}, final);
      const size_t before = h.which == 0 ? h.pos : std::min(h.hold, buf_.size());
      if (before != 0) fail("unexpected content after tool calls");
      if (h.which == 0) {
        buf_.erase(0, h.len);
        state_ = State::Done;
        progressed = true;
      } else if (final) {
        state_ = State::Done;  // the reference accepts a tool-call completion without EOS
        progressed = true;
      }
      return;
    }
    case State::Done:
      if (!buf_.empty()) fail("unexpected content after the end-of-sentence token");
      return;
    case State::Failed:
      fail("parser already failed");
  }
}

namespace {

// The longest tail of `v` that may still become the end of a parameter value: its closing
// "<" (with the newline the reference allows) and tag, or a UTF-8 character cut short.
size_t value_hold(std::string_view v) {
  static constexpr std::string_view kClose1 = "</｜DSML｜parameter", kClose2 = "<\n/｜DSML｜parameter";
  const size_t lt = v.rfind('<');
  if (lt != std::string_view::npos) {
    const std::string_view t = v.substr(lt);
    if (kClose1.substr(0, t.size()) == t || kClose2.substr(0, t.size()) == t) return t.size();
  }
  size_t lead = v.size();
  while (lead > 0 && v.size() - lead < 3 && (static_cast<unsigned char>(v[lead - 1]) & 0xC0) == 0x80) --lead;
  if (lead > 0 && utf8::scan(v, lead - 1).status == utf8::Seq::Truncated) return v.size() - (lead - 1);
  return 0;
}

// The open parameter `r` (after "<｜DSML｜parameter") as far as it is final: nothing until its
// header is complete, then its name and its value so far (a string without its closing quote).
void append_open_param(std::string_view r, bool first, std::string& out) {
  const size_t sep = r.find("\" string=\"");
  if (r.substr(0, 7) != " name=\"" || sep == std::string_view::npos) return;
  std::string_view rest = r.substr(sep + 10);
  bool is_str;
  if (rest.substr(0, 6) == "true\">") { is_str = true; rest.remove_prefix(6); }
  else if (rest.substr(0, 7) == "false\">") { is_str = false; rest.remove_prefix(7); }
  else return;
  if (!first) out += ", ";
  py_json_dump_string(out, r.substr(7, sep - 7));
  out += ": ";
  rest.remove_suffix(value_hold(rest));
  if (!is_str) {
    out += rest;
    return;
  }
  py_json_dump_string(out, rest);
  out.pop_back();  // the closing quote comes with the end of the value
}

}  // namespace

std::optional<ToolCall> StreamingParser::partial_call() const {
  if (state_ != State::Tools) return std::nullopt;
  const std::string_view s = buf_;
  const size_t at = s.find(kInvokeOpen);
  if (at == std::string_view::npos) return std::nullopt;
  size_t q = at + kInvokeOpen.size();
  const size_t hdr_end = std::min(s.find(kParamOpen, q), s.find(kInvokeClose, q));
  if (hdr_end == std::string_view::npos) return std::nullopt;
  ToolCall call;
  try {
    call.name = parse_invoke_name(s.substr(q, hdr_end - q));
    call.arguments = "{";
    q = hdr_end;
    for (bool first = true; s.substr(q, kParamOpen.size()) == kParamOpen; first = false) {
      q += kParamOpen.size();
      const size_t pc = s.find(kParamClose, q);
      if (pc == std::string_view::npos) {
        append_open_param(s.substr(q), first, call.arguments);
        break;
      }
      // A complete parameter, written as build_arguments writes it.
      if (!first) call.arguments += ", ";
      const std::string one = build_arguments({parse_param(s.substr(q, pc - q))});
      call.arguments.append(one, 1, one.size() - 2);
      q = pc + kParamClose.size();
      if (s.substr(q, 2) != ">\n") break;
      q += 2;
    }
  } catch (const Error&) {
    return std::nullopt;  // malformed: finish() reports it
  }
  return call;
}

std::vector<StreamEvent> StreamingParser::run(bool final) {
  std::vector<StreamEvent> ev;
  try {
    bool progressed = true;
    while (progressed) step(final, ev, progressed);
  } catch (...) {
    state_ = State::Failed;
    throw;
  }
  return ev;
}

std::vector<StreamEvent> StreamingParser::feed(std::string_view delta) {
  buf_.append(delta);
  return run(false);
}

std::vector<StreamEvent> StreamingParser::finish() {
  auto ev = run(true);
  // The same whole-string checks as parse_completion.
  check_no_special(msg_.content, 0);
  check_no_special(msg_.reasoning_content, 0);
  return ev;
}

}  // namespace dsa::chat::dsv32
