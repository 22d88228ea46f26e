// A plan rule's regex: a recursive-descent parser of the documented subset (its depth
// bounded by the group limit, never by the name), a compiler to NFA instructions, and a
// Thompson simulation over the name with an explicit stack (docs/loading.md, "Regex rules").
// Pattern and name are UTF-8 and match by character: a non-ASCII character compiles to its
// byte sequence, `.` and negated classes to "any ASCII byte of the set, or any multi-byte
// character", so the automaton still reads bytes and stays linear in the name.
#include "checkpoint/plan_regex.h"

#include <cctype>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace pinstage::detail {

namespace {

constexpr int kMaxDepth = 100;          // nested groups
constexpr int kMaxRepeat = 1000;        // the largest count in {n,m}
constexpr size_t kMaxProgram = 100000;  // instructions, counted repeats expanded

using ByteSet = std::bitset<256>;

struct Node {
  enum Kind { bytes, concat, alternate, repeat, begin, end } kind = concat;
  ByteSet set;             // bytes
  std::vector<Node> kids;  // concat, alternate; repeat: one
  int min = 0, max = 0;    // repeat; max -1 is unbounded
};

ByteSet byte_range(int lo, int hi) {
  ByteSet s;
  for (int c = lo; c <= hi; ++c) s.set(static_cast<size_t>(c));
  return s;
}
ByteSet one(unsigned char c) { return byte_range(c, c); }
ByteSet digits() { return byte_range('0', '9'); }
ByteSet word() { return byte_range('a', 'z') | byte_range('A', 'Z') | digits() | one('_'); }
ByteSet space() { return byte_range('\t', '\r') | one(' '); }

Node leaf(Node::Kind kind, ByteSet set = {}) {
  Node n;
  n.kind = kind;
  n.set = set;
  return n;
}

ByteSet ascii() { return byte_range(0, 0x7f); }

// The bytes of one character, in order.
Node sequence(std::string_view bytes) {
  if (bytes.size() == 1) return leaf(Node::bytes, one(static_cast<unsigned char>(bytes[0])));
  Node cat = leaf(Node::concat);
  for (char b : bytes) cat.kids.push_back(leaf(Node::bytes, one(static_cast<unsigned char>(b))));
  return cat;
}

// Any character of two, three or four bytes (the lead byte says how many follow).
Node any_multibyte() {
  const ByteSet next = byte_range(0x80, 0xbf);
  Node alt = leaf(Node::alternate);
  for (const auto& [lo, hi, follow] :
       {std::tuple{0xc2, 0xdf, 1}, {0xe0, 0xef, 2}, {0xf0, 0xf4, 3}}) {
    Node cat = leaf(Node::concat);
    cat.kids.push_back(leaf(Node::bytes, byte_range(lo, hi)));
    for (int k = 0; k < follow; ++k) cat.kids.push_back(leaf(Node::bytes, next));
    alt.kids.push_back(std::move(cat));
  }
  return alt;
}

// A set of characters: ASCII ones as bytes, plus every multi-byte character or a list of
// them (each as its UTF-8 bytes).
struct CharSet {
  ByteSet bytes;
  bool multibyte = false;
  std::vector<std::string> chars;

  CharSet& operator|=(const CharSet& o) {
    bytes |= o.bytes;
    multibyte = multibyte || o.multibyte;
    chars.insert(chars.end(), o.chars.begin(), o.chars.end());
    return *this;
  }
};

CharSet ascii_set(ByteSet bytes) { return {bytes & ascii(), false, {}}; }
// The complement of an ASCII class (\D, \W, \S): the other ASCII bytes and every
// multi-byte character.
CharSet all_but(ByteSet bytes) { return {ascii() & ~bytes, true, {}}; }

Node set_node(const CharSet& s) {
  Node alt = leaf(Node::alternate);
  if (s.bytes.any() || (!s.multibyte && s.chars.empty()))
    alt.kids.push_back(leaf(Node::bytes, s.bytes));
  if (s.multibyte) alt.kids.push_back(any_multibyte());
  for (const std::string& c : s.chars) alt.kids.push_back(sequence(c));
  if (alt.kids.size() == 1) return std::move(alt.kids.front());
  return alt;
}

// The length of the well-formed UTF-8 character at text[i] (RFC 3629: no overlong forms,
// surrogates or code points past U+10FFFF), or 0.
size_t utf8_length(std::string_view text, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = at(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c >= 0xe0 && c <= 0xef)
    n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  if (n == 0 || i + n > text.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (at(i + k) < 0x80 || at(i + k) > 0xbf) return 0;
  return n;
}

// U+0080..U+00FF (\xHH past ASCII) as UTF-8.
std::string latin1(int value) {
  return {static_cast<char>(0xc0 | (value >> 6)), static_cast<char>(0x80 | (value & 0x3f))};
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Node parse() {
    for (size_t i = 0; i < p_.size();) {
      const size_t n = utf8_length(p_, i);
      if (n == 0)
        bad(i, "a byte that is not UTF-8 (a pattern is UTF-8 text, matched by character)");
      i += n;
    }
    Node n = alternation(0);
    if (more()) bad(i_, "a ')' with no '(' before it (write \\) for the character)");
    return n;
  }

 private:
  [[noreturn]] static void bad(size_t at, const std::string& why) {
    throw std::invalid_argument(why + " at offset " + std::to_string(at));
  }
  bool more() const { return i_ < p_.size(); }
  char peek() const { return p_[i_]; }

  Node alternation(int depth) {
    Node first = concatenation(depth);
    if (!more() || peek() != '|') return first;
    Node alt = leaf(Node::alternate);
    alt.kids.push_back(std::move(first));
    while (more() && peek() == '|') {
      ++i_;
      alt.kids.push_back(concatenation(depth));
    }
    return alt;
  }

  Node concatenation(int depth) {
    Node cat = leaf(Node::concat);
    while (more() && peek() != '|' && peek() != ')') cat.kids.push_back(repetition(depth));
    return cat;
  }

  Node repetition(int depth) {
    const size_t at = i_;
    Node a = atom(depth);
    int min = 0, max = 0;
    if (!quantifier(min, max)) return a;
    if (a.kind == Node::begin || a.kind == Node::end)
      bad(at, "an anchor ('^' or '$') with a quantifier");
    if (more() && peek() == '?') ++i_;  // lazy: the same whole-name matches
    Node r = leaf(Node::repeat);
    r.min = min;
    r.max = max;
    r.kids.push_back(std::move(a));
    return r;
  }

  bool quantifier(int& min, int& max) {
    if (!more()) return false;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++i_;
      min = c == '+' ? 1 : 0;
      max = c == '?' ? 1 : -1;
      return true;
    }
    if (c != '{') return false;
    const size_t at = i_++;
    min = max = count(at);
    if (more() && peek() == ',') {
      ++i_;
      max = more() && peek() == '}' ? -1 : count(at);
    }
    if (!more() || peek() != '}') not_a_quantifier(at);
    ++i_;
    if (max >= 0 && max < min) bad(at, "a quantifier {n,m} with m < n");
    return true;
  }

  [[noreturn]] static void not_a_quantifier(size_t at) {
    bad(at, "a '{' that is not a quantifier {n}, {n,} or {n,m} (write \\{ for the character)");
  }

  int count(size_t at) {
    const size_t start = i_;
    int v = 0;
    while (more() && std::isdigit(static_cast<unsigned char>(peek()))) {
      v = v * 10 + (peek() - '0');
      ++i_;
      if (v > kMaxRepeat) bad(at, "a repeat count over " + std::to_string(kMaxRepeat));
    }
    if (i_ == start) not_a_quantifier(at);
    return v;
  }

  Node atom(int depth) {
    const size_t at = i_;
    const char c = p_[i_++];
    switch (c) {
      case '*':
      case '+':
      case '?':
      case '{':
        bad(at, std::string("'") + c + "' with nothing before it to repeat");
      case '}':
      case ']':
        bad(at, std::string("a lone '") + c + "' (write \\" + c + " for the character)");
      case '.':
        return set_node(all_but(one('\n') | one('\r')));
      case '^':
        return leaf(Node::begin);
      case '$':
        return leaf(Node::end);
      case '[':
        return set_node(char_class(at));
      case '\\':
        return set_node(escape(at, false));
      case '(':
        return group(at, depth);
      default:
        i_ = at + utf8_length(p_, at);  // a character of one to four bytes
        return sequence(p_.substr(at, i_ - at));
    }
  }

  Node group(size_t at, int depth) {
    if (depth >= kMaxDepth) bad(at, "groups nested over " + std::to_string(kMaxDepth) + " deep");
    if (more() && peek() == '?') {
      if (i_ + 1 >= p_.size() || p_[i_ + 1] != ':')
        bad(at, "'(?' other than '(?:' (lookaround and named groups are not supported)");
      i_ += 2;
    }
    Node inner = alternation(depth + 1);
    if (!more()) bad(at, "a '(' that is never closed");
    ++i_;
    return inner;
  }

  int hex_digit(size_t at) {
    const char c = more() ? peek() : '\0';
    if (!std::isxdigit(static_cast<unsigned char>(c))) bad(at, "'\\x' without two hex digits");
    ++i_;
    return std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10);
  }

  CharSet escape(size_t at, bool in_class) {
    if (!more()) bad(at, "a '\\' at the end");
    const size_t from = i_;
    const char c = p_[i_++];
    // \d \w \s and their complements \D \W \S; then the control escapes.
    const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == 'd' || lower == 'w' || lower == 's') {
      const ByteSet set = lower == 'd' ? digits() : lower == 'w' ? word() : space();
      return c == lower ? ascii_set(set) : all_but(set);
    }
    for (const auto& [letter, byte] :
         {std::pair{'t', '\t'}, {'n', '\n'}, {'r', '\r'}, {'f', '\f'}, {'v', '\v'}})
      if (c == letter) return ascii_set(one(byte));
    if (c == 'x') {  // U+00HH, as ECMAScript reads it: past ASCII, two bytes of UTF-8
      const int hi = hex_digit(at);
      const int value = hi * 16 + hex_digit(at);
      return value < 0x80 ? ascii_set(one(static_cast<unsigned char>(value)))
                          : CharSet{{}, false, {latin1(value)}};
    }
    if (static_cast<unsigned char>(c) >= 0x80) {  // an escaped character stands for itself
      i_ = from + utf8_length(p_, from);
      return {{}, false, {std::string(p_.substr(from, i_ - from))}};
    }
    if (c == '0' && !(more() && std::isdigit(static_cast<unsigned char>(peek()))))
      return ascii_set(one(0));
    if (c == 'b' && in_class) return ascii_set(one('\b'));
    if (std::isdigit(static_cast<unsigned char>(c)))
      bad(at, "a backreference '\\" + std::string(1, c) + "' (not supported)");
    if (c == 'b' || c == 'B')
      bad(at, "a word boundary '\\" + std::string(1, c) + "' (not supported)");
    if (std::isalnum(static_cast<unsigned char>(c)))
      bad(at, "an unknown escape '\\" + std::string(1, c) + "'");
    return ascii_set(one(static_cast<unsigned char>(c)));  // escaped punctuation
  }

  // One item of a class: its set, and its character's bytes when it is one character
  // ("" for a class escape such as \d).
  struct Item {
    CharSet set;
    std::string character;
  };

  Item class_item(size_t at) {
    if (peek() != '\\') {
      const size_t n = utf8_length(p_, i_);
      std::string character(p_.substr(i_, n));
      i_ += n;
      if (n > 1) return {{{}, false, {character}}, character};
      return {ascii_set(one(static_cast<unsigned char>(character[0]))), character};
    }
    ++i_;
    Item item{escape(at, true), ""};
    const CharSet& s = item.set;
    if (!s.multibyte && s.chars.empty() && s.bytes.count() == 1)
      for (int c = 0; c < 0x80; ++c)
        if (s.bytes.test(static_cast<size_t>(c)))
          item.character = std::string(1, static_cast<char>(c));
    if (!s.multibyte && s.bytes.none() && s.chars.size() == 1) item.character = s.chars.front();
    return item;
  }

  CharSet char_class(size_t at) {
    const bool negate = more() && peek() == '^';
    if (negate) ++i_;
    CharSet set;
    for (;;) {
      if (!more()) bad(at, "a '[' that is never closed");
      if (peek() == ']') break;
      const Item lo = class_item(at);
      if (i_ + 1 < p_.size() && peek() == '-' && p_[i_ + 1] != ']') {
        ++i_;
        const Item hi = class_item(at);
        if (lo.character.empty() || hi.character.empty())
          bad(at, "a range in '[...]' with a class such as \\d at an end");
        if (lo.character.size() > 1 || hi.character.size() > 1)
          bad(at, "a range in '[...]' with a non-ASCII end (not supported: list its characters)");
        const auto a = static_cast<unsigned char>(lo.character[0]);
        const auto b = static_cast<unsigned char>(hi.character[0]);
        if (b < a) bad(at, "a range in '[...]' out of order");
        set.bytes |= byte_range(a, b);
      } else {
        set |= lo.set;
      }
    }
    ++i_;
    if (!negate) return set;
    if (!set.chars.empty())
      bad(at, "a negated class '[^...]' with a non-ASCII character (not supported)");
    return {ascii() & ~set.bytes, !set.multibyte, {}};
  }

  std::string_view p_;
  size_t i_ = 0;
};

using Op = PlanRegex::Op;
using Inst = PlanRegex::Inst;

class Compiler {
 public:
  Compiler(std::vector<Inst>& prog, std::vector<ByteSet>& sets) : prog_(prog), sets_(sets) {}

  void node(const Node& n) {
    switch (n.kind) {
      case Node::bytes:
        sets_.push_back(n.set);
        emit(Op::byte, static_cast<int>(sets_.size() - 1));
        return;
      case Node::begin:
        emit(Op::begin);
        return;
      case Node::end:
        emit(Op::end);
        return;
      case Node::concat:
        for (const Node& k : n.kids) node(k);
        return;
      case Node::alternate:
        alternate(n);
        return;
      case Node::repeat:
        repeat(n);
        return;
    }
  }

  int emit(Op op, int x = 0) {
    if (prog_.size() >= kMaxProgram)
      throw std::invalid_argument("it compiles to over " + std::to_string(kMaxProgram) +
                                  " steps (use smaller repeat counts)");
    prog_.push_back({op, x, 0});
    return static_cast<int>(prog_.size() - 1);
  }

 private:
  int here() const { return static_cast<int>(prog_.size()); }

  // split(next, after): `kid` may be skipped.
  void optional(const Node& kid) {
    const int s = emit(Op::split, here() + 1);
    node(kid);
    prog_[static_cast<size_t>(s)].y = here();
  }

  void alternate(const Node& n) {
    std::vector<int> jumps;
    for (size_t k = 0; k + 1 < n.kids.size(); ++k) {
      const int s = emit(Op::split, here() + 1);
      node(n.kids[k]);
      jumps.push_back(emit(Op::jump));
      prog_[static_cast<size_t>(s)].y = here();
    }
    node(n.kids.back());
    for (int j : jumps) prog_[static_cast<size_t>(j)].x = here();
  }

  void repeat(const Node& n) {
    const Node& kid = n.kids.front();
    for (int i = 0; i < n.min; ++i) node(kid);
    if (n.max >= 0) {
      for (int i = n.min; i < n.max; ++i) optional(kid);
      return;
    }
    const int s = here();
    optional(kid);
    emit(Op::jump, s);
    prog_[static_cast<size_t>(s)].y = here();  // past the jump back
  }

  std::vector<Inst>& prog_;
  std::vector<ByteSet>& sets_;
};

}  // namespace

PlanRegex::PlanRegex(std::string_view pattern) {
  const Node root = Parser(pattern).parse();
  Compiler compiler(prog_, sets_);
  compiler.node(root);
  compiler.emit(Op::match);
}

bool PlanRegex::full_match(std::string_view text) const {
  std::vector<int> cur, next, stack;
  std::vector<size_t> seen(prog_.size(), SIZE_MAX);  // the position a pc was last added at
  // Adds pc and what it reaches without reading a byte, at text position pos.
  auto add = [&](std::vector<int>& list, int start, size_t pos) {
    stack.push_back(start);
    while (!stack.empty()) {
      const int pc = stack.back();
      stack.pop_back();
      if (seen[static_cast<size_t>(pc)] == pos) continue;
      seen[static_cast<size_t>(pc)] = pos;
      const Inst& in = prog_[static_cast<size_t>(pc)];
      if (in.op == Op::jump) {
        stack.push_back(in.x);
      } else if (in.op == Op::split) {
        stack.push_back(in.y);
        stack.push_back(in.x);
      } else if (in.op == Op::begin || in.op == Op::end) {
        if (pos == (in.op == Op::begin ? 0 : text.size())) stack.push_back(pc + 1);
      } else {
        list.push_back(pc);
      }
    }
  };
  add(cur, 0, 0);
  for (size_t pos = 0; pos < text.size() && !cur.empty(); ++pos) {
    next.clear();
    const auto c = static_cast<unsigned char>(text[pos]);
    for (int pc : cur) {
      const Inst& in = prog_[static_cast<size_t>(pc)];
      if (in.op == Op::byte && sets_[static_cast<size_t>(in.x)].test(c)) add(next, pc + 1, pos + 1);
    }
    std::swap(cur, next);
  }
  for (int pc : cur)
    if (prog_[static_cast<size_t>(pc)].op == Op::match) return true;
  return false;
}

}  // namespace pinstage::detail
