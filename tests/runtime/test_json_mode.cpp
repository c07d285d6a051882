// The constrained modes' masks against the definition: with the DeepSeek-V3.2 tokenizer, after
// prefixes that leave the recognizer in each kind of state, a token is allowed exactly when
// its bytes fed to a copy of the state are all taken and it does not stretch a whitespace run
// past the limit where runs are bounded (end-of-sequence tokens once the text is whole,
// special tokens never). JSON mode against JsonPrefix, a schema against JsonSchemaPrefix,
// forced tool calls against ToolCallPrefix.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fixtures.h"
#include "runtime/json_mode.h"

using namespace dsa;

namespace {

// A run of whitespace: what the reply ends with plus what the token begins with (all of it,
// when it is only whitespace).
bool blank_ok(std::string_view reply, std::string_view token) {
  const size_t r = reply.find_last_not_of(" \t\n\r"), t = token.find_first_not_of(" \t\n\r");
  const std::string run = std::string(reply.substr(r == std::string_view::npos ? 0 : r + 1)) + std::string(token.substr(0, t));
  return t == 0 || (run.size() <= JsonMode::kMaxBlank && size_t(std::count(run.begin(), run.end(), '\n')) <= JsonMode::kMaxBreaks);
}

// Whitespace runs are bounded everywhere in JSON, outside raw text in a tool call.
template <class Ref>
bool bounded_here(const Ref& r) {
  if constexpr (requires { r.bounded_blanks(); }) return r.bounded_blanks();
  else return true;
}

// The mask after each reply against feeding every token to `ref` (a recognizer of the same
// texts, fed the reply).
template <class Mode = JsonMode, class Grammar, class Ref>
void check_masks(const Tokenizer& tok, const Grammar& grammar, const Ref& fresh, const std::vector<std::string>& replies) {
  const int V = tok.vocab_size() + 3;  // a model vocabulary past the tokenizer's, as checkpoints pad it
  std::vector<uint8_t> is_eos(size_t(V), 0);
  is_eos[size_t(tok.eos_id())] = 1;
  const JsonVocab vocab(tok, V);
  for (const bool eos_ends : {true, false})
    for (const std::string& reply : replies) {
      SCOPED_TRACE(reply + (eos_ends ? "" : " (eos does not end)"));
      Mode jm(vocab, grammar, is_eos, eos_ends);
      Ref ref = fresh;
      ASSERT_TRUE(ref.feed(reply));
      for (int32_t id : tok.encode(reply)) {
        (void)jm.allowed();  // masks along the way (a pattern's vocabulary built by one serves the next)
        jm.accept(id);
      }
      const uint8_t* got = jm.allowed();
      int allowed = 0, wrong = 0;
      for (int32_t id = 0; id < V; ++id) {
        bool want = false;
        if (is_eos[size_t(id)]) {
          want = ref.complete() && eos_ends;
        } else if (tok.is_valid_id(id) && !tok.is_special(id) && !tok.token_bytes(id).empty() && !(ref.closed() && eos_ends)) {
          Ref next = ref;
          const bool bounded = !ref.closed() && bounded_here(ref);
          want = next.feed(tok.token_bytes(id)) && (!bounded || blank_ok(reply, tok.token_bytes(id)));
        }
        allowed += want;
        wrong += bool(got[id]) != want;
        if (bool(got[id]) != want && wrong < 5) ADD_FAILURE() << "token " << id << " '" << tok.token_bytes(id) << "': " << int(got[id]);
      }
      EXPECT_EQ(wrong, 0);
      // A closed choice or match takes nothing more: where no end-of-sequence token ends it,
      // the reply ends at the token that closed it (Completion::emit) and no mask is drawn.
      EXPECT_TRUE(allowed > 0 || (ref.closed() && !eos_ends));
    }
}

TEST(JsonMode, MaskIsEveryTokenTheRecognizerTakes) {
  const Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  check_masks(tok, JsonSchema::any_object(), JsonPrefix(true),
              {"", "  ", "{", "{\"key\"", "{\"key\": ", "{\"key\": \"some te", "{\"k\": \"a\\", "{\"k\": \"\\u00", "{\"a\": [1, 2",
               "{\"a\": [1, 2.5e", "{\"a\": tr", "{\"a\": [{}, []]", "{\"a\": 1}", "{\"a\": 1} ", "{\n\n", "{\"k\": \"" + std::string(30, ' '),
               "{\"k\":" + std::string(31, ' '), "{\"a\": 1}" + std::string(40, ' ')});
  const auto person = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {"name": {"type": "string"},
      "kind": {"enum": ["cat", "catfish", {"a": [1, 2]}]}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {}}},
      "required": ["name"]})");
  const JsonSchema schema(person);
  check_masks(tok, schema, JsonSchemaPrefix(schema),
              {"", "{", "{\"na", "{\"name\": \"Al", "{\"name\": \"Al\", ", "{\"name\": \"Al\", \"kind\": \"cat", "{\"name\": \"Al\", \"kind\": {\"a\": [1,",
               "{\"name\": \"Al\", \"age\": 4", "{\"name\": \"Al\", \"tags\": [{\"x\": ", "{\"name\": \"Al\"}"});
  // Bounds: a string near its maximum length (where tokens of string-safe bytes may no longer
  // fit), one short of its minimum, an integer whose next digit must keep it in range.
  const JsonSchema bounded(nlohmann::ordered_json::parse(R"({"type": "object", "properties": {"code": {"type": "string",
      "minLength": 3, "maxLength": 12}, "n": {"type": "integer", "minimum": 5, "maximum": 420}}, "required": ["code", "n"]})"));
  check_masks(tok, bounded, JsonSchemaPrefix(bounded),
              {"{\"code\": \"", "{\"code\": \"ab", "{\"code\": \"abcdefgh", "{\"code\": \"abc\\u00e9 d\\n xy", "{\"code\": \"abc\", \"n\": ",
               "{\"code\": \"abc\", \"n\": 4", "{\"code\": \"abc\", \"n\": 42"});
}

// Forced tool calls: the block's markup, names and keys, a raw value (where '<' and 0xEF
// could begin markup, and whitespace is not bounded), a JSON value and its end, the close.
TEST(ToolCallMode, MaskIsEveryTokenTheRecognizerTakes) {
  const Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "fields": {"type": "array",
      "items": {"enum": ["temp", "wind"]}}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "get_time"}}])");
  const ToolCallGrammar grammar(tools, true);
  const std::string open = "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"";
  const std::string city = open + "get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"";
  const std::string days = city + "true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">";
  const std::string fields = city + "true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"fields\" string=\"false\">";
  check_masks<ToolCallMode>(tok, grammar, ToolCallPrefix(grammar),
                            {"", "\n\n<｜DSML｜func", open, open + "get_", open + "get_weather\">\n", open + "get_weather\">\n<｜DSML｜parameter name=\"ci",
                             city, city + "true\">Par", city + "true\">Paris\n\n\n" + std::string(40, ' '), city + "true\">a ｜DS",
                             city + "true\">a <", city + "true\">a</｜DSML", city + "true\">a</｜DSML｜", city + "true\">a</｜DSML｜par", city + "false\">\"Par", days + "3", fields + "[\"temp\", ",
                             days + "3</｜DSML｜parameter>", days + "3</｜DSML｜parameter>\n</｜DSML｜invoke>",
                             days + "3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n"});
  const auto bounded_tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "set", "parameters":
      {"type": "object", "properties": {"code": {"type": "string", "minLength": 4, "maxLength": 10}, "tag": {"type": "string",
      "pattern": "^[a-z <]*$"}}, "required": ["code"]}}}])");
  const ToolCallGrammar bounded(bounded_tools, false);
  const std::string code = open + "set\">\n<｜DSML｜parameter name=\"code\" string=\"";
  const std::string tag = code + "true\">abcd</｜DSML｜parameter>\n<｜DSML｜parameter name=\"tag\" string=\"false\">\"";
  check_masks<ToolCallMode>(tok, bounded, ToolCallPrefix(bounded),
                            {code + "true\">", code + "true\">ab", code + "true\">abcdefg", code + "true\">ab</", code + "true\">abcdefg</｜D",
                             code + "false\">\"abcdefg", tag, tag + "a few words", tag + "a <b", tag + "ab\""});
  const ToolCallGrammar thinking(tools, false, true);
  check_masks<ToolCallMode>(tok, thinking, ToolCallPrefix(thinking),
                            {"", "Let me see", "Let me see\n\n\n" + std::string(40, ' '), "a <", "a </thi", "a <thi", "a <think", "a </think", "a ｜DS", "a</think>",
                             "a</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_t"});
}

// A schema's patterned strings: every byte goes through the automaton (no token is taken
// whole inside them; tokens that hold part of a character are tried against each state), an
// escape under way, lengths at their edge. Patterns that most tokens go on in (the pattern's
// vocabulary decides them) and few do (they are fed), a length bound a few characters away.
TEST(JsonMode, PatternedStringsMaskEveryTokenTheRecognizerTakes) {
  const Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {"zip": {"type": "string",
      "pattern": "^\\d{5}(-\\d{4})?$"}, "word": {"type": "string", "pattern": "^[a-z\u00e9 ]+$", "maxLength": 8},
      "any": {"type": "string", "pattern": "x", "minLength": 3}, "free": {"type": "string", "pattern": "^[^\"]{0,12}$"},
      "han": {"type": "string", "pattern": "^([\u4e00-\u9fff]|[a-z]{2})+$"}}})");
  const JsonSchema compiled(schema);
  check_masks(tok, compiled, JsonSchemaPrefix(compiled),
              {"{\"zip\": \"", "{\"zip\": \"123", "{\"zip\": \"12345", "{\"zip\": \"12345-67", "{\"word\": \"caf", "{\"word\": \"café",
               "{\"word\": \"abc \\u00", "{\"word\": \"abcdefg", "{\"any\": \"", "{\"any\": \"ab\\", "{\"any\": \"x", "{\"free\": \"",
               "{\"free\": \"The quick", "{\"free\": \"The quick br", "{\"free\": \"naïve \\u00e9 ", "{\"han\": \"", "{\"han\": \"中文a",
               "{\"word\": \"ab", "{\"word\": \"ab\", \"free\": \"x"});
}

// A regex (vLLM's guided_regex): the whole reply matches; a match others go on from (complete,
// not closed), one nothing goes on from (closed), characters of several bytes.
TEST(RegexMode, MaskIsEveryTokenTheRecognizerTakes) {
  const Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  const Regex re("(yes|no)( [0-9]{1,3})?|[\u4e00-\u9fff]{2}", Regex::Match::Whole);
  check_masks<RegexMode>(tok, re, RegexPrefix(re), {"", "y", "yes", "yes ", "yes 12", "yes 123", "no", "中", "中文"});
  // Most tokens go on: the pattern's vocabulary decides them, every byte included.
  const Regex line("[^\\n]{0,24}\\n(ok|fail)", Regex::Match::Whole);
  check_masks<RegexMode>(tok, line, RegexPrefix(line), {"", "Hello \"world\"", "naïve {\"a\": 1}  ", "Twenty-one characters", "abc\n", "abc\nfa"});
}

// A choice (vLLM's guided_choice): a prefix of several, one that others go on from (complete,
// not closed), a character split across tokens.
TEST(ChoiceMode, MaskIsEveryTokenTheRecognizerTakes) {
  const Tokenizer tok = Tokenizer::from_dir(test::tokenizer_dir());
  const ChoiceGrammar choices({"positive", "pos", "negative", "neutral", "😀 yes"});
  check_masks<ChoiceMode>(tok, choices, ChoicePrefix(choices), {"", "p", "pos", "posi", "ne", "neu", "😀"});
}

}  // namespace
