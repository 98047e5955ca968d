// JSON schema -> grammar: the rule of the JSON texts that validate against a schema, for
// structured output. Supported (draft 2020-12 names, with draft-7 "definitions"):
//   type (one or a list), enum, const, anyOf, oneOf (generated as anyOf), allOf of one schema,
//   $ref to the root or a JSON pointer into it (recursion allowed), nullable (OpenAPI);
//   objects: properties (in the schema's order), required, additionalProperties (false, true or
//   a schema; with properties given, only they are generated);
//   arrays: items, prefixItems, minItems, maxItems;
//   strings: minLength, maxLength (characters), pattern (full match, see regex_grammar.h),
//   format date, time, date-time, uuid, email, ipv4 (others are annotations and ignored);
//   integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum;
//   numbers: minimum 0 (or an integer >= 0) with an optional integer maximum, or no bounds.
// Annotations (title, description, default, examples, $schema, $id, $comment, ...) are ignored.
// Anything else that constrains values (not, if/then/else, uniqueItems, multipleOf,
// patternProperties, minProperties, ...) is refused: a 400 naming the request field and the
// keyword, so an accepted schema is always enforced. Whitespace between tokens is nothing, one
// space, or a newline and up to 16 spaces; unbounded integers have at most 16 digits, fractions
// 16 and exponents 2 (every number fits a double), so a model cannot stretch a value forever.
#pragma once

#include "server/grammar.h"
#include "server/json_fields.h"

#include <string>

namespace moet::server {

// The rule of JSON texts valid under `schema`; `param` names the request field for errors.
GrammarBuilder::Sym json_schema_rule(GrammarBuilder& b, const Json& schema, const std::string& param);
// Optional whitespace as json_schema_rule allows it between tokens.
GrammarBuilder::Sym json_whitespace(GrammarBuilder& b);

}  // namespace moet::server
