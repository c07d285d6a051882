#include "sampling/json_prefix.h"

namespace dsa {

namespace {
constexpr std::string_view kLiterals[] = {"true", "false", "null"};
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
}  // namespace

bool JsonPrefix::feed(std::string_view s) {
  for (char c : s)
    if (!feed(static_cast<unsigned char>(c))) return false;
  return true;
}

bool JsonPrefix::complete() const {
  if (depth_ != 0) return false;
  switch (mode_) {
    case Mode::Between: return expect_ == Expect::End;
    case Mode::Zero:
    case Mode::Int:
    case Mode::Frac:
    case Mode::ExpDigits: return true;  // a top-level number, whole so far
    default: return false;
  }
}

bool JsonPrefix::feed(unsigned char c) {
  switch (mode_) {
    case Mode::Between: return between(c);
    case Mode::String:
      if (c == '"') {
        mode_ = Mode::Between;
        if (key_) expect_ = Expect::Colon;
        else value_done();
        return true;
      }
      if (c == '\\') mode_ = Mode::Escape;
      return c >= 0x20;
    case Mode::Escape:
      if (c == 'u') {
        mode_ = Mode::Hex;
        pending_ = 4;
        return true;
      }
      mode_ = Mode::String;
      return std::string_view("\"\\/bfnrt").find(char(c)) != std::string_view::npos;
    case Mode::Hex:
      if (!is_hex(c)) return false;
      if (--pending_ == 0) mode_ = Mode::String;
      return true;
    case Mode::Literal: {
      const std::string_view lit = kLiterals[literal_];
      if (c != static_cast<unsigned char>(lit[pending_])) return false;
      if (++pending_ == lit.size()) {
        mode_ = Mode::Between;
        value_done();
      }
      return true;
    }
    // Numbers: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
    case Mode::Minus:
      if (!is_digit(c)) return false;
      mode_ = c == '0' ? Mode::Zero : Mode::Int;
      return true;
    case Mode::Zero:
    case Mode::Int:
      if (mode_ == Mode::Int && is_digit(c)) return true;
      if (c == '.') {
        mode_ = Mode::Dot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        mode_ = Mode::Exp;
        return true;
      }
      return end_number(c);
    case Mode::Dot:
      if (!is_digit(c)) return false;
      mode_ = Mode::Frac;
      return true;
    case Mode::Frac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        mode_ = Mode::Exp;
        return true;
      }
      return end_number(c);
    case Mode::Exp:
      if (c == '+' || c == '-') {
        mode_ = Mode::ExpSign;
        return true;
      }
      [[fallthrough]];
    case Mode::ExpSign:
      if (!is_digit(c)) return false;
      mode_ = Mode::ExpDigits;
      return true;
    case Mode::ExpDigits:
      if (is_digit(c)) return true;
      return end_number(c);
  }
  return false;
}

// A byte that cannot go on a number ends it and is read after it.
bool JsonPrefix::end_number(unsigned char c) {
  mode_ = Mode::Between;
  value_done();
  return between(c);
}

bool JsonPrefix::between(unsigned char c) {
  if (is_space(c)) return true;
  switch (expect_) {
    case Expect::Value: return (!object_only_ || depth_ > 0 || c == '{') && start_value(c);
    case Expect::ValueOrClose: return c == ']' ? close(false) : start_value(c);
    case Expect::KeyOrClose:
      if (c == '}') return close(true);
      [[fallthrough]];
    case Expect::Key:
      if (c != '"') return false;
      mode_ = Mode::String;
      key_ = true;
      return true;
    case Expect::Colon:
      if (c != ':') return false;
      expect_ = Expect::Value;
      return true;
    case Expect::CommaOrClose:
      if (c == ',') {
        expect_ = in_object() ? Expect::Key : Expect::Value;
        return true;
      }
      if (c == '}' || c == ']') return close(c == '}');
      return false;
    case Expect::End: return false;
  }
  return false;
}

bool JsonPrefix::start_value(unsigned char c) {
  switch (c) {
    case '{': return open(true);
    case '[': return open(false);
    case '"':
      mode_ = Mode::String;
      key_ = false;
      return true;
    case '-': mode_ = Mode::Minus; return true;
    case '0': mode_ = Mode::Zero; return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = Mode::Literal;
      literal_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      pending_ = 1;
      return true;
    default:
      if (c < '1' || c > '9') return false;
      mode_ = Mode::Int;
      return true;
  }
}

bool JsonPrefix::open(bool object) {
  if (depth_ == kMaxDepth) return false;
  if (object) objects_ |= uint64_t(1) << depth_;
  else objects_ &= ~(uint64_t(1) << depth_);
  ++depth_;
  expect_ = object ? Expect::KeyOrClose : Expect::ValueOrClose;
  return true;
}

bool JsonPrefix::close(bool object) {
  if (depth_ == 0 || in_object() != object) return false;
  --depth_;
  value_done();
  return true;
}

}  // namespace dsa
