#include "server/reply.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/dsv32_parser.h"

namespace dsa::server {

namespace {

// Where parsed pieces go: the reply's totals and this call's delta.
struct Sink {
  std::string& reasoning;
  std::string& content;
  std::vector<ToolCallOut>& calls;
  const std::string& request_id;
  ReplyDelta& d;

  void text(bool is_reasoning, std::string_view t) {
    if (t.empty()) return;
    (is_reasoning ? reasoning : content).append(t);
    (is_reasoning ? d.reasoning : d.content).append(t);
  }
  int begin_call(const std::string& name) {
    const int k = int(calls.size());
    calls.push_back({"call_" + request_id + "_" + std::to_string(k), name, ""});
    d.calls.push_back({k, true, calls.back().id, name, ""});
    return k;
  }
  void extend_call(int k, std::string_view args) {
    if (args.empty()) return;
    calls[size_t(k)].arguments.append(args);
    if (!d.calls.empty() && d.calls.back().index == k) d.calls.back().arguments.append(args);
    else d.calls.push_back({k, false, "", "", std::string(args)});
  }
  // Brings call k's arguments to `full`, which they must be a prefix of.
  void complete_call(int k, const std::string& full) {
    const std::string& have = calls[size_t(k)].arguments;
    DSA_CHECK(full.compare(0, have.size(), have) == 0, "streamed tool-call arguments are not a prefix of the final ones");
    extend_call(k, std::string_view(full).substr(have.size()));
  }
};

// The longest tail of `s` that is a proper prefix of `marker`.
size_t marker_hold(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(marker.size() - 1, s.size()); k > 0; --k)
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

}  // namespace

struct ReplyStream::Impl {
  virtual ~Impl() = default;
  virtual void feed(Sink& s, std::string_view text) = 0;
  virtual void finish(Sink& s, bool eos) = 0;
};

namespace {

namespace dsv32 = chat::dsv32;

class Dsv32Reply final : public ReplyStream::Impl {
public:
  explicit Dsv32Reply(bool thinking) : p_(thinking ? chat::ThinkingMode::Thinking : chat::ThinkingMode::Chat) {}

  void feed(Sink& s, std::string_view text) override {
    if (raw_) return s.text(false, text);
    run(s, [&] { return p_.feed(text); });
  }

  void finish(Sink& s, bool eos) override {
    if (raw_) return;
    if (eos) run(s, [&] { return p_.feed(dsv32::kEos); });
    if (!raw_) run(s, [&] { return p_.finish(); }, !eos);
  }

private:
  dsv32::StreamingParser p_;
  bool raw_ = false;
  int open_ = -1;     // the call being streamed
  size_t closed_ = 0;  // complete calls handed out

  template <class F>
  void run(Sink& s, F&& f, bool cut_off = false) {
    const bool reasoning = p_.in_reasoning(), tools = p_.in_tool_calls();
    try {
      for (const dsv32::StreamEvent& e : f()) take(s, e);
      if (const auto pc = p_.partial_call()) {
        if (open_ < 0) open_ = s.begin_call(pc->name);
        if (pc->arguments.size() > s.calls[size_t(open_)].arguments.size()) s.complete_call(open_, pc->arguments);
      }
    } catch (const Error&) {
      recover(s, reasoning, tools, cut_off);
    }
  }

  void take(Sink& s, const dsv32::StreamEvent& e) {
    switch (e.kind) {
      case dsv32::StreamEvent::Kind::Reasoning: s.text(true, e.text); break;
      case dsv32::StreamEvent::Kind::Content: s.text(false, e.text); break;
      case dsv32::StreamEvent::Kind::ToolCall:
        if (open_ < 0) open_ = s.begin_call(e.call.name);
        s.complete_call(open_, e.call.arguments);
        open_ = -1;
        ++closed_;
        break;
    }
  }

  // The reply left the format: what the parser took in before the error (the events of the
  // failing call are lost with the exception) is handed out, then held text as it stands,
  // and from here on everything is content. An unfinished tool call is dropped.
  void recover(Sink& s, bool reasoning, bool tools, bool cut_off) {
    raw_ = true;
    const dsv32::ParsedMessage& m = p_.message();
    if (m.reasoning_content.size() > s.reasoning.size()) s.text(true, std::string_view(m.reasoning_content).substr(s.reasoning.size()));
    if (m.content.size() > s.content.size()) s.text(false, std::string_view(m.content).substr(s.content.size()));
    for (; closed_ < m.tool_calls.size(); ++closed_) {
      if (open_ < 0) open_ = s.begin_call(m.tool_calls[closed_].name);
      s.complete_call(open_, m.tool_calls[closed_].arguments);
      open_ = -1;
    }
    if (open_ >= 0) s.calls.pop_back();
    open_ = -1;
    const std::string_view held = p_.held();
    // Cut off by max_tokens: held text is the start of a marker, not text.
    if (tools || (cut_off && held.find("<｜") != std::string_view::npos)) return;
    s.text(reasoning, held);
  }
};

// GLM-5: <think>reasoning</think>content<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>
class Glm5Reply final : public ReplyStream::Impl {
public:
  explicit Glm5Reply(bool thinking) : state_(thinking ? State::Reasoning : State::Content) {}

  void feed(Sink& s, std::string_view text) override {
    buf_.append(text);
    while (step(s, false)) {
    }
  }

  void finish(Sink& s, bool) override {
    while (step(s, true)) {
    }
    if (state_ == State::Call) {  // cut off inside a call: dropped
      if (open_ >= 0) s.calls.pop_back();
      open_ = -1;
    } else {
      s.text(state_ == State::Reasoning, buf_);
    }
    buf_.clear();
  }

private:
  enum class State { Reasoning, Content, Call };
  State state_;
  std::string buf_;
  int open_ = -1;

  static constexpr std::string_view kThinkEnd = "</think>", kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

  // One move through the buffer; true when it changed state.
  bool step(Sink& s, bool final) {
    if (state_ == State::Call) return call(s);
    const std::string_view marker = state_ == State::Reasoning ? kThinkEnd : kCallOpen;
    const size_t at = buf_.find(marker);
    if (at == std::string::npos) {
      const size_t keep = final ? 0 : marker_hold(buf_, marker);
      s.text(state_ == State::Reasoning, std::string_view(buf_).substr(0, buf_.size() - keep));
      buf_.erase(0, buf_.size() - keep);
      return false;
    }
    s.text(state_ == State::Reasoning, std::string_view(buf_).substr(0, at));
    buf_.erase(0, at + marker.size());
    state_ = state_ == State::Reasoning ? State::Content : State::Call;
    return true;
  }

  // Inside <tool_call>: the name once the first <arg_key> or the close arrives, each pair as
  // it closes; at </tool_call>, the closing brace.
  bool call(Sink& s) {
    const size_t close = buf_.find(kCallClose);
    const std::string_view body = std::string_view(buf_).substr(0, std::min(close, buf_.size()));
    const size_t key = body.find("<arg_key>");
    if (open_ < 0 && (key != std::string_view::npos || close != std::string::npos))
      open_ = s.begin_call(std::string(trim(body.substr(0, std::min(key, body.size())))));
    if (open_ < 0) return false;
    std::string args = "{";
    size_t q = key;
    for (int k = 0; q != std::string_view::npos; ++k) {
      const size_t ke = body.find("</arg_key>", q), vo = body.find("<arg_value>", q), ve = body.find("</arg_value>", q);
      if (ke == std::string_view::npos || vo == std::string_view::npos || ve == std::string_view::npos) break;
      if (k) args += ", ";
      args += nlohmann::json(std::string(trim(body.substr(q + 9, ke - q - 9)))).dump() + ": ";
      args += value_json(body.substr(vo + 11, ve - vo - 11));
      q = body.find("<arg_key>", ve);
    }
    if (close == std::string::npos) {
      if (args.size() > s.calls[size_t(open_)].arguments.size()) s.complete_call(open_, args);
      return false;
    }
    s.complete_call(open_, args + "}");
    open_ = -1;
    buf_.erase(0, close + kCallClose.size());
    state_ = State::Content;
    return true;
  }

  static std::string_view trim(std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\n')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\n')) v.remove_suffix(1);
    return v;
  }
  // The template writes strings as they are and everything else as JSON.
  static std::string value_json(std::string_view v) {
    const nlohmann::json j = nlohmann::json::parse(v, nullptr, false);
    if (!j.is_discarded() && !j.is_string()) return j.dump();
    return nlohmann::json(std::string(v)).dump();
  }
};

}  // namespace

ReplyStream::ReplyStream(Family family, bool thinking, std::string request_id) : id_(std::move(request_id)) {
  if (family == Family::DeepseekV32) impl_ = std::make_unique<Dsv32Reply>(thinking);
  else impl_ = std::make_unique<Glm5Reply>(thinking);
}

ReplyStream::~ReplyStream() = default;

void ReplyStream::feed(std::string_view text, ReplyDelta& d) {
  Sink s{reasoning_, content_, calls_, id_, d};
  impl_->feed(s, text);
}

void ReplyStream::finish(bool eos, ReplyDelta& d) {
  Sink s{reasoning_, content_, calls_, id_, d};
  impl_->finish(s, eos);
}

}  // namespace dsa::server
