#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <vector>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/tokenize/chat_template.hpp>

namespace meshtensor::tokenize {

namespace {

using Value = nlohmann::ordered_json;

Value undefined() {
  return Value(Value::value_t::discarded);
}
bool is_undefined(const Value& v) {
  return v.is_discarded();
}

// ---- Lexing: text, {{ output }} and {% block %} segments, whitespace control applied. ----

struct Segment {
  enum Kind { text, output, block } kind;
  std::string body;
  int line;
};

/// Where the tag opened at `at` (its opener two bytes long) closes: the index of `closer`
/// outside quoted strings.
std::size_t tag_end(std::string_view source, std::size_t at, std::string_view closer, int line) {
  char quote = 0;
  for (std::size_t i = at + 2; i + 1 < source.size(); ++i) {
    const char c = source[i];
    if (quote != 0) {
      if (c == '\\')
        ++i;
      else if (c == quote)
        quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (source.substr(i, 2) == closer) {
      return i;
    }
  }
  throw ParseError(fmt::format("chat template line {}: a tag is not closed by '{}'", line, closer));
}

std::vector<Segment> lex(std::string_view source) {
  std::vector<Segment> out;
  int line = 1;
  std::size_t counted = 0;                          // newlines before `counted` are in `line`
  const auto line_at = [&](std::size_t position) {  // positions only grow
    line +=
        static_cast<int>(std::count(source.begin() + static_cast<std::ptrdiff_t>(counted),
                                    source.begin() + static_cast<std::ptrdiff_t>(position), '\n'));
    counted = position;
    return line;
  };
  std::size_t at = 0;
  bool strip_next = false;    // a '-' closed the last tag
  bool newline_next = false;  // a block closed: trim_blocks drops one newline
  while (at <= source.size()) {
    std::size_t open = source.find('{', at);
    while (open != std::string_view::npos && open + 1 < source.size() && source[open + 1] != '{' &&
           source[open + 1] != '%' && source[open + 1] != '#')
      open = source.find('{', open + 1);
    if (open + 1 >= source.size()) open = std::string_view::npos;
    std::string text(source.substr(at, open == std::string_view::npos ? source.npos : open - at));
    if (newline_next && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (strip_next)
      text.erase(0, text.find_first_not_of(" \t\r\n") == std::string::npos
                        ? text.size()
                        : text.find_first_not_of(" \t\r\n"));
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Segment::text, text, line_at(at)});
      break;
    }
    const char kind = source[open + 1];
    const char mark = open + 2 < source.size() ? source[open + 2] : 0;
    if (mark == '-') {
      text.erase(text.find_last_not_of(" \t\r\n") == std::string::npos
                     ? 0
                     : text.find_last_not_of(" \t\r\n") + 1);
    } else if (kind != '{' && mark != '+') {  // lstrip_blocks: spaces before a block on its line
      const std::size_t line_start = text.find_last_of('\n');
      const std::size_t from = line_start == std::string::npos ? 0 : line_start + 1;
      const bool blank = text.find_first_not_of(" \t", from) == std::string::npos;
      const bool starts_line =
          line_start != std::string::npos || out.empty() || at == 0 || newline_next;
      if (blank && (starts_line || from > 0)) text.erase(from);
    }
    if (!text.empty()) out.push_back({Segment::text, text, line_at(at)});
    const int tag_line = line_at(open);
    const std::string_view closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const std::size_t close =
        kind == '#' ? source.find("#}", open + 2) : tag_end(source, open, closer, tag_line);
    if (close == std::string_view::npos)
      throw ParseError(fmt::format("chat template line {}: a comment is not closed", tag_line));
    std::size_t body_from = open + 2 + ((mark == '-' || mark == '+') ? 1 : 0);
    std::size_t body_to = close;
    strip_next = close > body_from && source[close - 1] == '-';
    const bool keep_newline = close > body_from && source[close - 1] == '+';
    if (strip_next || keep_newline) --body_to;
    newline_next = kind != '{' && !keep_newline;
    if (kind != '#') {
      out.push_back({kind == '{' ? Segment::output : Segment::block,
                     std::string(source.substr(body_from, body_to - body_from)), tag_line});
    }
    at = close + 2;
  }
  return out;
}

// ---- Expressions ----

struct Token {
  enum Kind { name, number, string, op, end } kind;
  std::string text;
  Value value;  // a number's or a string's
};

std::vector<Token> tokenize_expression(std::string_view s, int line) {
  std::vector<Token> out;
  std::size_t i = 0;
  const auto bad = [&](const std::string& why) {
    return ParseError(fmt::format("chat template line {}: {}", line, why));
  };
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_'))
        ++j;
      out.push_back({Token::name, std::string(s.substr(i, j - i)), {}});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t j = i;
      bool real = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) ||
                              (s[j] == '.' && !real && j + 1 < s.size() &&
                               std::isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        real = real || s[j] == '.';
        ++j;
      }
      const std::string digits(s.substr(i, j - i));
      out.push_back(
          {Token::number, digits, real ? Value(std::stod(digits)) : Value(std::stoll(digits))});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string text;
      std::size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          text += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          text += s[j];
        }
      }
      if (j >= s.size()) throw bad("a string is not closed");
      out.push_back({Token::string, text, Value(text)});
      i = j + 1;
    } else {
      static const char* const two[] = {"==", "!=", "<=", ">=", "//", "**"};
      std::string op(1, c);
      for (const char* t : two)
        if (s.substr(i, 2) == t) op = t;
      if (std::string("+-*/%~<>()[]{}.,:|=!").find(c) == std::string::npos)
        throw bad(fmt::format("'{}' is not part of an expression", c));
      out.push_back({Token::op, op, {}});
      i += op.size();
    }
  }
  out.push_back({Token::end, "", {}});
  return out;
}

struct Expr {
  enum Kind {
    literal,
    name,
    attribute,
    item,
    slice,
    call,
    filter,
    test,
    binary,
    unary,
    conditional,
    list,
    dict
  } kind;
  Value value;                              // literal
  std::string text;                         // name, attribute, filter, test, operator
  std::vector<std::shared_ptr<Expr>> args;  // operands, then call / filter arguments
  std::vector<std::pair<std::string, std::shared_ptr<Expr>>> keywords;
  bool negated = false;  // `is not`
  int line = 0;
};
using ExprPtr = std::shared_ptr<Expr>;

const char* const kFilters[] = {"trim",   "upper",   "lower",   "length",     "count",   "string",
                                "tojson", "default", "d",       "join",       "first",   "last",
                                "list",   "items",   "reverse", "capitalize", "replace", "int"};
const char* const kTests[] = {"defined",  "undefined", "none", "string", "number",  "integer",
                              "float",    "boolean",   "true", "false",  "mapping", "sequence",
                              "iterable", "equalto",   "eq",   "sameas", "odd",     "even"};

bool known(const char* const* names, std::size_t count, const std::string& name) {
  return std::find(names, names + count, name) != names + count;
}

class ExpressionParser {
 public:
  ExpressionParser(std::vector<Token> tokens, int line) : tokens_(std::move(tokens)), line_(line) {}

  ExprPtr parse() { return conditional(); }
  bool at_end() const { return peek().kind == Token::end; }
  bool next_is(std::string_view text) const {
    return (peek().kind == Token::op || peek().kind == Token::name) && peek().text == text;
  }
  void expect(std::string_view text) {
    if (!next_is(text)) throw bad(fmt::format("expected '{}', found {}", text, shown()));
    ++at_;
  }
  std::string name() {
    if (peek().kind != Token::name) throw bad(fmt::format("expected a name, found {}", shown()));
    return tokens_[at_++].text;
  }
  ParseError bad(const std::string& why) const {
    return ParseError(fmt::format("chat template line {}: {}", line_, why));
  }
  ExprPtr or_expression() {
    ExprPtr left = and_expression();
    while (next_is("or")) {
      ++at_;
      left = binary("or", left, and_expression());
    }
    return left;
  }

 private:
  const Token& peek() const { return tokens_[at_]; }
  /// The next token as errors name it.
  std::string shown() const {
    return peek().kind == Token::end ? "the end" : fmt::format("'{}'", peek().text);
  }
  ExprPtr make(Expr::Kind kind, std::string text = {}) {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->text = std::move(text);
    e->line = line_;
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b) {
    ExprPtr e = make(Expr::binary, op);
    e->args = {std::move(a), std::move(b)};
    return e;
  }
  ExprPtr conditional() {
    // Nesting is bounded: a template is input, and each level is a frame of this parser and of
    // the renderer.
    if (++depth_ > kMaxDepth) throw bad(fmt::format("expressions nest deeper than {}", kMaxDepth));
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    ExprPtr value = or_expression();
    if (!next_is("if")) return value;
    ++at_;
    ExprPtr e = make(Expr::conditional);
    ExprPtr condition = or_expression();
    ExprPtr otherwise = make(Expr::literal);
    otherwise->value = undefined();
    if (next_is("else")) {
      ++at_;
      otherwise = conditional();
    }
    e->args = {condition, value, otherwise};
    return e;
  }
  ExprPtr and_expression() {
    ExprPtr left = not_expression();
    while (next_is("and")) {
      ++at_;
      left = binary("and", left, not_expression());
    }
    return left;
  }
  ExprPtr not_expression() {
    if (!next_is("not")) return comparison();
    ++at_;
    ExprPtr e = make(Expr::unary, "not");
    e->args = {conditional_operand()};
    return e;
  }
  /// The operand of a prefix operator, counted as a level of nesting.
  ExprPtr conditional_operand() {
    if (++depth_ > kMaxDepth) throw bad(fmt::format("expressions nest deeper than {}", kMaxDepth));
    ExprPtr e = next_is("not") ? not_expression() : unary();
    --depth_;
    return e;
  }
  ExprPtr comparison() {
    ExprPtr left = sum();
    for (;;) {
      for (const char* op : {"==", "!=", "<", "<=", ">", ">=", "in"}) {
        if (next_is(op)) {
          ++at_;
          left = binary(op, left, sum());
          goto next;
        }
      }
      if (next_is("not") && tokens_[at_ + 1].text == "in") {
        at_ += 2;
        left = binary("not in", left, sum());
        continue;
      }
      return left;
    next:;
    }
  }
  ExprPtr sum() {
    ExprPtr left = concatenation();
    while (next_is("+") || next_is("-")) {
      const std::string op = tokens_[at_++].text;
      left = binary(op, left, concatenation());
    }
    return left;
  }
  ExprPtr concatenation() {
    ExprPtr left = product();
    while (next_is("~")) {
      ++at_;
      left = binary("~", left, product());
    }
    return left;
  }
  ExprPtr product() {
    ExprPtr left = unary();
    while (next_is("*") || next_is("/") || next_is("//") || next_is("%")) {
      const std::string op = tokens_[at_++].text;
      left = binary(op, left, unary());
    }
    return left;
  }
  ExprPtr unary() {
    if (next_is("-") || next_is("+")) {
      const std::string op = tokens_[at_++].text;
      ExprPtr e = make(Expr::unary, op);
      e->args = {conditional_operand()};
      return e;
    }
    return filters(postfix(primary()));
  }
  void arguments(Expr& e) {
    expect("(");
    while (!next_is(")")) {
      if (peek().kind == Token::name && tokens_[at_ + 1].text == "=") {
        const std::string key = name();
        ++at_;
        e.keywords.emplace_back(key, conditional());
      } else {
        e.args.push_back(conditional());
      }
      if (!next_is(")")) expect(",");
    }
    ++at_;
  }
  ExprPtr filters(ExprPtr e) {
    for (;;) {
      if (next_is("|")) {
        ++at_;
        ExprPtr f = make(Expr::filter, name());
        if (!known(kFilters, std::size(kFilters), f->text))
          throw bad(fmt::format("filter '{}' is not one meshtensor renders", f->text));
        f->args.push_back(e);
        if (next_is("(")) arguments(*f);
        e = f;
      } else if (next_is("is")) {
        ++at_;
        ExprPtr t = make(Expr::test);
        if (next_is("not")) {
          ++at_;
          t->negated = true;
        }
        t->text = name();
        if (!known(kTests, std::size(kTests), t->text))
          throw bad(fmt::format("test '{}' is not one meshtensor renders", t->text));
        t->args.push_back(e);
        if (next_is("(")) {
          arguments(*t);
        } else if (peek().kind != Token::end && peek().kind != Token::op && !next_is("and") &&
                   !next_is("or") && !next_is("else") && !next_is("if")) {
          t->args.push_back(primary());  // `is equalto 3`
        }
        e = t;
      } else {
        return e;
      }
    }
  }
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (next_is(".")) {
        ++at_;
        ExprPtr a = make(Expr::attribute, name());
        a->args = {e};
        e = a;
      } else if (next_is("[")) {
        ++at_;
        std::array<ExprPtr, 3> parts;
        int colons = 0;
        while (!next_is("]")) {
          if (next_is(":")) {
            ++at_;
            ++colons;
            if (colons > 2) throw bad("a slice has at most two ':'");
            continue;
          }
          parts[static_cast<std::size_t>(colons)] = conditional();
        }
        ++at_;
        ExprPtr s = make(colons == 0 ? Expr::item : Expr::slice);
        s->args = {e, parts[0], parts[1], parts[2]};
        e = s;
      } else if (next_is("(")) {
        ExprPtr c = make(Expr::call);
        c->args.push_back(e);
        arguments(*c);
        e = c;
      } else {
        return e;
      }
    }
  }
  ExprPtr primary() {
    const Token token = peek();
    if (token.kind == Token::number || token.kind == Token::string) {
      ++at_;
      ExprPtr e = make(Expr::literal);
      e->value = token.value;
      // Adjacent strings concatenate, as in Python.
      while (token.kind == Token::string && peek().kind == Token::string)
        e->value = e->value.get<std::string>() + tokens_[at_++].value.get<std::string>();
      return e;
    }
    if (token.kind == Token::name) {
      ++at_;
      ExprPtr e = make(Expr::literal);
      if (token.text == "true" || token.text == "True")
        e->value = true;
      else if (token.text == "false" || token.text == "False")
        e->value = false;
      else if (token.text == "none" || token.text == "None")
        e->value = nullptr;
      else
        e = make(Expr::name, token.text);
      return e;
    }
    if (next_is("(")) {
      ++at_;
      ExprPtr e = conditional();
      if (next_is(",")) {  // a tuple: a list here
        ExprPtr l = make(Expr::list);
        l->args.push_back(e);
        while (next_is(",")) {
          ++at_;
          if (next_is(")")) break;
          l->args.push_back(conditional());
        }
        e = l;
      }
      expect(")");
      return e;
    }
    if (next_is("[")) {
      ++at_;
      ExprPtr l = make(Expr::list);
      while (!next_is("]")) {
        l->args.push_back(conditional());
        if (!next_is("]")) expect(",");
      }
      ++at_;
      return l;
    }
    if (next_is("{")) {
      ++at_;
      ExprPtr d = make(Expr::dict);
      while (!next_is("}")) {
        ExprPtr key = conditional();
        expect(":");
        d->args.push_back(key);
        d->args.push_back(conditional());
        if (!next_is("}")) expect(",");
      }
      ++at_;
      return d;
    }
    throw bad(peek().kind == Token::end ? std::string("an expression is missing or ends too early")
                                        : fmt::format("unexpected {} in an expression", shown()));
  }

  static constexpr int kMaxDepth = 64;
  std::vector<Token> tokens_;
  std::size_t at_ = 0;
  int line_;
  int depth_ = 0;
};

}  // namespace

// ---- Statements ----

struct ChatTemplate::Node {
  enum Kind { raw, output, block, if_, for_, set, set_attribute, break_, continue_ } kind;
  std::string text;                // text; set's name; for's targets joined by ','
  std::vector<std::string> names;  // for's targets; set_attribute's (name, attribute)
  std::vector<ExprPtr> exprs;      // output's; if's conditions; for's iterable (+ filter); set's
  std::vector<std::vector<std::shared_ptr<Node>>>
      bodies;  // if's branches (+ else); for's body, else; block's one
  int line = 0;
};

namespace {

using Node = ChatTemplate::Node;
using NodePtr = std::shared_ptr<Node>;
using Body = std::vector<NodePtr>;

class StatementParser {
 public:
  explicit StatementParser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  /// Parses nodes until a block whose keyword is one of `ends` (its keyword into `end`).
  Body parse_body(const std::vector<std::string>& ends, std::string& end) {
    if (++depth_ > kMaxDepth) {
      throw ParseError(fmt::format("chat template: blocks nest deeper than {}", kMaxDepth));
    }
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    Body body;
    while (at_ < segments_.size()) {
      const Segment& s = segments_[at_++];
      if (s.kind == Segment::text) {
        body.push_back(std::make_shared<Node>(Node{Node::raw, s.body, {}, {}, {}, s.line}));
        continue;
      }
      ExpressionParser p(tokenize_expression(s.body, s.line), s.line);
      if (s.kind == Segment::output) {
        auto n = std::make_shared<Node>(Node{Node::output, "", {}, {p.parse()}, {}, s.line});
        if (!p.at_end()) throw p.bad(fmt::format("unexpected text in '{{{{{}}}}}'", s.body));
        body.push_back(n);
        continue;
      }
      const std::string keyword = p.name();
      if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
        end = keyword;
        current_ = std::move(p);
        return body;
      }
      body.push_back(statement(keyword, p, s.line));
    }
    if (!ends.empty())
      throw ParseError(
          fmt::format("chat template: a block is not closed (expected '{}')", ends.back()));
    return body;
  }

  NodePtr statement(const std::string& keyword, ExpressionParser& p, int line) {
    if (keyword == "if") return if_statement(p, line);
    if (keyword == "for") return for_statement(p, line);
    if (keyword == "set") return set_statement(p, line);
    if (keyword == "break" || keyword == "continue") {
      return std::make_shared<Node>(
          Node{keyword == "break" ? Node::break_ : Node::continue_, "", {}, {}, {}, line});
    }
    if (keyword == "generation") {  // transformers' assistant-mask marker: its body as is
      std::string end;
      return std::make_shared<Node>(
          Node{Node::block, "", {}, {}, {parse_body({"endgeneration"}, end)}, line});
    }
    throw ParseError(fmt::format(
        "chat template line {}: '{{% {} %}}' is not a construct meshtensor renders (if, for, set, "
        "break, continue)",
        line, keyword));
  }

  NodePtr if_statement(ExpressionParser& p, int line) {
    auto n = std::make_shared<Node>(Node{Node::if_, "", {}, {}, {}, line});
    n->exprs.push_back(p.parse());
    for (;;) {
      std::string end;
      n->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
      if (end == "endif") return n;
      if (end == "elif") {
        n->exprs.push_back(current_->parse());
      } else {
        std::string last;
        n->bodies.push_back(parse_body({"endif"}, last));
        return n;
      }
    }
  }

  NodePtr for_statement(ExpressionParser& p, int line) {
    auto n = std::make_shared<Node>(Node{Node::for_, "", {}, {}, {}, line});
    n->names.push_back(p.name());
    while (p.next_is(",")) {
      p.expect(",");
      n->names.push_back(p.name());
    }
    p.expect("in");
    n->exprs.push_back(p.or_expression());
    if (p.next_is("if")) {
      p.expect("if");
      n->exprs.push_back(p.parse());
    }
    std::string end;
    n->bodies.push_back(parse_body({"else", "endfor"}, end));
    if (end == "else") {
      std::string last;
      n->bodies.push_back(parse_body({"endfor"}, last));
    }
    return n;
  }

  NodePtr set_statement(ExpressionParser& p, int line) {
    const std::string target = p.name();
    if (p.next_is(".")) {
      p.expect(".");
      const std::string attribute = p.name();
      p.expect("=");
      return std::make_shared<Node>(
          Node{Node::set_attribute, "", {target, attribute}, {p.parse()}, {}, line});
    }
    if (!p.next_is("="))
      throw p.bad("a '{% set %}' block is not a construct meshtensor renders (set NAME = VALUE)");
    p.expect("=");
    return std::make_shared<Node>(Node{Node::set, target, {}, {p.parse()}, {}, line});
  }

  static constexpr int kMaxDepth = 64;
  std::vector<Segment> segments_;
  std::size_t at_ = 0;
  int depth_ = 0;
  std::optional<ExpressionParser> current_;  // the parser of the block that ended a body
};

// ---- Values as Python and Jinja see them ----

/// Python's repr of a float: the shortest digits that read back, with ".0" when integral.
std::string float_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string text = Value(v).dump();
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return text;
}

std::string repr(const Value& v);

/// Python's str() of a value, as `{{ }}` and `~` print it (undefined: nothing).
std::string str(const Value& v) {
  if (is_undefined(v)) return "";
  if (v.is_string()) return v.get<std::string>();
  return repr(v);
}

/// A Python string literal of `text`, quoted as repr() quotes it.
std::string quoted(const std::string& text) {
  const char quote =
      text.find('\'') != std::string::npos && text.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : text) {
    if (c == '\\' || c == quote) out += '\\';
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else
      out += c;
  }
  return out + quote;
}

std::string repr(const Value& v) {
  if (is_undefined(v)) return "";
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return float_text(v.get<double>());
  if (v.is_number()) return v.dump();
  if (v.is_string()) return quoted(v.get<std::string>());
  std::string out = v.is_array() ? "[" : "{";
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!first) out += ", ";
    first = false;
    if (v.is_object()) out += quoted(it.key()) + ": ";
    out += repr(*it);
  }
  return out + (v.is_array() ? "]" : "}");
}

/// Python's json.dumps(v, ensure_ascii=False, indent=indent) (transformers' tojson).
std::string python_json(const Value& v, int indent, int depth = 0) {
  if (!v.is_array() && !v.is_object()) {
    if (v.is_number_float()) return float_text(v.get<double>());
    return v.dump(-1, ' ', false, Value::error_handler_t::replace);
  }
  if (v.empty()) return v.is_array() ? "[]" : "{}";
  const std::string pad =
      indent < 0 ? "" : "\n" + std::string(static_cast<std::size_t>(indent * (depth + 1)), ' ');
  std::string out = v.is_array() ? "[" : "{";
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!first) out += indent < 0 ? ", " : ",";
    first = false;
    out += pad;
    if (v.is_object())
      out += Value(it.key()).dump(-1, ' ', false, Value::error_handler_t::replace) + ": ";
    out += python_json(*it, indent, depth + 1);
  }
  if (indent >= 0) out += "\n" + std::string(static_cast<std::size_t>(indent * depth), ' ');
  return out + (v.is_array() ? "]" : "}");
}

bool truthy(const Value& v) {
  if (is_undefined(v) || v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<std::int64_t>() != 0;
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return true;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number() && !a.is_boolean() && !b.is_boolean())
    return a.get<double>() == b.get<double>();
  if (is_undefined(a) || is_undefined(b)) return is_undefined(a) && is_undefined(b);
  return a == b;
}

/// The elements a `for` or a filter goes over: a list's items, a dict's keys, a string's
/// characters (bytes here).
std::vector<Value> elements(const Value& v, int line) {
  std::vector<Value> out;
  if (v.is_array()) {
    out.assign(v.begin(), v.end());
  } else if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it)
      out.emplace_back(it.key());
  } else if (v.is_string()) {
    for (const char c : v.get<std::string>())
      out.emplace_back(std::string(1, c));
  } else if (!is_undefined(v)) {
    throw DataError(fmt::format("chat template line {}: {} is not iterable", line, repr(v)));
  }
  return out;
}

class Renderer {
 public:
  explicit Renderer(const Value& context) {
    scopes_.push_back(context.is_object() ? context : Value::object());
  }

  void run(const Body& body, std::string& out) {
    for (const NodePtr& node : body) {
      if (stop_ != Stop::none) return;
      run(*node, out);
    }
  }

 private:
  enum class Stop { none, break_loop, continue_loop };

  [[noreturn]] void fail(int line, const std::string& why) const {
    throw DataError(fmt::format("chat template line {}: {}", line, why));
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (it->contains(name)) return (*it)[name];
    return undefined();
  }

  Value* find_variable(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (it->contains(name)) return &(*it)[name];
    return nullptr;
  }

  void run(const Node& node, std::string& out) {
    switch (node.kind) {
      case Node::raw:
        out += node.text;
        return;
      case Node::output:
        out += str(eval(*node.exprs[0]));
        return;
      case Node::block:
        return run(node.bodies[0], out);
      case Node::if_:
        for (std::size_t i = 0; i < node.exprs.size(); ++i) {
          if (truthy(eval(*node.exprs[i]))) return run(node.bodies[i], out);
        }
        if (node.bodies.size() > node.exprs.size()) run(node.bodies.back(), out);
        return;
      case Node::for_:
        return run_for(node, out);
      case Node::set:
        scopes_.back()[node.text] = eval(*node.exprs[0]);
        return;
      case Node::set_attribute: {
        Value* target = find_variable(node.names[0]);
        if (target == nullptr || !target->is_object())
          fail(node.line,
               fmt::format("'{}' is not a namespace to set '{}' of", node.names[0], node.names[1]));
        (*target)[node.names[1]] = eval(*node.exprs[0]);
        return;
      }
      case Node::break_:
        stop_ = Stop::break_loop;
        return;
      case Node::continue_:
        stop_ = Stop::continue_loop;
        return;
    }
  }

  void run_for(const Node& node, std::string& out) {
    std::vector<Value> items;
    for (Value& item : elements(eval(*node.exprs[0]), node.line)) {
      if (node.exprs.size() > 1) {
        scopes_.push_back(Value::object());
        bind(node, item);
        const bool keep = truthy(eval(*node.exprs[1]));
        scopes_.pop_back();
        if (!keep) continue;
      }
      items.push_back(std::move(item));
    }
    if (items.empty()) {
      if (node.bodies.size() > 1) run(node.bodies[1], out);
      return;
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      scopes_.push_back(Value::object());
      bind(node, items[i]);
      const auto n = static_cast<std::int64_t>(items.size());
      const auto k = static_cast<std::int64_t>(i);
      scopes_.back()["loop"] = {{"index", k + 1},
                                {"index0", k},
                                {"revindex", n - k},
                                {"revindex0", n - k - 1},
                                {"first", i == 0},
                                {"last", k == n - 1},
                                {"length", n},
                                {"previtem", i > 0 ? items[i - 1] : undefined()},
                                {"nextitem", k + 1 < n ? items[i + 1] : undefined()}};
      run(node.bodies[0], out);
      scopes_.pop_back();
      if (stop_ == Stop::break_loop) {
        stop_ = Stop::none;
        break;
      }
      stop_ = Stop::none;
    }
  }

  void bind(const Node& node, const Value& item) {
    if (node.names.size() == 1) {
      scopes_.back()[node.names[0]] = item;
      return;
    }
    if (!item.is_array() || item.size() != node.names.size())
      fail(node.line,
           fmt::format("{} does not unpack into {} names", repr(item), node.names.size()));
    for (std::size_t i = 0; i < node.names.size(); ++i)
      scopes_.back()[node.names[i]] = item[i];
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::literal:
        return e.value;
      case Expr::name:
        return lookup(e.text);
      case Expr::attribute:
        return attribute(eval(*e.args[0]), e.text);
      case Expr::item:
        return item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::slice:
        return slice(e);
      case Expr::call:
        return call(e);
      case Expr::filter:
        return filter(e);
      case Expr::test:
        return test(e) != e.negated;
      case Expr::binary:
        return binary(e);
      case Expr::unary: {
        const Value v = eval(*e.args[0]);
        if (e.text == "not") return !truthy(v);
        if (!v.is_number()) fail(e.line, fmt::format("'{}' of {}", e.text, repr(v)));
        if (e.text == "+") return v;
        return v.is_number_float() ? Value(-v.get<double>()) : Value(-v.get<std::int64_t>());
      }
      case Expr::conditional:
        return truthy(eval(*e.args[0])) ? eval(*e.args[1]) : eval(*e.args[2]);
      case Expr::list: {
        Value out = Value::array();
        for (const ExprPtr& a : e.args)
          out.push_back(eval(*a));
        return out;
      }
      case Expr::dict: {
        Value out = Value::object();
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2)
          out[str(eval(*e.args[i]))] = eval(*e.args[i + 1]);
        return out;
      }
    }
    return undefined();
  }

  static Value attribute(const Value& v, const std::string& name) {
    if (v.is_object() && v.contains(name)) return v[name];
    return undefined();
  }

  Value item(const Value& v, const Value& key, int line) const {
    if (v.is_object()) {
      const std::string k = key.is_string() ? key.get<std::string>() : str(key);
      return v.contains(k) ? v[k] : undefined();
    }
    if ((v.is_array() || v.is_string()) && key.is_number_integer()) {
      const auto size =
          static_cast<std::int64_t>(v.is_array() ? v.size() : v.get<std::string>().size());
      std::int64_t at = key.get<std::int64_t>();
      if (at < 0) at += size;
      if (at < 0 || at >= size) return undefined();
      if (v.is_array()) return v[static_cast<std::size_t>(at)];
      return std::string(1, v.get<std::string>()[static_cast<std::size_t>(at)]);
    }
    if (is_undefined(v)) return undefined();
    fail(line, fmt::format("{} has no item {}", repr(v), repr(key)));
  }

  Value slice(const Expr& e) {
    const Value v = eval(*e.args[0]);
    const auto part = [&](int i, std::int64_t fallback) {
      if (!e.args[static_cast<std::size_t>(i)]) return fallback;
      const Value p = eval(*e.args[static_cast<std::size_t>(i)]);
      if (p.is_null()) return fallback;
      if (!p.is_number_integer())
        fail(e.line, fmt::format("a slice bound {} is not an integer", repr(p)));
      return p.get<std::int64_t>();
    };
    if (!v.is_array() && !v.is_string()) fail(e.line, fmt::format("{} cannot be sliced", repr(v)));
    const auto size =
        static_cast<std::int64_t>(v.is_array() ? v.size() : v.get<std::string>().size());
    const std::int64_t step = part(3, 1);
    if (step == 0) fail(e.line, "a slice step is 0");
    const auto clamp = [&](std::int64_t i) {  // Python's bounds: [0, size] up, [-1, size) down
      if (i < 0) i += size;
      return step > 0 ? std::clamp<std::int64_t>(i, 0, size)
                      : std::clamp<std::int64_t>(i, -1, size - 1);
    };
    const std::int64_t start = e.args[1] ? clamp(part(1, 0)) : (step > 0 ? 0 : size - 1);
    const std::int64_t stop = e.args[2] ? clamp(part(2, 0)) : (step > 0 ? size : -1);
    Value out = v.is_array() ? Value::array() : Value("");
    std::string text;
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (v.is_array())
        out.push_back(v[static_cast<std::size_t>(i)]);
      else
        text += v.get<std::string>()[static_cast<std::size_t>(i)];
    }
    return v.is_array() ? out : Value(text);
  }

  std::vector<Value> arguments(const Expr& e, std::size_t first) {
    std::vector<Value> out;
    for (std::size_t i = first; i < e.args.size(); ++i)
      out.push_back(eval(*e.args[i]));
    return out;
  }

  Value keyword(const Expr& e, const std::string& name, Value fallback) {
    for (const auto& [key, value] : e.keywords)
      if (key == name) return eval(*value);
    return fallback;
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    const std::vector<Value> args = arguments(e, 1);
    if (callee.kind == Expr::name) {
      if (callee.text == "raise_exception")
        fail(e.line, args.empty() ? std::string("raise_exception") : str(args[0]));
      if (callee.text == "namespace") {
        Value ns = Value::object();
        for (const auto& [key, value] : e.keywords)
          ns[key] = eval(*value);
        return ns;
      }
      if (callee.text == "range") {
        std::int64_t from = 0, to = 0, step = 1;
        if (args.size() == 1) to = args[0].get<std::int64_t>();
        if (args.size() >= 2) from = args[0].get<std::int64_t>(), to = args[1].get<std::int64_t>();
        if (args.size() == 3) step = args[2].get<std::int64_t>();
        if (step == 0) fail(e.line, "range() step is 0");
        Value out = Value::array();
        for (std::int64_t i = from; step > 0 ? i < to : i > to; i += step)
          out.push_back(i);
        return out;
      }
      fail(e.line, fmt::format("'{}' is not a function meshtensor calls (namespace, range, "
                               "raise_exception)",
                               callee.text));
    }
    if (callee.kind != Expr::attribute)
      fail(e.line, "only methods, namespace, range and raise_exception are called");
    return method(eval(*callee.args[0]), callee.text, args, e.line);
  }

  Value method(const Value& self, const std::string& name, const std::vector<Value>& args,
               int line) {
    const auto text_arg = [&](std::size_t i) {
      if (i >= args.size() || !args[i].is_string())
        fail(line, fmt::format("{}() takes a string", name));
      return args[i].get<std::string>();
    };
    if (self.is_string()) {
      const std::string s = self.get<std::string>();
      const auto strip_set = [&]() {
        return args.empty() || args[0].is_null() ? std::string(" \t\n\r\f\v") : text_arg(0);
      };
      if (name == "startswith") return s.rfind(text_arg(0), 0) == 0;
      if (name == "endswith") {
        const std::string t = text_arg(0);
        return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const std::string set = strip_set();
        std::size_t from = 0, to = s.size();
        if (name != "rstrip")
          while (from < to && set.find(s[from]) != std::string::npos)
            ++from;
        if (name != "lstrip")
          while (to > from && set.find(s[to - 1]) != std::string::npos)
            --to;
        return s.substr(from, to - from);
      }
      if (name == "upper" || name == "lower") {
        std::string out = s;
        for (char& c : out)
          c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                                : std::tolower(static_cast<unsigned char>(c)));
        return out;
      }
      if (name == "replace") {
        const std::string from = text_arg(0), to = text_arg(1);
        if (from.empty()) fail(line, "replace() of an empty string");
        std::string out;
        for (std::size_t at = 0;;) {
          const std::size_t found = s.find(from, at);
          out += s.substr(at, found == std::string::npos ? std::string::npos : found - at);
          if (found == std::string::npos) break;
          out += to;
          at = found + from.size();
        }
        return out;
      }
      if (name == "split") {
        Value out = Value::array();
        if (args.empty() || args[0].is_null()) {
          std::size_t at = 0;
          while (true) {
            at = s.find_first_not_of(" \t\n\r\f\v", at);
            if (at == std::string::npos) break;
            const std::size_t end = std::min(s.find_first_of(" \t\n\r\f\v", at), s.size());
            out.push_back(s.substr(at, end - at));
            at = end;
          }
          return out;
        }
        const std::string sep = text_arg(0);
        if (sep.empty()) fail(line, "split() of an empty separator");
        for (std::size_t at = 0;;) {
          const std::size_t found = s.find(sep, at);
          out.push_back(s.substr(at, found == std::string::npos ? std::string::npos : found - at));
          if (found == std::string::npos) break;
          at = found + sep.size();
        }
        return out;
      }
    }
    if (self.is_object()) {
      if (name == "items") {
        Value out = Value::array();
        for (auto it = self.begin(); it != self.end(); ++it)
          out.push_back(Value::array({it.key(), *it}));
        return out;
      }
      if (name == "keys" || name == "values") {
        Value out = Value::array();
        for (auto it = self.begin(); it != self.end(); ++it)
          out.push_back(name == "keys" ? Value(it.key()) : *it);
        return out;
      }
      if (name == "get") {
        const std::string key = text_arg(0);
        return self.contains(key) ? self[key] : (args.size() > 1 ? args[1] : Value(nullptr));
      }
    }
    fail(line, fmt::format("{} has no method '{}' meshtensor calls", repr(self), name));
  }

  Value filter(const Expr& e) {
    const Value v = eval(*e.args[0]);
    const std::vector<Value> args = arguments(e, 1);
    const std::string& name = e.text;
    if (name == "trim") return method(Value(str(v)), "strip", {}, e.line);
    if (name == "upper" || name == "lower") return method(Value(str(v)), name, {}, e.line);
    if (name == "length" || name == "count") {
      if (v.is_string()) return static_cast<std::int64_t>(v.get<std::string>().size());
      return static_cast<std::int64_t>(elements(v, e.line).size());
    }
    if (name == "string") return str(v);
    if (name == "tojson") {
      const Value indent = keyword(e, "indent", args.empty() ? Value(nullptr) : args[0]);
      return python_json(v, indent.is_number_integer() ? indent.get<int>() : -1);
    }
    if (name == "default" || name == "d") {
      const bool boolean = args.size() > 1 && truthy(args[1]);
      if (is_undefined(v) || (boolean && !truthy(v))) return args.empty() ? Value("") : args[0];
      return v;
    }
    if (name == "join") {
      std::string out;
      const std::string sep = args.empty() ? "" : str(args[0]);
      bool first = true;
      for (const Value& item : elements(v, e.line)) {
        if (!first) out += sep;
        first = false;
        out += str(item);
      }
      return out;
    }
    if (name == "first" || name == "last") {
      const std::vector<Value> items = elements(v, e.line);
      if (items.empty()) return undefined();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") {
      Value out = Value::array();
      for (const Value& item : elements(v, e.line))
        out.push_back(item);
      return out;
    }
    if (name == "items") return method(v, "items", {}, e.line);
    if (name == "reverse") {
      if (v.is_string())
        return std::string(v.get<std::string>().rbegin(), v.get<std::string>().rend());
      Value out = Value::array();
      const std::vector<Value> items = elements(v, e.line);
      for (auto it = items.rbegin(); it != items.rend(); ++it)
        out.push_back(*it);
      return out;
    }
    if (name == "capitalize") {
      std::string s = method(Value(str(v)), "lower", {}, e.line).get<std::string>();
      if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
      return s;
    }
    if (name == "replace") return method(Value(str(v)), "replace", args, e.line);
    if (name == "int") {
      if (v.is_number()) return static_cast<std::int64_t>(v.get<double>());
      try {
        return static_cast<std::int64_t>(std::stoll(str(v)));
      } catch (const std::exception&) {
        return static_cast<std::int64_t>(0);
      }
    }
    fail(e.line, fmt::format("filter '{}' is not one meshtensor renders", name));
  }

  bool test(const Expr& e) {
    const Value v = eval(*e.args[0]);
    const std::string& name = e.text;
    if (name == "defined") return !is_undefined(v);
    if (name == "undefined") return is_undefined(v);
    if (name == "none") return v.is_null();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number() && !v.is_boolean();
    if (name == "integer") return v.is_number_integer();
    if (name == "float") return v.is_number_float();
    if (name == "boolean") return v.is_boolean();
    if (name == "true") return v.is_boolean() && v.get<bool>();
    if (name == "false") return v.is_boolean() && !v.get<bool>();
    if (name == "mapping") return v.is_object();
    if (name == "sequence") return v.is_array() || v.is_string() || v.is_object();
    if (name == "iterable") return v.is_array() || v.is_string() || v.is_object();
    if (name == "equalto" || name == "eq" || name == "sameas") {
      if (e.args.size() < 2) fail(e.line, fmt::format("test '{}' takes a value", name));
      return equal(v, eval(*e.args[1]));
    }
    if (name == "odd" || name == "even") {
      if (!v.is_number_integer()) fail(e.line, fmt::format("{} is not an integer", repr(v)));
      return (v.get<std::int64_t>() % 2 != 0) == (name == "odd");
    }
    fail(e.line, fmt::format("test '{}' is not one meshtensor renders", name));
  }

  Value binary(const Expr& e) {
    const std::string& op = e.text;
    if (op == "and") {
      const Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      const Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    const Value a = eval(*e.args[0]);
    const Value b = eval(*e.args[1]);
    if (op == "~") return str(a) + str(b);
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string() && a.is_string())
        found = b.get<std::string>().find(a.get<std::string>()) != std::string::npos;
      else if (b.is_object() && a.is_string())
        found = b.contains(a.get<std::string>());
      else if (b.is_array())
        found = std::any_of(b.begin(), b.end(), [&](const Value& x) { return equal(x, a); });
      else if (!is_undefined(b))
        fail(e.line, fmt::format("'in' of {}", repr(b)));
      return found == (op == "in");
    }
    if (op == "+" && a.is_string() && b.is_string())
      return a.get<std::string>() + b.get<std::string>();
    if (op == "+" && a.is_array() && b.is_array()) {
      Value out = a;
      out.insert(out.end(), b.begin(), b.end());
      return out;
    }
    if (a.is_string() && b.is_string()) {
      const int c = a.get<std::string>().compare(b.get<std::string>());
      if (op == "<") return c < 0;
      if (op == "<=") return c <= 0;
      if (op == ">") return c > 0;
      if (op == ">=") return c >= 0;
    }
    if (!a.is_number() || !b.is_number())
      fail(e.line,
           fmt::format("{} {} {} is not an operation on numbers or strings", repr(a), op, repr(b)));
    const bool integers = a.is_number_integer() && b.is_number_integer();
    const double x = a.get<double>(), y = b.get<double>();
    if (op == "<") return x < y;
    if (op == "<=") return x <= y;
    if (op == ">") return x > y;
    if (op == ">=") return x >= y;
    if (op == "/") {
      if (y == 0) fail(e.line, "division by zero");
      return x / y;
    }
    if (integers) {
      const std::int64_t i = a.get<std::int64_t>(), j = b.get<std::int64_t>();
      if (op == "+") return i + j;
      if (op == "-") return i - j;
      if (op == "*") return i * j;
      if (j == 0) fail(e.line, "division by zero");
      const std::int64_t q = i / j - ((i % j != 0 && ((i < 0) != (j < 0))) ? 1 : 0);
      if (op == "//") return q;
      if (op == "%") return i - q * j;
    }
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (y == 0) fail(e.line, "division by zero");
    if (op == "//") return std::floor(x / y);
    if (op == "%") return x - std::floor(x / y) * y;
    fail(e.line, fmt::format("operator '{}' is not one meshtensor renders", op));
  }

  std::vector<Value> scopes_;
  Stop stop_ = Stop::none;
};

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source) {
  root_ = std::make_shared<Node>(
      Node{Node::block, "", {}, {}, {StatementParser(lex(source)).parse_all()}, 1});
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const Value& context) const {
  std::string out;
  Renderer(context).run(root_->bodies[0], out);
  return out;
}

}  // namespace meshtensor::tokenize
