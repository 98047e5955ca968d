// Tree-walking Jinja interpreter. Scoping follows jinja2: the root frame holds the globals, the
// render variables and top-level {% set %}s; a for-loop body gets a fresh frame per iteration;
// a macro call runs in [root, its own frame]; namespace objects are shared by reference.
// Every error (including raise_exception) surfaces as moet::Error "line L, column C: message".
#pragma once

#include "tokenizer/jinja_ast.h"

#include <string>

namespace moet::jinja {

std::string render_template(const Template& tmpl, Dict variables);

}  // namespace moet::jinja
