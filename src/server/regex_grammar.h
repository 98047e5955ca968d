// Regular expressions (the ECMAScript subset JSON schema "pattern" and vLLM's guided_regex use)
// compiled into grammar rules that match exactly the strings the expression matches in full:
// literals and escapes (\d \w \s \D \W \S \n \t \xHH \uHHHH \u{...}), '.', classes with ranges
// and negation, groups ((...), (?:...), (?<name>...)), alternation, and the quantifiers * + ?
// {n} {n,} {n,m} (lazy forms match the same strings). '^' at the start and '$' at the end are
// accepted and change nothing; anchors elsewhere, word boundaries, backreferences and lookaround
// are errors. With json_string, characters are spelled as inside a JSON string literal: '"' and
// '\' escaped, control characters as \n \t \r \b \f or \u00XX.
#pragma once

#include "server/grammar.h"

#include <string_view>

namespace moet::server {

// Throws moet::Error describing what is wrong or unsupported in `pattern`.
GrammarBuilder::Sym regex_rule(GrammarBuilder& b, std::string_view pattern, bool json_string);

}  // namespace moet::server
