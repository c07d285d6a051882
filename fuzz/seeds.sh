#!/usr/bin/env bash
# Builds the seed corpora of the fuzz targets at run time, from the shared fixtures and the
# project's own presets, into BUILD/fuzz-seeds/<target>/ (never into the repository).
#
#   fuzz/seeds.sh BUILD [SHARED]
#
# BUILD is the DSA_FUZZ=ON build folder (its fuzz/dsa_fuzz_seeds does the JSON work).
# SHARED defaults to $DSA_SHARED_DIR, else ../shared beside the checkout; it needs
# golden/ (checkpoints) and tokenizer/ (jsonl fixtures). A missing fixture only means fewer
# seeds: every target also gets hand-made ones.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
build="${1:?usage: fuzz/seeds.sh BUILD [SHARED]}"
shared="${2:-${DSA_SHARED_DIR:-$here/../../shared}}"
tool="$build/fuzz/dsa_fuzz_seeds"
[ -x "$tool" ] || { echo "seeds.sh: $tool not built (cmake --build $build --target fuzz)" >&2; exit 1; }
out="$build/fuzz-seeds"
rm -rf "$out"
for t in safetensors safetensors_index config tokenizer tokenizer_deepseek dsv32_parser dsv32_encoding glm5_template json_schema tool_calls regex; do
  mkdir -p "$out/fuzz_$t"
done
[ -d "$shared" ] || echo "seeds.sh: no shared fixtures at $shared (set DSA_SHARED_DIR); hand-made seeds only" >&2

# safetensors: every golden file (checkpoints, expected outputs, the ops fixture) cut to
# its header and shrunk to a small valid image; their tensor names make index seeds.
n=0
if [ -d "$shared/golden" ]; then
  while IFS= read -r f; do
    "$tool" safetensors "$f" "golden$n" "$out/fuzz_safetensors" "$out/fuzz_safetensors_index" >/dev/null
    n=$((n + 1))
  done < <(find "$shared/golden" -name '*.safetensors' | sort)
fi
# A minimal valid file and an empty header, written by hand.
hdr='{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}}'
printf "$(printf '\\x%02x' ${#hdr})\0\0\0\0\0\0\0%s\1\2\3\4\5\6\7\10" "$hdr" > "$out/fuzz_safetensors/hand-f32"
printf '\2\0\0\0\0\0\0\0{}' > "$out/fuzz_safetensors/hand-empty"

# Index seeds naming the fuzz target's own scratch shards (shard1: a, b; shard2: c; shard3: a).
idx="$out/fuzz_safetensors_index"
printf '%s' '{"metadata":{"total_size":24},"weight_map":{"a":"shard1.safetensors","b":"shard1.safetensors","c":"shard2.safetensors"}}' > "$idx/hand-ok"
printf '%s' '{"weight_map":{"a":"shard3.safetensors"}}' > "$idx/hand-ok2"
printf '%s' '{"weight_map":{"a":"shard1.safetensors","c":"shard3.safetensors"}}' > "$idx/hand-dup"
printf '%s' '{"weight_map":{"x":"shard2.safetensors"}}' > "$idx/hand-missing"

# config.json: the golden checkpoints' and every make-model preset's.
if [ -d "$shared/golden" ]; then
  n=0
  while IFS= read -r f; do cp "$f" "$out/fuzz_config/golden$n.json"; n=$((n + 1)); done \
    < <(find "$shared/golden" -name config.json | sort)
fi
"$tool" configs "$out/fuzz_config" >/dev/null

# tokenizer.json: small hand-made files (every pre-tokenizer kind, added-token flags).
"$tool" tokenizers "$out/fuzz_tokenizer" >/dev/null

tok="$shared/tokenizer"
if [ -d "$tok" ]; then
  # Texts for the real tokenizer: the golden cases and the rendered chat prompts.
  [ -f "$tok/golden.jsonl" ] && "$tool" jsonl-field "$tok/golden.jsonl" text "$out/fuzz_tokenizer_deepseek" >/dev/null
  [ -f "$tok/chat_examples.jsonl" ] && "$tool" jsonl-field "$tok/chat_examples.jsonl" prompt "$out/fuzz_tokenizer_deepseek" >/dev/null
  [ -f "$tok/glm5_chat_examples.jsonl" ] && "$tool" jsonl-field "$tok/glm5_chat_examples.jsonl" prompt "$out/fuzz_tokenizer_deepseek" >/dev/null
  # Requests for the chat renderers, cut down to what the targets read.
  if [ -f "$tok/chat_examples.jsonl" ]; then
    "$tool" jsonl-keys "$tok/chat_examples.jsonl" messages,encode_args "$out/fuzz_dsv32_encoding" >/dev/null
    "$tool" completions "$tok/chat_examples.jsonl" "$out/fuzz_dsv32_parser" >/dev/null
  fi
  [ -f "$tok/glm5_chat_examples.jsonl" ] && "$tool" jsonl-keys "$tok/glm5_chat_examples.jsonl" \
    messages,tools,add_generation_prompt,enable_thinking,template_kwargs "$out/fuzz_glm5_template" >/dev/null
fi
printf '%s' 'hello world, 12345 世界 <｜end▁of▁sentence｜>' > "$out/fuzz_tokenizer_deepseek/hand-0"

# Completions by hand: fuzz_dsv32_parser's layout is flags (bit 0: thinking), the count of
# chunk sizes, the sizes, then the text.
p="$out/fuzz_dsv32_parser"
printf '\1\0%s' 'why</think>The answer.<｜end▁of▁sentence｜>' > "$p/hand-think"
printf '\0\1\3%s' $'Calling.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="x" string="true">1</｜DSML｜parameter>\n<｜DSML｜parameter name="y" string="false">[2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>' > "$p/hand-tools"
printf '\0\2\1\5%s' 'no eos here' > "$p/hand-noeos"

# Chat requests by hand.
printf '%s' '{"messages":[{"role":"system","content":"s","tools":[{"type":"function","function":{"name":"f","parameters":{}}}]},{"role":"user","content":"hi"},{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}]},{"role":"tool","content":"r"}],"encode_args":{"thinking_mode":"thinking"}}' > "$out/fuzz_dsv32_encoding/hand-0"
printf '%s' '{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":"<think>r</think>a","tool_calls":[{"function":{"name":"f","arguments":{"k":[1]}}}]},{"role":"tool","content":[{"output":"o"}]}],"tools":[{"name":"f"}],"template_kwargs":{"clear_thinking":false}}' > "$out/fuzz_glm5_template/hand-0"

# Schemas by hand (schema, NUL, a reply): the shapes OpenAI's strict mode and pydantic emit.
j="$out/fuzz_json_schema"
printf '%s\0%s' '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","ab",1,12]},"minItems":1,"maxItems":3}},"required":["name"],"additionalProperties":false}' '{"name": "x\"y", "age": -12, "tags": ["ab", 12]}' > "$j/hand-object"
printf '%s\0%s' '{"$defs":{"N":{"type":"object","properties":{"v":{"anyOf":[{"type":"number"},{"type":"null"}]},"kids":{"type":"array","items":{"$ref":"#/$defs/N"}}},"required":["v"]}},"$ref":"#/$defs/N"}' '{"v": 1.5, "kids": [{"v": null}]}' > "$j/hand-recursive"
printf '%s\0%s' '{"anyOf":[{"type":"object","additionalProperties":{"type":"boolean"}},{"const":[1,{"k":"v"}]},{"type":["string","integer"]}]}' '[1, {"k": "v"}]' > "$j/hand-alternatives"
printf '%s\0%s' '{"type":"object"}' '{"a": [1, {"b": null}], "c": "\u00e9"}' > "$j/hand-any"
printf '%s\0%s' '{"type":"object","properties":{"code":{"type":"string","minLength":2,"maxLength":4},"n":{"type":"integer","minimum":-15,"exclusiveMaximum":120},"big":{"type":"integer","minimum":9223372036854775800}},"required":["code","n"]}' '{"code": "a\u00e9\n", "n": -15, "big": 9223372036854775807}' > "$j/hand-bounds"
printf '%s\0%s' '{"type":"object","properties":{"zip":{"type":"string","pattern":"^\\d{5}$"},"w":{"type":"string","pattern":"\u00e9","maxLength":5}}}' '{"zip": "12345", "w": "\u00e9t\u00e9"}' > "$j/hand-pattern"

# Tool lists by hand (tools, NUL, a reply): a block the encoder writes, one that stops short,
# and one after reasoning.
j="$out/fuzz_tool_calls"
w='{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"unit":{"anyOf":[{"enum":["c","f"]},{"type":"null"}]},"fields":{"type":"array","items":{"enum":["temp","wind"]}}},"required":["city"]}}}'
n='{"type":"function","function":{"name":"now"}}'
printf '%s\0%s' "[$w,$n]" $'\n\n<\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>\n<\xef\xbd\x9cDSML\xef\xbd\x9cinvoke name="get_weather">\n<\xef\xbd\x9cDSML\xef\xbd\x9cparameter name="city" string="true">Paris</\xef\xbd\x9cDSML\xef\xbd\x9cparameter>\n<\xef\xbd\x9cDSML\xef\xbd\x9cparameter name="unit" string="true">c</\xef\xbd\x9cDSML\xef\xbd\x9cparameter>\n<\xef\xbd\x9cDSML\xef\xbd\x9cparameter name="fields" string="false">["temp", "wind"]</\xef\xbd\x9cDSML\xef\xbd\x9cparameter>\n</\xef\xbd\x9cDSML\xef\xbd\x9cinvoke>\n<\xef\xbd\x9cDSML\xef\xbd\x9cinvoke name="now">\n\n</\xef\xbd\x9cDSML\xef\xbd\x9cinvoke>\n</\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>' > "$j/hand-two-calls"
printf '%s\0%s' "[$w]" $'\n\n<\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>\n<\xef\xbd\x9cDSML\xef\xbd\x9cinvoke name="get_weather">\n<\xef\xbd\x9cDSML\xef\xbd\x9cparameter name="days" string="false">3' > "$j/hand-cut"
strict_tool='{"type":"function","function":{"name":"pick","strict":true,"parameters":{"type":"object","properties":{"k":{"type":"string","maxLength":3}}}}}'
printf '%s\0%s' "[$strict_tool]" $'\n\n<\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>\n<\xef\xbd\x9cDSML\xef\xbd\x9cinvoke name="pick">\n<\xef\xbd\x9cDSML\xef\xbd\x9cparameter name="k" string="true">a</\xef\xbd\x9cDSML\xef\xbd\x9cparameter>\n</\xef\xbd\x9cDSML\xef\xbd\x9cinvoke>\n</\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>' > "$j/hand-strict"
pin_tool='{"type":"function","function":{"name":"pin","parameters":{"type":"object","properties":{"p":{"type":"string","minLength":3,"maxLength":3},"n":{"type":"integer","minimum":1,"maximum":9}},"required":["p"]}}}'
printf '%s\0%s' "[$pin_tool]" $'\n\n<\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>\n<\xef\xbd\x9cDSML\xef\xbd\x9cinvoke name="pin">\n<\xef\xbd\x9cDSML\xef\xbd\x9cparameter name="p" string="true"></\xef\xbd\x9cD' > "$j/hand-exact-length"
printf '%s\0%s' "[$n]" $'Think <b> first.</think>\n\n<\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>\n<\xef\xbd\x9cDSML\xef\xbd\x9cinvoke name="now">\n\n</\xef\xbd\x9cDSML\xef\xbd\x9cinvoke>\n</\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>' > "$j/hand-thinking"

# Patterns by hand (options, two bound bytes, pattern, NUL, a reply): pydantic's anchored
# patterns, a search, a vLLM regex matched whole, bounds around a loop, a vocabulary.
j="$out/fuzz_regex"
printf '\0\0\0%s\0%s' '^\d{5}(-\d{4})?$' '12345-6789' > "$j/hand-zip"
printf '\0\0\0%s\0%s' '[^@\s]+@[^@\s]+\.\w{2,}' 'mail me at a@b.org' > "$j/hand-search"
printf '\1\0\0%s\0%s' '(yes|no), [0-9]{1,3} (?:apples|pears)!' 'yes, 12 pears!' > "$j/hand-whole"
printf '\7\3\10%s\0%s' '^(?<w>[a-z\u00e0-\u00ff]|\u{1F600})*$' $'caf\xc3\xa9\xf0\x9f\x98\x80' > "$j/hand-bounds"
# A vocabulary after the reply's first piece: whole characters, a tail inside one, a byte
# that starts none, a piece past the bound.
printf '\1\0\0%s\0%s' '^[a-z]{2}\u00e9( [a-z]+)?$' $'c\1\xc3\1a\xc3\1\xc3\xa9\1ab\1a\xc3\xa9 x\1\xa9\1' > "$j/hand-vocab"

for d in "$out"/*/; do printf '%-28s %4d seeds\n' "$(basename "$d")" "$(find "$d" -type f | wc -l)"; done
