#include "tokenizer/pyjson.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace dsa {
namespace {

// Python's float repr: the shortest round-trip digits; fixed notation when the decimal
// exponent is in [-4, 16), otherwise d.ddde+XX with at least two exponent digits.
void dump_float(std::string& out, double d) {
  if (std::isnan(d)) { out += "NaN"; return; }
  if (std::isinf(d)) { out += d < 0 ? "-Infinity" : "Infinity"; return; }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));  // e.g. "-1.2345e+02"
  bool neg = false;
  if (!sci.empty() && sci[0] == '-') { neg = true; sci.remove_prefix(1); }
  const size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos)) if (c != '.') digits += c;
  int exp = 0;
  std::from_chars(sci.data() + epos + 1 + (sci[epos + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exp);
  if (neg) out += '-';
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else {
      const size_t int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_len) {
        out += digits;
        out.append(int_len - digits.size(), '0');
        out += ".0";
      } else {
        out += digits.substr(0, int_len);
        out += '.';
        out += digits.substr(int_len);
      }
    }
  } else {
    out += digits[0];
    if (digits.size() > 1) { out += '.'; out += digits.substr(1); }
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += e;
  }
}

void dump(std::string& out, const nlohmann::ordered_json& v) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null: out += "null"; break;
    case T::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case T::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case T::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case T::number_float: dump_float(out, v.get<double>()); break;
    case T::string: py_json_dump_string(out, v.get_ref<const std::string&>()); break;
    case T::array: {
      out += '[';
      bool first = true;
      for (const auto& x : v) {
        if (!first) out += ", ";
        first = false;
        dump(out, x);
      }
      out += ']';
      break;
    }
    case T::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        py_json_dump_string(out, it.key());
        out += ": ";
        dump(out, it.value());
      }
      out += '}';
      break;
    }
    default: throw Error("py_json_dumps: unsupported JSON value type");
  }
}

}  // namespace

void py_json_dump_string(std::string& out, std::string_view s) {
  // json.dumps(ensure_ascii=False) escapes only '"', '\\' and C0 controls; everything else,
  // including DEL, U+2028 and non-ASCII, is written raw.
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char e[8];
          std::snprintf(e, sizeof e, "\\u%04x", c);
          out += e;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string py_json_dumps(const nlohmann::ordered_json& v) {
  std::string out;
  dump(out, v);
  return out;
}

}  // namespace dsa
