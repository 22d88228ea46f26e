// A plan rule's regex: a recursive-descent parser of the documented subset (its depth
// bounded by the group limit, never by the name), a compiler to NFA instructions, and a
// Thompson simulation over the name with an explicit stack (docs/loading.md, "Regex rules").
#include "checkpoint/plan_regex.h"

#include <cctype>
#include <stdexcept>
#include <string>
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

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Node parse() {
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
        return leaf(Node::bytes, ~(one('\n') | one('\r')));
      case '^':
        return leaf(Node::begin);
      case '$':
        return leaf(Node::end);
      case '[':
        return leaf(Node::bytes, char_class(at));
      case '\\':
        return leaf(Node::bytes, escape(at, false));
      case '(':
        return group(at, depth);
      default:
        return leaf(Node::bytes, one(static_cast<unsigned char>(c)));
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

  ByteSet escape(size_t at, bool in_class) {
    if (!more()) bad(at, "a '\\' at the end");
    const char c = p_[i_++];
    switch (c) {
      case 'd':
        return digits();
      case 'D':
        return ~digits();
      case 'w':
        return word();
      case 'W':
        return ~word();
      case 's':
        return space();
      case 'S':
        return ~space();
      case 't':
        return one('\t');
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'x': {
        const int hi = hex_digit(at);
        return one(static_cast<unsigned char>(hi * 16 + hex_digit(at)));
      }
      default:
        break;
    }
    if (c == '0' && !(more() && std::isdigit(static_cast<unsigned char>(peek())))) return one(0);
    if (c == 'b' && in_class) return one('\b');
    if (std::isdigit(static_cast<unsigned char>(c)))
      bad(at, "a backreference '\\" + std::string(1, c) + "' (not supported)");
    if (c == 'b' || c == 'B')
      bad(at, "a word boundary '\\" + std::string(1, c) + "' (not supported)");
    if (std::isalnum(static_cast<unsigned char>(c)))
      bad(at, "an unknown escape '\\" + std::string(1, c) + "'");
    return one(static_cast<unsigned char>(c));  // escaped punctuation stands for itself
  }

  // One item of a class: its byte, or -1 for a class escape such as \d (set in `s`).
  int class_item(size_t at, ByteSet& s) {
    if (peek() != '\\') {
      const auto c = static_cast<unsigned char>(p_[i_++]);
      s = one(c);
      return c;
    }
    ++i_;
    s = escape(at, true);
    if (s.count() != 1) return -1;
    for (int c = 0; c < 256; ++c)
      if (s.test(static_cast<size_t>(c))) return c;
    return -1;
  }

  ByteSet char_class(size_t at) {
    const bool negate = more() && peek() == '^';
    if (negate) ++i_;
    ByteSet set;
    for (;;) {
      if (!more()) bad(at, "a '[' that is never closed");
      if (peek() == ']') break;
      ByteSet lo_set;
      const int lo = class_item(at, lo_set);
      if (i_ + 1 < p_.size() && peek() == '-' && p_[i_ + 1] != ']') {
        ++i_;
        ByteSet hi_set;
        const int hi = class_item(at, hi_set);
        if (lo < 0 || hi < 0) bad(at, "a range in '[...]' with a class such as \\d at an end");
        if (hi < lo) bad(at, "a range in '[...]' out of order");
        set |= byte_range(lo, hi);
      } else {
        set |= lo_set;
      }
    }
    ++i_;
    return negate ? ~set : set;
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
