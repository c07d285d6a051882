#pragma once
// The vocabulary as one pattern's automaton reads it, for masks inside a patterned string (a
// schema's "pattern") or a regex reply. Feeding every token to the automaton costs a step per
// character of the whole vocabulary at every draw. But the automaton tells code points apart
// only by the positions that take them, so tokens whose characters take the same positions in
// the same order (a "letter" sequence) are taken or refused together. Built once per pattern:
// each token becomes its letter sequence (a tail that ends inside a character becomes a last
// letter of its own: the positions some code point it may still become takes), and the
// sequences form a trie laid out in preorder. A mask walks the trie from the recognizer's
// state, stepping each letter once for every token that shares it and skipping a subtree at
// its first refused letter. Tokens that are not well-formed UTF-8 from a character boundary,
// or hold a character no position takes, are refused there and left out (empty ones too: no
// vocabulary's text is empty).
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "sampling/regex.h"

namespace dsa {

class PatternVocab {
public:
  // The tokens [0, n) for which `decides` holds (inside a JSON string, those free of quote,
  // backslash and control bytes, which take other paths; for a whole-reply regex, every text
  // token), `bytes` giving each one's bytes. `re` outlives this.
  PatternVocab(const Regex& re, size_t n, const std::function<bool(size_t)>& decides, const std::function<std::string_view(size_t)>& bytes);
  const Regex& regex() const { return re_; }
  // Sets allowed[id] to 1 for each token it decides the automaton takes whole from the state s
  // after `count` characters at a character boundary (a tail that ends inside a character:
  // some code point it may still become goes on); leaves the others as they are.
  void allow(const Regex::Set& s, uint32_t count, uint8_t* allowed);

private:
  struct Node {
    uint32_t letter;  // index into takers_
    uint32_t end;     // one past the last node of its subtree
    uint32_t depth;   // characters from the root (a tail counts as one)
    bool tail;        // a partial character: a leaf, tested, not stepped
  };
  const Regex& re_;
  std::vector<Regex::Set> takers_;  // by letter
  std::vector<Node> nodes_;         // preorder; the root is not stored
  std::vector<uint32_t> ids_at_;    // node i's tokens: ids_[ids_at_[i], ids_at_[i + 1])
  std::vector<int32_t> ids_;
  std::vector<Regex::Set> cand_;    // scratch, by depth: the parent's next_of
  struct Builder;
};

}  // namespace dsa
