// json_schema_rule (see json_schema_grammar.h). One compiler object per schema: shared pieces
// (whitespace, string characters, the generic value) are built once, $refs are memoized by
// pointer (a rule is created before its target is compiled, so recursive schemas terminate).
#include "server/json_schema_grammar.h"

#include "server/api_error.h"
#include "server/regex_grammar.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace moet::server {
namespace {

using Sym = GrammarBuilder::Sym;
using Seq = GrammarBuilder::Seq;

constexpr int kMaxIndent = 16;  // spaces after a newline between tokens
constexpr int kMaxDigits = 16;

const std::set<std::string> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentEncoding", "contentMediaType", "$anchor", "discriminator", "example", "strict"};
const std::set<std::string> kKnown = {
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "nullable",
    "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems", "minLength",
    "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

const std::map<std::string, std::string> kFormats = {
    {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"},
    {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"date-time", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                  "(\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    {"email", "[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9-]{1,63}(\\.[a-zA-Z0-9-]{1,63}){1,4}"},
    {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"},
};

std::string pow10_minus_1(int digits) { return std::string(size_t(digits), '9'); }

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& b, const Json& root, std::string param)
      : b_(b), root_(root), param_(std::move(param)) {}

  Sym compile(const Json& schema, const std::string& path) {
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) refuse(path, "the schema `false` matches nothing");
      return any_value();
    }
    if (!schema.is_object()) refuse(path, "a schema must be an object or a boolean");
    for (const auto& [key, _] : schema.items())
      if (!kKnown.count(key) && !kAnnotations.count(key) && !key.starts_with("x-"))
        refuse(path, fmt::format("the keyword '{}' is not supported", key));
    if (schema.contains("$ref")) return reference(schema, path);
    Sym s = body(schema, path);
    if (schema.value("nullable", false)) s = b_.choice({{s}, b_.literal("null")});
    return s;
  }

  Sym ws() {
    if (!ws_) ws_ = json_whitespace(b_);
    return *ws_;
  }

 private:
  [[noreturn]] void refuse(const std::string& path, const std::string& what) const {
    throw ApiError(400, fmt::format("{}: JSON schema at '{}': {}", param_, path.empty() ? "/" : path, what), param_);
  }

  Sym reference(const Json& schema, const std::string& path) {
    if (schema.size() > 1) {
      for (const auto& [key, _] : schema.items())
        if (key != "$ref" && !kAnnotations.count(key) && key != "$defs" && key != "definitions")
          refuse(path, "'$ref' next to other constraints is not supported");
    }
    const std::string ref = schema["$ref"].is_string() ? schema["$ref"].get<std::string>() : "";
    if (!ref.starts_with("#")) refuse(path, fmt::format("only local references ('#...') are supported, not '{}'", ref));
    if (const auto it = refs_.find(ref); it != refs_.end()) return b_.ref(it->second);
    const std::string pointer = ref.substr(1);
    Json::json_pointer ptr;
    try {
      ptr = Json::json_pointer(pointer);
    } catch (const Json::exception&) {
      refuse(path, fmt::format("bad reference '{}'", ref));
    }
    if (!root_.contains(ptr)) refuse(path, fmt::format("the reference '{}' points nowhere", ref));
    const uint32_t rule = b_.new_rule();
    refs_[ref] = rule;
    b_.add(rule, {compile(root_.at(ptr), pointer)});
    return b_.ref(rule);
  }

  Sym body(const Json& s, const std::string& path) {
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) refuse(path, "'enum' must be a non-empty array");
      std::vector<Seq> alternatives;
      for (const Json& v : s["enum"]) alternatives.push_back(b_.literal(v.dump()));
      return b_.choice(std::move(alternatives));
    }
    if (s.contains("const")) return b_.literal_sym(s["const"].dump());
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      if (!s[key].is_array() || s[key].empty()) refuse(path, fmt::format("'{}' must be a non-empty array", key));
      std::vector<Seq> alternatives;
      for (size_t i = 0; i < s[key].size(); ++i)
        alternatives.push_back({compile(merged(s, s[key][i], key, path), fmt::format("{}/{}/{}", path, key, i))});
      return b_.choice(std::move(alternatives));
    }
    if (s.contains("allOf")) {
      if (!s["allOf"].is_array() || s["allOf"].size() != 1) refuse(path, "'allOf' of more than one schema is not supported");
      return compile(merged(s, s["allOf"][0], "allOf", path), path + "/allOf/0");
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array())
        for (const Json& x : t) types.push_back(x.is_string() ? x.get<std::string>() : "");
      else refuse(path, "'type' must be a string or an array of strings");
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("prefixItems")) {
      types = {"array"};
    } else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
      types = {"string"};
    } else {
      return any_value();
    }
    std::vector<Seq> alternatives;
    for (const std::string& type : types) alternatives.push_back({typed(s, type, path)});
    return b_.choice(std::move(alternatives));
  }

  Json merged(const Json& parent, const Json& branch, const char* key, const std::string& path) const {
    try {
      return merge_siblings(parent, branch, key);
    } catch (const ApiError&) {
      throw;
    } catch (const Error& e) {
      refuse(path, e.what());
    }
  }

  // A branch of anyOf/oneOf/allOf with its parent's other keywords (e.g. a shared "type").
  static Json merge_siblings(const Json& parent, const Json& branch, const char* key) {
    if (!branch.is_object()) return branch;
    Json merged = branch;
    for (const auto& [k, v] : parent.items()) {
      if (k == key || kAnnotations.count(k) || k == "$defs" || k == "definitions") continue;
      if (merged.contains(k) && merged[k] != v)
        throw Error(fmt::format("'{}' both next to '{}' and inside a branch of it is not supported", k, key));
      merged[k] = v;
    }
    return merged;
  }

  Sym typed(const Json& s, const std::string& type, const std::string& path) {
    if (type == "null") return b_.literal_sym("null");
    if (type == "boolean") return b_.choice({b_.literal("true"), b_.literal("false")});
    if (type == "string") return string(s, path);
    if (type == "integer") return integer(s, path);
    if (type == "number") return number(s, path);
    if (type == "array") return array(s, path);
    if (type == "object") return object(s, path);
    refuse(path, fmt::format("unknown type '{}'", type));
  }

  int64_t count(const Json& s, const char* key, int64_t fallback, const std::string& path) {
    if (!s.contains(key)) return fallback;
    if (!s[key].is_number_unsigned() && !(s[key].is_number_integer() && s[key].get<int64_t>() >= 0))
      refuse(path, fmt::format("'{}' must be a non-negative integer", key));
    const int64_t v = s[key].get<int64_t>();
    if (v > 100000) refuse(path, fmt::format("'{}' above 100000 is not supported", key));
    return v;
  }

  Sym string_char() {
    if (string_char_) return *string_char_;
    const Sym plain = b_.codepoints(ranges_subtract({{0, 0x10FFFF}}, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
    ByteSet simple{};
    for (char c : std::string("\"\\/bfnrt")) byteset_add(simple, uint8_t(c));
    const Sym hex = b_.codepoints({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
    // \uXXXX without surrogates (a lone one is not a character).
    const Sym u = b_.choice({{b_.codepoints({{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}), hex, hex, hex},
                             {b_.codepoints({{'d', 'd'}, {'D', 'D'}}), b_.codepoints({{'0', '7'}}), hex, hex}});
    const Sym escape = b_.choice({{b_.set(simple)}, {b_.byte('u'), u}});
    return *(string_char_ = b_.choice({{plain}, {b_.byte('\\'), escape}}));
  }

  Sym string(const Json& s, const std::string& path) {
    const Sym quote = b_.byte('"');
    if (s.contains("pattern") || (s.contains("format") && kFormats.count(s.value("format", "")))) {
      if (s.contains("minLength") || s.contains("maxLength"))
        refuse(path, "'pattern' or 'format' together with minLength/maxLength is not supported");
      if (s.contains("pattern") && s.contains("format") && kFormats.count(s.value("format", "")))
        refuse(path, "'pattern' together with a 'format' is not supported");
      const std::string pattern = s.contains("pattern") ? (s["pattern"].is_string() ? s["pattern"].get<std::string>() : "")
                                                        : kFormats.at(s["format"].get<std::string>());
      try {
        return b_.choice({{quote, regex_rule(b_, pattern, true), quote}});
      } catch (const ApiError&) {
        throw;
      } catch (const Error& e) {
        refuse(path, fmt::format("pattern '{}': {}", pattern, e.what()));
      }
    }
    const int64_t min = count(s, "minLength", 0, path), max = count(s, "maxLength", -1, path);
    if (max >= 0 && max < min) refuse(path, "maxLength < minLength");
    return b_.choice({{quote, b_.repeat(string_char(), min, max), quote}});
  }

  // Digits for a non-negative integer in [lo, hi] (hi < 0: unbounded, up to kMaxDigits digits).
  Sym digits_in(int64_t lo, int64_t hi) {
    std::vector<Seq> alternatives;
    const auto add_same_length = [&](const std::string& a, const std::string& z) {
      alternatives.push_back({same_length(a, z)});
    };
    std::string lo_s = std::to_string(lo);
    const int top = hi < 0 ? kMaxDigits : int(std::to_string(hi).size());
    for (int n = int(lo_s.size()); n <= top; ++n) {
      const std::string a = n == int(lo_s.size()) ? lo_s : "1" + std::string(size_t(n - 1), '0');
      const std::string z = hi >= 0 && n == top ? std::to_string(hi) : pow10_minus_1(n);
      add_same_length(a, z);
    }
    return b_.choice(std::move(alternatives));
  }

  // Numbers from a to z, both of the same length (leading digits may be zero inside).
  Sym same_length(const std::string& a, const std::string& z) {
    const auto key = a + "-" + z;
    if (const auto it = ranges_.find(key); it != ranges_.end()) return it->second;
    return ranges_[key] = same_length_rule(a, z);
  }
  Sym same_length_rule(const std::string& a, const std::string& z) {
    if (a.size() == 1) return b_.byte_range(uint8_t(a[0]), uint8_t(z[0]));
    if (a == std::string(a.size(), '0') && z == pow10_minus_1(int(z.size())))
      return b_.repeat(b_.byte_range('0', '9'), int64_t(a.size()), int64_t(a.size()));
    if (a[0] == z[0]) return b_.choice({{b_.byte(uint8_t(a[0])), same_length(a.substr(1), z.substr(1))}});
    std::vector<Seq> alternatives;
    const size_t rest = a.size() - 1;
    alternatives.push_back({b_.byte(uint8_t(a[0])), same_length(a.substr(1), pow10_minus_1(int(rest)))});
    if (a[0] + 1 <= z[0] - 1) {
      Seq mid{b_.byte_range(uint8_t(a[0] + 1), uint8_t(z[0] - 1))};
      for (size_t i = 0; i < rest; ++i) mid.push_back(b_.byte_range('0', '9'));
      alternatives.push_back(std::move(mid));
    }
    alternatives.push_back({b_.byte(uint8_t(z[0])), same_length(std::string(rest, '0'), z.substr(1))});
    return b_.choice(std::move(alternatives));
  }

  std::optional<int64_t> bound(const Json& s, const char* inclusive, const char* exclusive, bool upper,
                               const std::string& path) {
    std::optional<int64_t> v;
    for (const char* key : {inclusive, exclusive}) {
      if (!s.contains(key)) continue;
      if (!s[key].is_number()) refuse(path, fmt::format("'{}' must be a number", key));
      const double x = s[key].get<double>();
      if (std::fabs(x) > 1e15) refuse(path, fmt::format("'{}' beyond 1e15 is not supported", key));
      const bool excl = key == exclusive;
      int64_t b = upper ? int64_t(std::floor(x)) : int64_t(std::ceil(x));
      if (excl && double(b) == x) b += upper ? -1 : 1;
      v = v ? (upper ? std::min(*v, b) : std::max(*v, b)) : b;
    }
    return v;
  }

  Sym integer(const Json& s, const std::string& path) {
    const auto lo = bound(s, "minimum", "exclusiveMinimum", false, path);
    const auto hi = bound(s, "maximum", "exclusiveMaximum", true, path);
    if (lo && hi && *lo > *hi) refuse(path, "no integer lies within minimum and maximum");
    return integer_in(lo, hi);
  }

  Sym integer_in(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    std::vector<Seq> alternatives;
    // Non-negative part [max(lo, 0), hi].
    if (!hi || *hi >= 0) alternatives.push_back({digits_in(lo ? std::max<int64_t>(*lo, 0) : 0, hi ? *hi : -1)});
    // Negative part: "-" and x in [max(1, -hi), -lo].
    if (!lo || *lo < 0) {
      const int64_t a = hi && *hi < 0 ? -*hi : 1;
      alternatives.push_back({b_.byte('-'), digits_in(a, lo ? -*lo : -1)});
    }
    return b_.choice(std::move(alternatives));
  }

  Sym number(const Json& s, const std::string& path) {
    const Sym digit = b_.byte_range('0', '9');
    const Sym fraction = b_.choice({{b_.byte('.'), b_.repeat(digit, 1, kMaxDigits)}});
    if (s.contains("exclusiveMinimum") || s.contains("minimum") || s.contains("maximum") ||
        s.contains("exclusiveMaximum")) {
      const bool ok_lo = s.contains("minimum") && s["minimum"].is_number() && s["minimum"].get<double>() >= 0 &&
                         std::floor(s["minimum"].get<double>()) == s["minimum"].get<double>() &&
                         !s.contains("exclusiveMinimum");
      const auto hi = bound(s, "maximum", "exclusiveMaximum", true, path);
      const bool hi_integral = !s.contains("maximum") || std::floor(s["maximum"].get<double>()) == s["maximum"].get<double>();
      if (!ok_lo || !hi_integral || s.contains("exclusiveMaximum"))
        refuse(path, "number bounds other than an integer minimum >= 0 with an optional integer maximum are not "
                     "supported (use type integer, or drop the bounds)");
      const int64_t lo = s["minimum"].get<int64_t>();
      if (hi && *hi < lo) refuse(path, "maximum < minimum");
      if (!hi) return b_.choice({{digits_in(lo, -1), b_.optional(fraction)}});
      // [lo, hi): any fraction; hi itself only with zeros after the point.
      std::vector<Seq> alternatives;
      if (*hi > lo) alternatives.push_back({digits_in(lo, *hi - 1), b_.optional(fraction)});
      const Sym zeros = b_.choice({{b_.byte('.'), b_.repeat(b_.byte('0'), 1, kMaxDigits)}});
      alternatives.push_back({b_.literal_sym(std::to_string(*hi)), b_.optional(zeros)});
      return b_.choice(std::move(alternatives));
    }
    const Sym exponent = b_.choice({{b_.codepoints({{'e', 'e'}, {'E', 'E'}}), b_.optional(b_.codepoints({{'+', '+'}, {'-', '-'}})),
                                     b_.repeat(digit, 1, 2)}});  // |exponent| < 100: every value fits a double
    return b_.choice({{integer_in(std::nullopt, std::nullopt), b_.optional(fraction), b_.optional(exponent)}});
  }

  // "[" ws (item ws ("," ws item ws)*)? "]" with the counts and the prefix items.
  Sym array(const Json& s, const std::string& path) {
    if (s.contains("uniqueItems") && s["uniqueItems"] == true) refuse(path, "'uniqueItems' is not supported");
    const int64_t min = count(s, "minItems", 0, path), max = count(s, "maxItems", -1, path);
    if (max >= 0 && max < min) refuse(path, "maxItems < minItems");
    std::vector<Sym> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) refuse(path, "'prefixItems' must be an array");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i)
        prefix.push_back(compile(s["prefixItems"][i], fmt::format("{}/prefixItems/{}", path, i)));
    }
    const bool items_false = s.contains("items") && s["items"] == false;
    if (max >= 0 && int64_t(prefix.size()) > max) refuse(path, "more prefixItems than maxItems");
    if (items_false && int64_t(prefix.size()) < min) refuse(path, "minItems exceeds the prefixItems with items: false");
    const Sym w = ws(), comma = b_.byte(',');
    Seq seq{b_.byte('['), w};
    if (prefix.empty()) {
      if (items_false) {
        seq.push_back(b_.byte(']'));
        return b_.choice({seq});
      }
      const Sym item = s.contains("items") ? compile(s["items"], path + "/items") : any_value();
      const Sym more = b_.choice({{comma, w, item, w}});
      const Sym list = b_.choice({{item, w, b_.repeat(more, std::max<int64_t>(0, min - 1), max < 0 ? -1 : max - 1)}});
      seq.push_back(min == 0 ? b_.optional(list) : list);
    } else {
      // Every prefix item, then the rest (items) within the counts.
      for (size_t i = 0; i < prefix.size(); ++i) {
        if (i > 0) seq.insert(seq.end(), {comma, w});
        seq.insert(seq.end(), {prefix[i], w});
      }
      if (!items_false) {
        const Sym item = s.contains("items") ? compile(s["items"], path + "/items") : any_value();
        const int64_t k = int64_t(prefix.size());
        seq.push_back(b_.repeat(b_.choice({{comma, w, item, w}}), std::max<int64_t>(0, min - k), max < 0 ? -1 : max - k));
      }
    }
    seq.push_back(b_.byte(']'));
    return b_.choice({seq});
  }

  Sym object(const Json& s, const std::string& path) {
    const Sym w = ws(), comma = b_.byte(',');
    std::vector<std::pair<Sym, bool>> members;  // key-value rule, required
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) refuse(path, "'required' must be an array of strings");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) refuse(path, "'required' must be an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    const Json additional = s.value("additionalProperties", Json(true));
    std::set<std::string> listed;
    const auto member = [&](const std::string& name, Sym value) {
      return b_.choice({{b_.literal_sym(Json(name).dump()), w, b_.byte(':'), w, value, w}});
    };
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) refuse(path, "'properties' must be an object");
      for (const auto& [name, sub] : s["properties"].items()) {
        listed.insert(name);
        members.emplace_back(member(name, compile(sub, path + "/properties/" + name)), required.count(name) > 0);
      }
    }
    for (const std::string& name : required) {
      if (listed.count(name)) continue;
      if (additional == false) refuse(path, fmt::format("'{}' is required but additionalProperties is false", name));
      members.emplace_back(member(name, additional.is_object() ? compile(additional, path + "/additionalProperties")
                                                               : any_value()),
                           true);
    }
    if (members.empty() && additional != false) {  // a map: any keys
      const Sym value = additional.is_object() ? compile(additional, path + "/additionalProperties") : any_value();
      return generic_object(value);
    }
    // S_i: members i.. with none emitted yet; R_i: with one emitted (so a comma comes first).
    const size_t n = members.size();
    std::vector<Sym> S(n + 1), R(n + 1);
    S[n] = R[n] = b_.choice({{}});
    for (size_t i = n; i-- > 0;) {
      const auto [kv, req] = members[i];
      R[i] = req ? b_.choice({{comma, w, kv, R[i + 1]}}) : b_.choice({{comma, w, kv, R[i + 1]}, {R[i + 1]}});
      S[i] = req ? b_.choice({{kv, R[i + 1]}}) : b_.choice({{kv, R[i + 1]}, {S[i + 1]}});
    }
    return b_.choice({{b_.byte('{'), w, S[0], b_.byte('}')}});
  }

  Sym generic_object(Sym value) {
    const Sym w = ws();
    const Sym kv = b_.choice({{plain_string(), w, b_.byte(':'), w, value, w}});
    const Sym more = b_.star(b_.choice({{b_.byte(','), w, kv}}));
    return b_.choice({{b_.byte('{'), w, b_.optional(b_.choice({{kv, more}})), b_.byte('}')}});
  }

  Sym plain_string() {
    if (!plain_string_) plain_string_ = b_.choice({{b_.byte('"'), b_.star(string_char()), b_.byte('"')}});
    return *plain_string_;
  }

  // Any JSON value (recursive).
  Sym any_value() {
    if (any_) return b_.ref(*any_);
    any_ = b_.new_rule();
    const Sym value = b_.ref(*any_);
    const Sym w = ws();
    const Sym array = b_.choice({{b_.byte('['), w, b_.optional(b_.choice({{value, w, b_.star(b_.choice({{b_.byte(','), w, value, w}}))}})),
                                  b_.byte(']')}});
    for (const Sym alt : {generic_object(value), array, plain_string(), number(Json::object(), ""),
                          b_.literal_sym("true"), b_.literal_sym("false"), b_.literal_sym("null")})
      b_.add(*any_, {alt});
    return value;
  }

  GrammarBuilder& b_;
  const Json& root_;
  std::string param_;
  std::map<std::string, uint32_t> refs_;
  std::map<std::string, Sym> ranges_;
  std::optional<Sym> ws_, string_char_, plain_string_;
  std::optional<uint32_t> any_;
};

}  // namespace

GrammarBuilder::Sym json_schema_rule(GrammarBuilder& b, const Json& schema, const std::string& param) {
  SchemaCompiler compiler(b, schema, param);
  return compiler.compile(schema, "");
}

GrammarBuilder::Sym json_whitespace(GrammarBuilder& b) {
  // Nothing, one space, or a newline and an indentation: compact and pretty-printed JSON both
  // fit, and a model cannot wander off into whitespace.
  Seq indented{b.byte('\n'), b.repeat(b.byte(' '), 0, kMaxIndent)};
  return b.choice({{}, {b.byte(' ')}, std::move(indented)});
}

}  // namespace moet::server
