// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it: separators ", "
// and ": ", key order kept, non-ASCII raw, control characters escaped (\n, \t, \u001b, ...),
// floats as Python repr (1.0, 100000.0, 1e-05, 1e+16), integers verbatim. The chat format embeds
// tool schemas and arguments this way, so prompts must match it byte for byte.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace dsv41::text {

std::string python_json_dumps(const nlohmann::ordered_json& value);
// Python repr() of a float (shortest round-trip digits).
std::string python_float_repr(double v);
// str(value) as Python prints a JSON-loaded value inside an f-string (None, True, 1.5, text).
std::string python_str(const nlohmann::ordered_json& value);

}  // namespace dsv41::text
