#include "sampling/pattern_vocab.h"

#include <algorithm>
#include <unordered_map>

namespace dsa {

namespace {
constexpr uint32_t kNone = UINT32_MAX;
}

// The trie as it grows (children as sibling lists: a pattern tells few letters apart), then
// laid out in preorder.
struct PatternVocab::Builder {
  PatternVocab& v;
  struct Temp {
    uint32_t letter;
    bool tail;
    uint32_t parent, child = kNone, sibling = kNone, ids = kNone;  // ids: a list through next_id
  };
  std::vector<Temp> temp{Temp{0, false, kNone}};  // [0]: the root; a node comes after its parent
  std::vector<uint32_t> next_id;           // by token id: the next token of the same node
  std::unordered_map<Regex::Set, uint32_t> letter_of;
  // By code point, filled at first sight (kUnknown before): a table for the basic plane, where
  // nearly all of a vocabulary's characters are, a map past it.
  static constexpr uint32_t kUnknown = kNone - 1;
  std::vector<uint32_t> bmp = std::vector<uint32_t>(0x10000, kUnknown);
  std::unordered_map<char32_t, uint32_t> astral;

  explicit Builder(PatternVocab& pv) : v(pv) {}
  // A letter per distinct set of positions; none takes it: kNone (the token is refused).
  uint32_t letter(const Regex::Set& takers) {
    if (takers.none()) return kNone;
    auto [it, fresh] = letter_of.try_emplace(takers, uint32_t(v.takers_.size()));
    if (fresh) v.takers_.push_back(takers);
    return it->second;
  }
  uint32_t letter(char32_t c) {
    uint32_t& l = c < 0x10000 ? bmp[c] : astral.try_emplace(c, kUnknown).first->second;
    if (l == kUnknown) l = letter(v.re_.takers(c));
    return l;
  }
  // The token's letters from a character boundary, a tail's last; false: refused from any state.
  bool letters(std::string_view bytes, std::vector<std::pair<uint32_t, bool>>& out) {
    out.clear();
    Utf8Decoder d;
    char32_t cp = 0, lo = 0, hi = 0;
    for (unsigned char b : bytes) {
      const int r = d.feed(b, cp, lo, hi);
      if (r < 0) return false;
      if (r > 0) {
        const uint32_t l = letter(cp);
        if (l == kNone) return false;
        out.emplace_back(l, false);
      }
    }
    if (d.idle()) return true;
    const uint32_t l = letter(v.re_.takers(lo, hi));
    if (l != kNone) out.emplace_back(l, true);
    return l != kNone;
  }
  void insert(int32_t id, const std::vector<std::pair<uint32_t, bool>>& seq) {
    uint32_t at = 0;
    for (const auto& [l, tail] : seq) {
      uint32_t c = temp[at].child;
      while (c != kNone && (temp[c].letter != l || temp[c].tail != tail)) c = temp[c].sibling;
      if (c == kNone) {
        c = uint32_t(temp.size());
        temp.push_back(Temp{l, tail, at, kNone, temp[at].child});
        temp[at].child = c;
      }
      at = c;
    }
    next_id[size_t(id)] = temp[at].ids;
    temp[at].ids = uint32_t(id);
  }
  // Preorder with an explicit stack (a token may be long), each node's subtree size counted
  // first: a node's end is its index plus that size.
  void lay_out() {
    std::vector<uint32_t> size(temp.size(), 1);
    for (size_t t = temp.size(); t-- > 1;) size[temp[t].parent] += size[t];
    std::vector<std::pair<uint32_t, uint32_t>> stack;  // (node, depth)
    for (uint32_t c = temp[0].child; c != kNone; c = temp[c].sibling) stack.emplace_back(c, 1);
    while (!stack.empty()) {
      const auto [t, depth] = stack.back();
      stack.pop_back();
      v.nodes_.push_back(Node{temp[t].letter, uint32_t(v.nodes_.size()) + size[t], depth, temp[t].tail});
      v.ids_at_.push_back(uint32_t(v.ids_.size()));
      for (uint32_t id = temp[t].ids; id != kNone; id = next_id[id]) v.ids_.push_back(int32_t(id));
      for (uint32_t c = temp[t].child; c != kNone; c = temp[c].sibling) stack.emplace_back(c, depth + 1);
    }
  }
};

PatternVocab::PatternVocab(const Regex& re, size_t n, const std::function<bool(size_t)>& decides,
                           const std::function<std::string_view(size_t)>& bytes)
    : re_(re) {
  Builder b(*this);
  b.next_id.assign(n, kNone);
  std::vector<std::pair<uint32_t, bool>> seq;
  for (size_t id = 0; id < n; ++id)
    if (decides(id) && !bytes(id).empty() && b.letters(bytes(id), seq)) b.insert(int32_t(id), seq);
  b.lay_out();
  ids_at_.push_back(uint32_t(ids_.size()));
  uint32_t depth = 0;
  for (const Node& n : nodes_) depth = std::max(depth, n.depth);
  cand_.resize(size_t(depth) + 1);
}

void PatternVocab::allow(const Regex::Set& s, uint32_t count, uint8_t* allowed) {
  cand_[0] = re_.next_of(s, count);
  for (size_t i = 0; i < nodes_.size();) {
    const Node& n = nodes_[i];
    const Regex::Set got = cand_[n.depth - 1] & takers_[n.letter];
    if (got.none()) {
      i = n.end;  // refused here: so is every token below
      continue;
    }
    for (uint32_t k = ids_at_[i]; k < ids_at_[i + 1]; ++k) allowed[ids_[k]] = 1;
    if (!n.tail && n.end > i + 1) cand_[n.depth] = re_.next_of(got, count + n.depth);
    ++i;
  }
}

}  // namespace dsa
