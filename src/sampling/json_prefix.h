#pragma once
// A recognizer of one JSON text (RFC 8259: one value, whitespace around it), fed byte by
// byte: feed() says whether the bytes so far still begin some JSON text, complete() whether
// they are one. JSON mode samples only tokens whose bytes it accepts. The state is a few
// words (the open containers as bits, up to kMaxDepth deep), so trying a token is a copy and
// a feed. Strings take any byte from 0x20 up (UTF-8 is not checked) and \u escapes any four
// hex digits.
#include <cstdint>
#include <string_view>

namespace dsa {

class JsonPrefix {
public:
  static constexpr int kMaxDepth = 64;
  // object: the text must be an object (OpenAI's JSON mode), not any value.
  explicit JsonPrefix(bool object = false) : object_only_(object) {}

  // False: no JSON text begins with the bytes so far followed by c (the state is then
  // unspecified: feed a copy to try).
  bool feed(unsigned char c);
  bool feed(std::string_view s);
  // The bytes so far are a JSON text (a top-level number may still go on).
  bool complete() const;
  // A JSON text ended by its last byte that no byte but whitespace can follow.
  bool closed() const { return mode_ == Mode::Between && expect_ == Expect::End; }
  // Inside a string, past any escape: every byte from 0x20 up but '"' and '\\' keeps it so.
  bool in_string() const { return mode_ == Mode::String; }
  // Between tokens of the text: whitespace leaves the state as it is.
  bool between_tokens() const { return mode_ == Mode::Between; }

private:
  enum class Mode : uint8_t { Between, String, Escape, Hex, Literal, Minus, Zero, Int, Dot, Frac, Exp, ExpSign, ExpDigits };
  enum class Expect : uint8_t { Value, ValueOrClose, KeyOrClose, Key, Colon, CommaOrClose, End };
  Mode mode_ = Mode::Between;
  Expect expect_ = Expect::Value;
  bool object_only_ = false;
  bool key_ = false;       // the string being read is an object key
  uint8_t pending_ = 0;    // hex digits of a \u escape, or the literal's next byte
  uint8_t literal_ = 0;    // which of true, false, null
  uint8_t depth_ = 0;
  uint64_t objects_ = 0;   // bit d: the container at depth d is an object

  bool between(unsigned char c);
  bool start_value(unsigned char c);
  bool open(bool object);
  bool close(bool object);
  void value_done() { expect_ = depth_ == 0 ? Expect::End : Expect::CommaOrClose; }
  bool in_object() const { return depth_ > 0 && (objects_ >> (depth_ - 1) & 1); }
  bool end_number(unsigned char c);
};

}  // namespace dsa
