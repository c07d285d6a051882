#pragma once
// A small byte-level BPE tokenizer generated from scratch, so that random-weight models
// from `dsa make-model` can be run on text: tokenizer.json + tokenizer_config.json.
//
// Layout of the ids: DeepSeek-style special tokens first (<｜begin▁of▁sentence｜> = 0,
// <｜end▁of▁sentence｜> = 1, matching the presets' bos/eos ids, then the DeepSeek-V3.2 and
// GLM-5 chat tokens), then the 256 byte tokens, then BPE merges learned here from a short
// built-in English text until the vocabulary is full. Deterministic: the same vocab_size
// always gives the same file.
#include <string>

namespace dsa {

// Writes dir/tokenizer.json and dir/tokenizer_config.json for a model whose
// vocab_size is `vocab_size` (every id below it is a valid token). Throws dsa::Error if
// vocab_size cannot hold the special and byte tokens.
void write_synthetic_tokenizer(const std::string& dir, int vocab_size);

}  // namespace dsa
