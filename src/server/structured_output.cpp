// Structured output (see structured_output.h): reading the request fields, assembling the
// grammar, and the cache of compiled grammars.
#include "server/structured_output.h"

#include "server/api_error.h"
#include "server/json_schema_grammar.h"
#include "server/regex_grammar.h"
#include "server/server_context.h"

namespace moet::server {
namespace {

using Sym = GrammarBuilder::Sym;
using Seq = GrammarBuilder::Seq;

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";

enum class Kind { schema, regex, choice, tools };

struct Source {
  Kind kind;
  const char* param;  // the request field it came from
  Json value;         // schema / pattern / choices / {tools, name}
};

// What the request asks for, or nothing; one source at most.
std::optional<Source> read_source(const Json& body, const ChatPrompt* chat) {
  std::vector<Source> found;
  if (json_has(body, "response_format")) {
    const Json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      bad_request("response_format", "response_format must be an object with a string 'type'");
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      found.push_back({Kind::schema, "response_format", Json{{"type", "object"}}});
    } else if (type == "json_schema") {
      const Json* spec = rf.contains("json_schema") && rf["json_schema"].is_object() ? &rf["json_schema"] : nullptr;
      if (!spec || !spec->contains("schema") || !((*spec)["schema"].is_object() || (*spec)["schema"].is_boolean()))
        bad_request("response_format",
                    "response_format of type json_schema needs 'json_schema': {{\"name\": ..., \"schema\": {{...}}}}");
      found.push_back({Kind::schema, "response_format", (*spec)["schema"]});
    } else if (type != "text") {
      bad_request("response_format", "response_format.type must be text, json_object or json_schema (got '{}')", type);
    }
  }
  if (json_has(body, "guided_json")) {
    Json schema = body["guided_json"];
    if (schema.is_string()) {
      schema = Json::parse(schema.get<std::string>(), nullptr, false);
      if (schema.is_discarded()) bad_request("guided_json", "guided_json is a string that is not JSON");
    }
    if (!schema.is_object() && !schema.is_boolean()) bad_request("guided_json", "guided_json must be a JSON schema");
    found.push_back({Kind::schema, "guided_json", schema});
  }
  if (json_has(body, "guided_regex")) {
    if (!body["guided_regex"].is_string()) bad_request("guided_regex", "guided_regex must be a string");
    found.push_back({Kind::regex, "guided_regex", body["guided_regex"]});
  }
  if (json_has(body, "guided_choice")) {
    const Json& c = body["guided_choice"];
    if (!c.is_array() || c.empty() || !std::all_of(c.begin(), c.end(), [](const Json& x) { return x.is_string(); }))
      bad_request("guided_choice", "guided_choice must be a non-empty array of strings");
    found.push_back({Kind::choice, "guided_choice", c});
  }
  if (chat && (chat->tool_choice == ToolChoice::required || chat->tool_choice == ToolChoice::named)) {
    found.push_back({Kind::tools, "tool_choice", Json{{"tools", chat->tools}, {"name", chat->tool_name}}});
  }
  if (found.empty()) return std::nullopt;
  if (found.size() > 1)
    bad_request(found[1].param, "{} cannot be combined with {} (one output constraint per request)", found[1].param,
                found[0].param);
  return found[0];
}

// tool_choice: section_begin call (separator call)* section_end, a call being one of the tools
// (or the named one) with arguments valid under its parameters.
Sym tool_calls_rule(GrammarBuilder& b, const Json& spec, const ToolCallFormat& f) {
  const std::string name = spec["name"].get<std::string>();
  std::vector<Seq> calls;
  for (const Json& tool : spec["tools"]) {
    const Json& fn = tool["function"];
    const std::string tool_name = fn["name"].get<std::string>();
    if (!name.empty() && tool_name != name) continue;
    const Json params = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"]
                                                                                 : Json{{"type", "object"}};
    Seq call = b.literal(f.call_begin);
    for (Sym s : b.literal(f.name_json ? Json(tool_name).dump() : tool_name)) call.push_back(s);
    for (Sym s : b.literal(f.call_middle)) call.push_back(s);
    call.push_back(json_schema_rule(b, params, "tools"));
    for (Sym s : b.literal(f.call_end)) call.push_back(s);
    calls.push_back(std::move(call));
  }
  const Sym call = b.choice(std::move(calls));
  Seq seq = b.literal(f.section_begin);
  seq.push_back(call);
  if (name.empty()) seq.push_back(b.star(b.choice({[&] {
                      Seq more = b.literal(f.separator);
                      more.push_back(call);
                      return more;
                    }()})));
  for (Sym s : b.literal(f.section_end)) seq.push_back(s);
  return b.choice({std::move(seq)});
}

Grammar assemble(const Source& src, int reasoning_mode, const ToolParser* tools) {
  GrammarBuilder b;
  Seq root;
  if (reasoning_mode == 2) {  // the prompt opened the block: free text up to its end
    root = {b.text_until(kThinkClose)};
  } else if (reasoning_mode == 1) {  // a block may come first
    Seq block = b.literal(kThinkOpen);
    block.push_back(b.text_until(kThinkClose));
    root = {b.optional(b.choice({block}))};
  }
  try {
    switch (src.kind) {
      case Kind::schema:
        root.push_back(json_whitespace(b));
        root.push_back(json_schema_rule(b, src.value, src.param));
        break;
      case Kind::regex: root.push_back(regex_rule(b, src.value.get<std::string>(), false)); break;
      case Kind::choice: {
        std::vector<Seq> alternatives;
        for (const Json& c : src.value) alternatives.push_back(b.literal(c.get<std::string>()));
        root.push_back(b.choice(std::move(alternatives)));
        break;
      }
      case Kind::tools:
        if (!tools->format().json_arguments)
          throw ApiError(400, "tool_choice: \"required\" and named functions are not supported yet with this model's "
                              "tool-call format (its arguments are not a JSON object); use \"auto\"", src.param);
        if (reasoning_mode == 0 || reasoning_mode == 1) root.push_back(json_whitespace(b));
        root.push_back(tool_calls_rule(b, src.value, tools->format()));
        break;
    }
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("{}: {}", src.param, e.what()), src.param);
  }
  return b.build(b.choice({std::move(root)}));
}

}  // namespace

std::shared_ptr<const TokenConstraint> structured_output(const Json& body, const ChatPrompt* chat, bool reasoning,
                                                         bool reasoning_open, const ServerContext& ctx) {
  const std::optional<Source> src = read_source(body, chat);
  if (!src) return nullptr;
  if (ctx.eos_ids.empty())
    bad_request(src->param, "{} needs an end-of-sequence token, and this model's tokenizer names none", src->param);
  if (src->kind == Kind::tools && !ctx.tool_parser)
    bad_request("tool_choice", "tool_choice \"required\" or a named function needs a tool-call format; this model's "
                               "chat template shows none (set --tool-call-parser)");
  const int mode = !chat || !reasoning ? 0 : reasoning_open ? 2 : 1;
  const std::string key = fmt::format("{}|{}|{}|{}", int(src->kind), mode, src->value.dump(),
                                      src->kind == Kind::tools ? std::string(ctx.tool_parser->start()) : "");
  return ctx.grammars.get(key, [&] { return assemble(*src, mode, ctx.tool_parser.get()); }, ctx.tokenizer,
                          ctx.eos_ids);
}

}  // namespace moet::server
